"""A whole Megatron-LM launch line read as a run: each flag carried to its field, refused with
Megatron-LM's own rule, or refused as not modelled yet, in one line naming the flag.

Expected values are worked out by hand from Megatron-LM's rules (d98e8a64): the micro-batches
of a step are B / (b x d), d = GPUs / (t x p x C); virtual stages are layers / p / (layers per
virtual stage); dropout defaults to 0.1."""
from __future__ import annotations

import pytest

from zerolib.core.catalogue.megatron_args import model_from_megatron_args
from zerolib.core.megatron_launch import LAUNCH, read_launch, run_from_megatron_args

MODEL = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --max-position-embeddings 4096 "
         "--vocab-size 32000 --swiglu --normalization RMSNorm --position-embedding-type rope "
         "--disable-bias-linear --untie-embeddings-and-output-weights")
LINE = (MODEL + " --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
        "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16 "
        "--use-distributed-optimizer --recompute-activations --lr 3e-4 --data-path /data/x "
        "--num-layers-per-virtual-pipeline-stage 4")


def test_a_whole_launch_line_is_a_run():
    run = run_from_megatron_args(LINE, gpus=32)
    assert run.model == model_from_megatron_args(MODEL + " --tensor-model-parallel-size 2")
    p, t, b = run.parallel, run.trainer, run.batch
    assert (run.cluster.gpus, p.tensor, p.pipeline, p.sequence, p.context) == (32, 2, 2, True, 1)
    # 32 layers / 2 stages / 4 layers per virtual stage: 4 model chunks per stage
    assert (p.schedule, p.chunks) == ("interleaved", 4)
    assert (t.engine, t.stages, t.recompute, t.element_bytes, t.dropout) == (
        "megatron", (1,), "selective", 2, True)
    # d = 32 / (2 x 2) = 8; 64 / (1 x 8) = 8 micro-batches per step
    assert (b.seq_len, b.micro_batch, b.global_batch, b.micro_batches) == (4096, 1, 64, 8)


def test_what_was_carried_is_said_flag_by_flag():
    launch = read_launch(LINE)
    carried = dict(launch.carried)
    assert carried["--recompute-activations"] == "recompute"
    assert carried["--use-distributed-optimizer"] == "stages"
    assert carried["--num-layers-per-virtual-pipeline-stage"] == "pipeline_chunks"
    assert launch.not_modelled == ()


def test_megatron_defaults_without_flags():
    run = run_from_megatron_args(MODEL)
    t = run.trainer
    # no --bf16/--fp16: fp32 training; no distributed optimizer: stage 0; dropout 0.1 each
    assert (t.element_bytes, t.layout, t.stages, t.dropout, t.recompute) == (4, "fp32-adam", (0,), True, "none")
    assert run.cluster.gpus == 1 and run.parallel.schedule == "1f1b"


def test_dropout_zero_in_both_places_is_no_dropout_and_in_one_is_not_modelled():
    assert run_from_megatron_args(MODEL + " --hidden-dropout 0 --attention-dropout 0.0").trainer.dropout is False
    with pytest.raises(ValueError, match=r"--hidden-dropout 0 with --attention-dropout 0.1: dropout in "
                                         r"one place and not the other is not modelled yet"):
        run_from_megatron_args(MODEL + " --hidden-dropout 0")
    with pytest.raises(ValueError, match=r"--hidden-dropout must be a probability from 0 to 1, got '1.5'"):
        run_from_megatron_args(MODEL + " --hidden-dropout 1.5")
    with pytest.raises(ValueError, match=r"--attention-dropout must be a probability"):
        run_from_megatron_args(MODEL + " --attention-dropout nan")


@pytest.mark.parametrize("recompute", ["--recompute-method uniform --recompute-num-layers 1",
                                       "--recompute-method block --recompute-num-layers 16"])
def test_full_recompute_of_every_layer_is_full(recompute):
    # 32 layers over 2 stages: block 16 recomputes every layer of a stage, uniform 1 each alone
    line = MODEL + " --pipeline-model-parallel-size 2 --recompute-granularity full " + recompute
    assert run_from_megatron_args(line).trainer.recompute == "full"


@pytest.mark.parametrize("method,layers", [("uniform", 2), ("uniform", 3), ("block", 4),
                                           ("block", 1), ("uniform", 40)])
