"""The planner's default schedules: 1F1B and every number of model chunks v >= 2 that
Megatron-LM's interleaving accepts at each pipeline degree p (megatron/training/arguments.py: the
layers divide by p and the layers per stage by the layers per virtual stage, so p x v divides
the layers; the interleaved schedule needs p >= 2; schedules.py: the micro-batches per step a
multiple of p at the default microbatch_group_size_per_vp_stage = p)."""
import numpy as np
import pytest

import zerolib as zl
from zerolib.core.catalogue.devices import Device
from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.memory.model_parallel import ALL_CHUNKS, chunks_for
from zerolib.core.planner import plan, plan_settings

# Four layers of the tiny model of tests/core/test_planner.py (hidden 8, 2 heads, MLP 16).
TINY4 = TransformerConfig("tiny4", hidden=8, layers=4, heads=2, kv_heads=2, ffn_hidden=16,
                          vocab=10, max_positions=64, tied_embeddings=False, gated_mlp=False)
TINY_GPU = Device("tiny-gpu", "tiny GPU", 10**12, "a test device", peak_flops=10**12,
                  peak_dtype="bf16")
SMALL = dict(links="nvlink4,ib-ndr", max_micro_batch=2, recompute=("none",), stages=(0,),
             offload=("none",), sequence_parallel=(False,))


def test_the_default_chunks_are_every_divisor_of_the_layers_per_stage():
    llama = zl.get_model("llama-2-70b")
    assert llama.layers == 80
    # 80 / 4 = 20 layers per stage: v from the divisors of 20 (NeMo's virtual pipeline 20, one
    # layer per chunk, is the last); 80 / 2 = 40; 80 / 16 = 5.
    assert chunks_for(llama, 4, ALL_CHUNKS) == (1, 2, 4, 5, 10, 20)
    assert chunks_for(llama, 2, ALL_CHUNKS) == (1, 2, 4, 5, 8, 10, 20, 40)
    assert chunks_for(llama, 16, ALL_CHUNKS) == (1, 5)
    # No pipeline, a degree that does not divide 80, or one layer per stage: 1F1B only.
    assert chunks_for(llama, 1, ALL_CHUNKS) == chunks_for(llama, 3, ALL_CHUNKS) == (1,)
    assert chunks_for(llama, 80, ALL_CHUNKS) == (1,)
    # Named schedules are tried as named (the rules reject what cannot run).
    assert chunks_for(llama, 3, (1, 2)) == (1, 2)


def test_the_default_is_every_schedule():
    s = plan_settings("llama-2-70b", 64, 8, "h100-80gb", 4096, 128)
    assert s.chunks == ALL_CHUNKS and s.as_dict()["chunks"] == "all"
    assert plan_settings("llama-2-70b", 64, 8, "h100-80gb", 4096, 128,
                         chunks=[2, 1, 2]).chunks == (2, 1)


def test_the_tiny_space_by_hand():
    # 4 GPUs in nodes of 2, stage 0 only, micro-batch 1 or 2, global batch 4. (t, p, d) and
    # the schedules of 4 layers: p = 1 and p = 4 (one layer per stage) 1F1B only; p = 2 1F1B
    # and v = 2. Rows: (1,1,4) (1,2,2)x2 (1,4,1) (2,1,2) (2,2,1)x2 (4,1,1): 8, x 2 micro-batches
    # = 16. Rejected: (4,1,1) splits 2 heads 4 ways (2); (1,1,4) at b = 2 needs 8 | 4 (1);
    # (1,2,2) v = 2 at b = 2 runs m = 4 / (2 x 2) = 1 micro-batch, not a multiple of p = 2 (1).
    result = plan(TINY4, 4, 2, TINY_GPU, 8, 4, **SMALL)
    assert result.counts()["configurations"] == 16
    assert result.counts()["runnable"] == 12
    by_rule = dict(zip(result.rejected["rule"], result.rejected["configurations"]))
    assert by_rule == {"heads": 2, "global_batch": 1, "micro_batches": 1}
    # Named 1,2 as the old default did: 12 rows x 2 = 24, the 8 more all rejected: v = 2 at
    # p = 1 is 6 ((4,1,1)'s 2 break the heads rule first, (1,1,4)'s and (2,1,2)'s 4 the
    # schedule's p >= 2), v = 2 at p = 4 is 2 (4 x 2 does not divide 4 layers); the same 12 run.
    named = plan(TINY4, 4, 2, TINY_GPU, 8, 4, chunks=(1, 2), **SMALL)
    assert named.counts()["configurations"] == 24
    assert dict(zip(named.rejected["rule"], named.rejected["configurations"])) == {
        "heads": 4, "interleaved_layers": 2, "schedule": 4, "global_batch": 1, "micro_batches": 1}
    key = ["tensor_parallel", "pipeline_parallel", "data_parallel", "chunks", "micro_batch"]
    assert (result.valid[key].to_numpy() == named.valid[key].to_numpy()).all()
    assert np.array_equal(result.valid["peak_bytes"], named.valid["peak_bytes"])
    assert np.array_equal(result.valid["step_seconds"], named.valid["step_seconds"])


