"""One description of a run: the nouns checked once when made, their flat field names, the run
file's round trip, and estimate's short form as a builder of the same run."""
from __future__ import annotations

import pytest

import zerolib as zl
from zerolib.core.run import FIELDS, Batch, Cluster, Parallelism, Run, Trainer
from zerolib.core.run_file import MAX_RUN_FILE_BYTES, read_run, run_from_toml


def test_a_run_is_the_nouns_an_engineer_uses():
    run = Run.of("llama-2-7b", 64, device="h100-80gb", tensor_parallel=2, sequence_parallel=True,
                 recompute="full", micro_batch=2, link="dgx-h100")
    assert run.model.name == "llama-2-7b" and run.cluster.gpus == 64
    assert (run.parallel.tensor, run.parallel.sequence) == (2, True)
    assert run.trainer.recompute == "full" and run.batch.micro_batch == 2
    # the sequence: the model's context length, at most 4,096 (llama-2-7b's is 4,096; gpt2's 1,024)
    assert run.seq_len == 4096 and Run.of("gpt2", 8).seq_len == 1024
    # ZeRO's group is what the model-parallel degrees leave: 64 / (2 x 1)
    assert run.data_parallel == 32


@pytest.mark.parametrize("make, message", [
    (lambda: Cluster(gpus=0), r"^cluster\.gpus must be a whole number from 1"),
    (lambda: Cluster(device="h100"), r"^cluster\.device must be one of v100-32gb"),
    (lambda: Parallelism(sequence=True), r"^parallel\.sequence needs parallel\.tensor of 2"),
    (lambda: Parallelism(pipeline=4, chunks=2), r"^parallel\.schedule and parallel\.chunks"),
    (lambda: Trainer(recompute="some"), r"^trainer\.recompute must be one of none, selective, full"),
    (lambda: Trainer(partition_activations=True), r"^trainer\.partition_activations .* needs "
                                                  r"trainer\.recompute 'full'"),
    (lambda: Trainer(mfu=0), r"^trainer\.mfu must be a number above 0 and at most 1"),
    (lambda: Trainer(mfu=0.0001), r"^trainer\.mfu must be at least 0\.001 \(0\.1%\)"),
    (lambda: Trainer(stages=(4,)), r"^trainer\.stages must be ZeRO stages from 0 to 3"),
    (lambda: Batch(micro_batch=-1), r"^batch\.micro_batch must be a whole number from 1"),
    (lambda: Run(0), r"^model must be a whole parameter count"),
])
def test_a_bad_field_is_one_error_naming_it(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_types_are_refused_by_name():
    with pytest.raises(TypeError, match=r"^batch\.seq_len must be a whole number"):
        Batch(seq_len="4096")
    with pytest.raises(TypeError, match=r"^parallel\.hpz must be true or false"):
        Parallelism(hpz=1)
    with pytest.raises(TypeError, match="a run has no field 'micro_bach': did you mean 'micro_batch'"):
        Run.of("llama-2-7b", 8, micro_bach=2)


def test_every_field_has_one_flat_name():
    # the flat names are unique and each lands on one field of one noun
    paths = list(FIELDS.values())
    assert len(paths) == len(set(paths))
    run = Run("llama-2-7b")
    for name, path in FIELDS.items():
        value = getattr(run, path[0])
        for part in path[1:]:
            value = getattr(value, part)   # every path exists
        assert run.replace(**{name: value}) == run, name   # and takes its own value back


def test_replace_moves_one_field_and_checks_it():
    run = Run.of("llama-2-7b", 8, micro_batch=2)
    moved = run.replace(micro_batch=4)
    assert (moved.batch.micro_batch, run.batch.micro_batch) == (4, 2)
    assert moved.replace(overlap_comm=True).trainer.buckets.overlap_comm is True
    with pytest.raises(ValueError, match=r"^batch\.micro_batch"):
        run.replace(micro_batch=0)


def test_the_short_form_builds_the_run():
    # estimate(model, gpus, **fields) is estimate(Run.of(model, gpus, **fields))
    run = Run.of("llama-2-7b", 8, device="a100-80gb", recompute="selective", stages=(3,))
    assert zl.estimate(run).as_dict() == zl.estimate("llama-2-7b", 8, device="a100-80gb",
                                                     recompute="selective", stages=(3,)).as_dict()
    # The seed's worksheet: 1B parameters on 4 workers, 16.0 / 7.0 / 5.5 / 4.0 GB
    totals = [row["total"] for row in zl.estimate(1_000_000_000, 4).stages]
    assert totals == [16_000_000_000, 7_000_000_000, 5_500_000_000, 4_000_000_000]
    with pytest.raises(TypeError, match="give a Run, or a model"):
        zl.estimate(run, 8)


def test_the_run_file_round_trips():
    run = Run.of("llama-2-70b", 64, device="h100-80gb", gpus_per_node=8, link="dgx-h100",
                 tensor_parallel=8, sequence_parallel=True, pipeline_parallel=2, recompute="full",
                 micro_batch=1, micro_batches=16, layout=[2, 4, 12], reduce_bucket_size=200_000_000,
                 mfu=0.45, engine="megatron", stages=(1,))
    text = run.to_toml()
    assert "[trainer.buckets]\nreduce_bucket_size = 200000000" in text
    assert run_from_toml(text) == run
    # a model of one's own travels whole: the file answers alike without the config.json
    own = zl.model_from_config({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
                                "num_attention_heads": 8, "num_key_value_heads": 8,
                                "intermediate_size": 1376, "vocab_size": 32000,
                                "max_position_embeddings": 2048}, name="tiny")
    mine = Run.of(own, 4, micro_batch=3)
    assert run_from_toml(mine.to_toml()) == mine
    assert run_from_toml(Run.of(7_000_000_000, 64).to_toml()).model == 7_000_000_000


@pytest.mark.parametrize("text, message", [
    ("[model]\npreset = 'llama-2-7b'\n[batch]\nmicro_bacth = 2\n", r"batch has no field 'micro_bacth'"),
    ("[model]\npreset = 'llama-2-7b'\n[trainer]\nrecompute = 'most'\n",
     r"trainer\.recompute must be one of none"),
    ("[cluster]\ngpus = 8\n", r"\[model\] is missing"),
    ("[model]\npreset = 'llama-2-7b'\nparams = 7\n", r"model gives preset and params: give one"),
    ("[model]\npreset = 'llama-2-7b'\n[optimizer]\nlr = 1\n", r"no table 'optimizer'"),
    ("[model\n", r"is not TOML"),
    ("[model]\npreset = 'llama-2-7b'\n[batch]\nseq_len = " + "[" * 5000 + "]" * 5000 + "\n",
     r"(nests deeper than a run file can|batch\.seq_len)"),
])
def test_a_bad_run_file_is_one_line_naming_the_field(text, message):
    with pytest.raises(ValueError, match=message) as caught:
        run_from_toml(text, where="run file x.toml")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("run file x.toml")


def test_a_run_file_is_bounded(tmp_path):
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_RUN_FILE_BYTES + 1))
    with pytest.raises(ValueError, match=r"larger than 1,000,000 bytes"):
        read_run(big)
    with pytest.raises(ValueError, match=r"is not a file"):
        read_run(tmp_path)