def test_every_full_recompute_method_and_count_is_carried(method, layers):
    # Megatron-LM's checkpointed_forward (megatron/core/recompute.py) takes uniform chunks of
    # min(N, the stage's layers) and block's first N: any N of 1 or more runs, 40 over 16 too.
    line = (MODEL + " --pipeline-model-parallel-size 2 --recompute-granularity full "
            f"--recompute-method {method} --recompute-num-layers {layers}")
    launch = read_launch(line)
    assert launch.not_modelled == ()
    assert dict(launch.carried)["--recompute-num-layers"] == "recompute_layers"
    t = run_from_megatron_args(line).trainer
    assert (t.recompute, t.recompute_method, t.recompute_layers) == ("full", method, layers)


def test_block_recompute_keeps_what_megatron_keeps():
    """block 4 of 16 layers on a stage: per micro-batch in flight, 4 checkpointed inputs and 12
    layers kept whole; so the activations fall between every layer recomputed (uniform 1) and
    none, and block 16 equals uniform 1."""
    from zerolib.core.estimate import estimate
    line = MODEL + " --pipeline-model-parallel-size 2 --bf16 --recompute-granularity full "

    def acts(extra):
        row = estimate(run_from_megatron_args(line + extra)).stages[0]
        return row["working_set"]["activations"]

    every, block4, block16 = (acts(f"--recompute-method {m} --recompute-num-layers {n}")
                              for m, n in (("uniform", 1), ("block", 4), ("block", 16)))
    none = estimate(run_from_megatron_args(MODEL + " --pipeline-model-parallel-size 2 --bf16")
                    ).stages[0]["working_set"]["activations"]
    assert every < block4 < none and block16 == every


@pytest.mark.parametrize("extra,split", [
    # 32 layers over 4 stages: the middle two hold (32 - 7 - 9) / 2 = 8 each
    ("--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 9", (7, 9)),
    # only the first given: the other three stages are middle ones, (32 - 5) / 3 = 9
    ("--decoder-first-pipeline-num-layers 5", (5, 9)),
    ("--decoder-last-pipeline-num-layers 2", (10, 2)),
    # the embedding and the loss counted as layers: (32 + 2) / 2 = 17 a stage, one fewer on
    # the first and the last: 16 and 16
    ("--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
     "--pipeline-model-parallel-size 2", (16, 16)),
    # the embedding alone: (32 + 1) / 3 = 11, the first holds 10, the middle and last 11
    ("--account-for-embedding-in-pipeline-split --pipeline-model-parallel-size 3", (10, 11)),
])
def test_uneven_stages_are_carried(extra, split):
    line = MODEL + " " + extra if "-size " in extra else MODEL + " --pipeline-model-parallel-size 4 " + extra
    launch = read_launch(line)
    assert launch.not_modelled == () and launch.fields["pipeline_layers"] == split
    assert run_from_megatron_args(line).parallel.pipeline_layers == split


@pytest.mark.parametrize("extra,message", [
    ("--fp8-format hybrid --bf16", "--fp8-format hybrid: Float8 training .* is not modelled yet"),
    ("--account-for-embedding-in-pipeline-split --pipeline-model-parallel-size 2 "
     "--num-virtual-stages-per-pipeline-rank 2", "--account-for-embedding-in-pipeline-split: with "
     "virtual pipeline stages only the first .* not modelled yet"),
])
def test_what_zerolib_does_not_model_yet_is_one_line(extra, message):
    with pytest.raises(ValueError, match=f"^megatron-args: {message}"):
        run_from_megatron_args(MODEL + " " + extra)
    # the model alone is still read (zerolib models --megatron-args)
    assert read_launch(MODEL + " " + extra).model.layers == 32