@pytest.fixture(scope="module")
def a100_plans():
    return (plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024),
            plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024, chunks=(1, 2)))


def test_the_wider_search_keeps_every_old_configuration(a100_plans):
    wide, old = a100_plans
    # Every configuration the --chunks 1,2 search found runnable is in the default search with
    # the same peak and step time; only configurations v = 2 could not run are gone (the old
    # search enumerated them to reject them), and what is new has v of 4 or more.
    columns = ["tensor_parallel", "pipeline_parallel", "data_parallel", "sequence_parallel",
               "chunks", "stage", "shard_group", "recompute", "micro_batch", "offload"]
    wide_valid = wide.valid.astype({"recompute": str, "offload": str})
    old_valid = old.valid.astype({"recompute": str, "offload": str})
    kept = wide_valid[wide_valid["chunks"] <= 2]
    assert kept[columns].to_numpy().tolist() == old_valid[columns].to_numpy().tolist()
    assert np.array_equal(kept["peak_bytes"], old_valid["peak_bytes"])
    assert np.array_equal(kept["step_seconds"], old_valid["step_seconds"])
    assert set(wide_valid["chunks"]) == {1, 2, 4, 5, 8, 10, 20, 40}
    # Nothing is enumerated only to break the schedule's layer rules.
    assert not {"interleaved_layers", "schedule"} & set(wide.rejected["rule"])
    assert {"interleaved_layers", "schedule"} <= set(old.rejected["rule"])


def test_every_enumerated_schedule_obeys_megatrons_rules(a100_plans):
    wide, _ = a100_plans
    c = {name: values for name, values in wide.space.columns.items()}
    v, p, m = c["chunks"], c["pipeline_parallel"], c["micro_batches"]
    inter = v > 1
    assert (p[inter] >= 2).all() and (80 % (p[inter] * v[inter]) == 0).all()
    # The interleaved configurations that can run have m a multiple of p.
    ran = np.zeros(wide.size, dtype=bool)
    ran[wide.runnable] = True
    assert (m[inter & ran] % p[inter & ran] == 0).all()
    assert (~ran[inter & (m % p != 0)]).all()


def test_the_schedule_column_names_every_schedule(a100_plans):
    wide, _ = a100_plans
    names = set(wide.valid["schedule"].astype(str))
    assert names == {"1F1B", *(f"interleaved, {v} chunks" for v in (2, 4, 5, 8, 10, 20, 40))}
    assert (wide.valid["schedule"].astype(str) == wide.valid["chunks"].map(
        lambda v: "1F1B" if v == 1 else f"interleaved, {v} chunks")).all()


def test_nemo_llama_2_70b_is_in_the_default_search():
    # NeMo 24.12's Llama-2-70B pretraining row: 64 GPUs, GBS 128, MBS 1, TP 4, PP 4, VP 20.
    result = plan("llama-2-70b", 64, 8, "h100-80gb", 4096, 128, stages=(1,), offload=("none",),
                  recompute=("none",), sequence_parallel=(True,), shard_groups="whole")
    v = result.valid
    row = v[(v["tensor_parallel"] == 4) & (v["pipeline_parallel"] == 4) & (v["chunks"] == 20)
            & (v["micro_batch"] == 1)]
    assert len(row) == 1
    assert int(row["micro_batches"].iloc[0]) == 128 // (4 * 1) == 32   # 32 = 8 x p
    assert bool(row["fits"].iloc[0])