def test_the_run_file_page_documents_every_field():
    from dataclasses import fields
    from pathlib import Path

    from zerolib.core.run import Buckets
    text = (Path(__file__).resolve().parents[2] / "docs" / "run-file.md").read_text()
    for noun in (Cluster, Parallelism, Trainer, Batch):
        for f in fields(noun):
            if f.name != "buckets":
                assert f"| `{f.name}`" in text or f"| `{f.name}`," in text, (noun.__name__, f.name)
    for f in fields(Buckets):
        assert f"| `buckets.{f.name}`" in text, f.name


def test_the_light_defaults_are_the_engines_own():
    # the run's door checks engine names without importing the step: the names are the step's
    from zerolib.core.defaults import ENGINE_NAMES
    from zerolib.core.step.engines import ENGINES
    assert tuple(ENGINES) == ENGINE_NAMES


def test_a_plan_of_a_run_takes_the_nodes_own_gpus_and_the_models_sequence():
    # H100s come in DGX H100 nodes of 8 GPUs; llama-2-7b's context is 4,096 tokens
    result = zl.plan(Run.of("llama-2-7b", 16, device="h100-80gb", global_batch=64))
    assert (result.settings.gpus_per_node, result.settings.seq_len) == (8, 4096)
    with pytest.raises(ValueError, match="global_batch must be given to plan"):
        zl.plan(Run.of("llama-2-7b", 16, device="h100-80gb"))