@pytest.mark.parametrize("extra,message", [
    ("--recompute-granularity full", "--recompute-granularity full needs --recompute-method"),
    ("--recompute-granularity selective --recompute-method uniform",
     "recompute method is not yet supported for selective"),
    ("--recompute-granularity selective --recompute-num-layers 2", "recompute_num_layers must be None"),
    ("--recompute-method block", "--recompute-method without --recompute-granularity full"),
    ("--pipeline-model-parallel-size 3", "Number of layers should be divisible by the "
     "pipeline-model-parallel size \\(32 layers"),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 4",
     "the other 28 layers must split evenly over the other 3 pipeline stages"),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 7 "
     "--decoder-last-pipeline-num-layers 8", "parallel.pipeline_layers 7,8 does not split"),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 8 "
     "--decoder-last-pipeline-num-layers 8 --num-virtual-stages-per-pipeline-rank 3",
     "with 3 model chunks per stage each stage's layers must divide by 3"),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 8 "
     "--num-layers-per-virtual-pipeline-stage 2", "please use --num-virtual-stages-per-pipeline-rank"),
    ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 8 "
     "--account-for-loss-in-pipeline-split", "cannot be set with --account-for-embedding/loss"),
    ("--pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split",
     "number of layers should be divisible by the pipeline-model-parallel size \\(32 \\+ 1 over 4\\)"),
    ("--decoder-first-pipeline-num-layers 0", "must be a whole number from 1"),
    ("--recompute-granularity most", "--recompute-granularity must be one of full, selective, got 'most'"),
    ("--bf16 --fp16", "--bf16 and --fp16: give one"),
    ("--fp8-format e5m2", "--fp8-format must be one of e4m3, hybrid"),
    ("--virtual-pipeline-model-parallel-size 2", "not an argument of Megatron-LM at d98e8a64"),
    ("--num-layers-per-virtual-pipeline-stage 5 --pipeline-model-parallel-size 2",
     "the 32 layers over 2 pipeline stages must be whole chunks of it"),
    ("--num-virtual-stages-per-pipeline-rank 2", "virtual pipeline stages need --pipeline-model-parallel-size"),
    ("--tensor-model-parallel-size 0", "--tensor-model-parallel-size must be a whole number from 1"),
    ("--micro-batch-size ٣", "--micro-batch-size must be a whole number .*digits 0-9 only"),
    ("--micro-batch-size 1 --micro-batch-size 2", "--micro-batch-size is given twice"),
    ("--sequence-parallel=1", "--sequence-parallel is a switch and takes no value"),
    ("--global-batch-size", "--global-batch-size needs a value"),
])
def test_what_megatron_lm_refuses_is_refused_in_its_words(extra, message):
    with pytest.raises(ValueError, match=message):
        run_from_megatron_args(MODEL + " " + extra)


def test_the_gpus_and_the_global_batch_must_agree():
    with pytest.raises(ValueError, match=r"12 GPUs are not a multiple of tensor x pipeline x context parallel \(8\)"):
        run_from_megatron_args(MODEL + " --tensor-model-parallel-size 8", gpus=12)
    # d = 16 / 8 = 2, b = 3: 6 does not divide 64
    with pytest.raises(ValueError, match=r"--global-batch-size 64 is not a multiple of --micro-batch-size x "
                                         r"data parallel \(6\)"):
        run_from_megatron_args(MODEL + " --tensor-model-parallel-size 8 --micro-batch-size 3 "
                                       "--global-batch-size 64", gpus=16)
    with pytest.raises(ValueError, match="gpus must be a whole number"):
        run_from_megatron_args(MODEL, gpus=0)


def test_sequence_parallel_without_tensor_parallel_is_switched_off_as_megatron_does():
    assert run_from_megatron_args(MODEL + " --sequence-parallel").parallel.sequence is False


def test_one_virtual_stage_is_no_interleaving():
    run = run_from_megatron_args(MODEL + " --pipeline-model-parallel-size 2 "
                                         "--num-virtual-stages-per-pipeline-rank 1")
    assert (run.parallel.schedule, run.parallel.chunks) == ("1f1b", 1)


def test_every_row_names_a_run_field_or_what_is_not_modelled():
    from zerolib.core.run import FIELDS
    own = {"layers_per_chunk", "recompute_activations", "distributed_optimizer", "bf16", "fp16",
           "hidden_dropout", "attention_dropout"}   # turned into run fields by the reader
    for flag, row in LAUNCH.items():
        assert flag.startswith("--") and row.kind in ("whole", "switch", "choice", "fraction", "text")
        assert (row.field in FIELDS or row.field in own) if row.field else row.not_modelled, flag


def test_a_launch_script_file_is_read(tmp_path):
    script = tmp_path / "pretrain.sh"
    script.write_text("# the model\n" + MODEL.replace(" --swiglu", " \\\n  --swiglu")
                      + " \\\n  --micro-batch-size 2  # per GPU\n")
    run = run_from_megatron_args(script)
    assert run.batch.micro_batch == 2 and run.model.layers == 32