def test_cli_chunks_all_is_the_default(capsys):
    from cli_support import run
    base = ("plan", "--model", "llama-2-70b", "--gpus", "16", "--gpus-per-node", "8", "--device",
            "h100-80gb", "--seq", "4096", "--global-batch", "64", "--stages", "1",
            "--offload", "none", "--format", "json")
    _, default, _ = run(capsys, *base)
    _, named, _ = run(capsys, *base, "--chunks", "all")
    assert default == named and '"chunks": "all"' in default


def test_bad_chunks_name_what_is_allowed():
    with pytest.raises(TypeError, match=r"chunks must be a list or tuple of whole numbers, 1 "
                                        r"\(1F1B\) to 1024 \(interleaved\), or 'all', got 'every'"):
        plan_settings("llama-2-70b", 64, 8, "h100-80gb", 4096, 128, chunks="every")


# --- uneven pipeline stages -------------------------------------------------------------------

def test_the_uneven_splits_searched_by_hand():
    from zerolib.core.planner import uneven_splits
    # 126 + 2 = 128 layers' worth: p = 16 gives 8 a stage, 7 on the first and the last (Meta's)
    assert uneven_splits(126, 16, ALL_CHUNKS) == ((1, 7, 7),)
    assert uneven_splits(126, 4, ALL_CHUNKS) == ((1, 31, 31),)
    assert uneven_splits(126, 64, ALL_CHUNKS) == ((1, 1, 1),)
    assert uneven_splits(126, 128, ALL_CHUNKS) == ()      # no layer left on the ends
    assert uneven_splits(126, 12, ALL_CHUNKS) == ()       # 12 does not divide 128
    assert uneven_splits(126, 2, ALL_CHUNKS) == ()        # two stages: the even split itself
    # BLOOM's 70 + 2 over 12: 6 a stage, 5 on the ends (BigScience's)
    assert uneven_splits(70, 12, ALL_CHUNKS) == ((1, 5, 5),)
    # FIRST and FIRST + 1 share no factor, so no interleaved schedule divides both
    assert uneven_splits(70, 12, (2, 3)) == ()


def test_the_planner_searches_meta_split_and_each_row_is_a_run_estimate_answers_alike():
    from zerolib.core.planner import describe_configuration
    result = plan("llama-3.1-405b", 1024, 8, "h100-80gb", 8192, 256, engine="megatron",
                      max_micro_batch=1, recompute=("full",), context_parallel=(1,))
    valid = result.valid
    uneven = valid[valid["first_layers"] > 0]
    assert set(zip(uneven["pipeline_parallel"], uneven["first_layers"])) == {
        (4, 31), (8, 15), (16, 7), (32, 3), (64, 1)}
    assert (uneven["last_layers"] == uneven["first_layers"]).all()
    # Meta's layout beside the even one, all else alike: the uneven peak is lower (8 layers on
    # the busiest stage either way, but not the embedding beside them)
    key = ["tensor_parallel", "pipeline_parallel", "sequence_parallel", "chunks", "stage",
           "recompute", "micro_batch", "shard_group", "offload"]
    p16 = valid[(valid["pipeline_parallel"] == 16) & (valid["tensor_parallel"] == 8)]
    pairs = p16.groupby(key, observed=True)["peak_bytes"].agg(["min", "max", "count"])
    assert (pairs["count"] == 2).all()
    meta = p16[p16["first_layers"] == 7].set_index(key)["peak_bytes"]
    even = p16[p16["first_layers"] == 0].set_index(key)["peak_bytes"]
    assert (meta < even.loc[meta.index]).all()
    for _, row in uneven.iloc[::7].iterrows():
        run = result.run(row)
        assert run.parallel.pipeline_layers == (row["first_layers"], row["last_layers"])
        (found,) = zl.estimate(run).stages
        assert (found["peak"], found["pipeline_stage"]) == (row["peak_bytes"], row["pipeline_stage"])
        assert found["parallel_step"]["step_seconds"] == pytest.approx(
            float(row["step_seconds"]), rel=1e-9), describe_configuration(row)
    assert "first and last stages 7 and 7 layers" in describe_configuration(uneven[uneven["first_layers"] == 7].iloc[0])
