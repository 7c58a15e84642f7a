"""ZeRO-R in the planner: P_a (and P_a+cpu) searched where they change something, their peaks
equal to working_set.peaks for the same setting, their times to parallel_step_time's."""
from dataclasses import replace

import numpy as np
import pytest

import zerolib as zl
from zerolib.core.catalogue.devices import Device
from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.planner import describe_configuration, plan
from zerolib.core.step.engines import get_engine
from zerolib.core.step.parallel import parallel_step_time

# The tiny model of tests/core/test_planner.py: 2 layers of hidden 8, 2 heads, MLP 16.
TINY = TransformerConfig("tiny", hidden=8, layers=2, heads=2, kv_heads=2, ffn_hidden=16, vocab=10,
                         max_positions=64, tied_embeddings=False, gated_mlp=False)
TINY_GPU = Device("tiny-gpu", "tiny GPU", 10_000, "a test device", peak_flops=10**12,
                  peak_dtype="bf16")
# no buffers and no reserve: the peak is model state and activations (a run's fields)
BARE_RUN = dict(reserve_bytes=0, reduce_bucket_size=0, max_live_parameters=0,
                prefetch_bucket_size=0, flash_attention=True)


def tiny(**options):
    return plan(TINY, 4, 2, TINY_GPU, 8, 4, links="nvlink4,ib-ndr", max_micro_batch=2,
                recompute=("full",), chunks=(1,), offload=("none",), **BARE_RUN,
                engine="paper", **options)


def _same_as_working_set(result, rows):
    for _, row in rows.iterrows():
        run = result.run(row)
        ws, placement = run.working_set_settings(), run.placement()
        (peak,) = zl.peaks(result.settings.model, result.settings.gpus, [int(row["stage"])], ws,
                           result.settings.layout, placement)
        assert (peak.total, peak.pipeline_stage) == (row["peak_bytes"], row["pipeline_stage"]), \
            describe_configuration(row)


def test_the_tiny_space_gains_a_p_a_row_where_it_changes_something():
    # 4 GPUs in nodes of 2, t at most 2 (2 heads, a node of 2). P_a needs t = 2 without SP:
    # (t, p, d) = (2, 1, 2): micro-batches 1 and 2, ZeRO variants stage 0 and stages 1-3 over
    # G = 1 or 2 (7); (2, 2, 1): micro-batches 1 and 2, stages 0 and 1 beside the pipeline (2).
    # 2 x 7 + 2 x 2 = 18 more configurations, all runnable.
    without, with_pa = tiny(zero_r=("none",)), tiny(zero_r=("none", "partition"))
    assert with_pa.size - without.size == 18
    assert len(with_pa.runnable) - len(without.runnable) == 18
    rows = with_pa.valid[with_pa.valid["partition_activations"]]
    assert len(rows) == 18
    assert (rows["tensor_parallel"] == 2).all() and not rows["sequence_parallel"].any()
    assert "partition_activations" not in without.valid.columns


def test_tiny_p_a_peak_by_hand():
    result = tiny(zero_r=("none", "partition"))
    valid = result.valid
    pick = ((valid["tensor_parallel"] == 2) & (valid["pipeline_parallel"] == 1)
            & (valid["micro_batch"] == 1) & (valid["stage"] == 0) & ~valid["sequence_parallel"])
    plain, split = (int(valid[pick & (valid["partition_activations"] == flag)]["peak_bytes"].iloc[0])
                    for flag in (False, True))
    # Each of the 2 layers keeps its checkpoint, s b h = 8 x 1 x 8 elements of 2 bytes = 128 B,
    # whole on both tensor-parallel GPUs; P_a keeps half of it: 64 B less per layer.
    assert plain - split == 2 * 64
    _same_as_working_set(result, valid)


def test_cpu_checkpointing_leaves_no_checkpoint_on_the_gpu():
    result = tiny(zero_r=("partition", "partition+cpu"))
    valid = result.valid
    pick = ((valid["tensor_parallel"] == 2) & (valid["pipeline_parallel"] == 1)
            & (valid["micro_batch"] == 1) & (valid["stage"] == 0) & ~valid["sequence_parallel"])
    split, host = (int(valid[pick & (valid["cpu_checkpointing"] == flag)]["peak_bytes"].iloc[0])
                   for flag in (False, True))
    assert split - host == 2 * 64      # the GPU keeps none of the 64 B halves
    # At t = 1 or under SP, P_a changes nothing: "partition" is the plain row and
    # "partition+cpu" the host copy alone, so each such configuration comes twice.
    other = valid[(valid["tensor_parallel"] == 1) | valid["sequence_parallel"]]
    assert not other["partition_activations"].any()
    assert 2 * int(other["cpu_checkpointing"].sum()) == len(other) > 0
    _same_as_working_set(result, valid)


@pytest.fixture(scope="module")
def llama70b():
    return plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024, host_memory=2**40,
                zero_r=("none", "partition"))


def test_p_a_is_searched_when_asked(llama70b):
    # DeepSpeed's activation_checkpointing defaults partition_activations to false: so does plan.
    assert plan("llama-2-7b", 16, 8, "a100-40gb", 2048, 64, max_micro_batch=1).settings.zero_r == ("none",)
    assert llama70b.settings.zero_r == ("none", "partition")
    fits = llama70b.fits
    assert fits["partition_activations"].any() and not fits["cpu_checkpointing"].any()
    picks = fits[fits["partition_activations"]]
    assert (picks["recompute"] == "full").all() and (picks["tensor_parallel"] > 1).all()
    assert not picks["sequence_parallel"].any()


def test_sampled_p_a_peaks_are_working_set_peaks(llama70b):
    valid = llama70b.valid[llama70b.valid["partition_activations"]]
    picks = np.random.default_rng(25).choice(len(valid), 60, replace=False)
    _same_as_working_set(llama70b, valid.iloc[np.sort(picks)])


def test_p_a_times_are_parallel_step_time(llama70b):
    valid = llama70b.valid
    picks = np.random.default_rng(5).choice(len(valid), 200, replace=False)
    top = valid.iloc[np.sort(picks)]
    top = top[top["offload"] == "none"]
    assert top["partition_activations"].any() and not top["partition_activations"].all()
    s = llama70b.settings
    times = parallel_step_time(
        s.model, s.interconnect, s.device, seq_len=s.seq_len, micro_batch=top["micro_batch"],
        tensor_parallel=top["tensor_parallel"], pipeline_parallel=top["pipeline_parallel"],
        data_parallel=top["data_parallel"], stage=top["stage"], micro_batches=top["micro_batches"],
        chunks=top["chunks"], sequence_parallel=top["sequence_parallel"].to_numpy(),
        recompute=top["recompute"].astype(str).to_numpy(), shard_group=top["shard_group"],
        partition_activations=top["partition_activations"].to_numpy(), engine=s.engine)
    assert np.allclose(times.step_seconds, top["step_seconds"], rtol=1e-12)


def test_no_named_engine_offers_both_p_a_and_context_parallelism():
    # DeepSpeed (and the paper) have P_a and no ring attention; Megatron-LM and FSDP2 the reverse.
    with pytest.raises(ValueError, match="context_parallel must be \\(1,\\) for engine deepspeed"):
        plan("llama-2-7b", 16, 8, "a100-40gb", 8192, 64, context_parallel=(1, 2),
             zero_r=("none", "partition"))
    with pytest.raises(ValueError, match="zero_r must be \\('none',\\) for engine megatron"):
        plan("llama-2-7b", 16, 8, "a100-40gb", 8192, 64, context_parallel=(1, 2),
             zero_r=("none", "partition"), engine="megatron")


def test_with_context_parallel_degrees_too():
    # No named engine runs both (above); the paper's schedule granted ring attention keeps the
    # planner's P_a x C rows checked against the working set and the step model.
    both_engine = replace(get_engine("paper"), context_parallel=True)
    result = plan("llama-2-7b", 16, 8, "a100-40gb", 8192, 64, max_micro_batch=1,
                  recompute=("full",), offload=("none",), context_parallel=(1, 2),
                  zero_r=("none", "partition"), engine=both_engine)
    valid = result.valid
    both = valid[valid["partition_activations"] & (valid["context_parallel"] == 2)]
    assert len(both)
    _same_as_working_set(result, both.head(10))
    s = result.settings
    row = both.iloc[0]
    times = parallel_step_time(
        s.model, s.interconnect, s.device, seq_len=s.seq_len, micro_batch=int(row["micro_batch"]),
        tensor_parallel=int(row["tensor_parallel"]), pipeline_parallel=int(row["pipeline_parallel"]),
        data_parallel=int(row["data_parallel"]) * 2, stage=int(row["stage"]),
        micro_batches=int(row["micro_batches"]), chunks=int(row["chunks"]),
        sequence_parallel=False, recompute="full", shard_group=int(row["shard_group"]),
        context_parallel=2, partition_activations=True, engine=s.engine)
    assert float(times.step_seconds) == pytest.approx(float(row["step_seconds"]), rel=1e-12)


def test_engines_without_it_do_not_search_it():
    for engine in ("megatron", "fsdp2"):
        result = plan("llama-2-7b", 16, 8, "a100-40gb", 2048, 64, max_micro_batch=1, engine=engine)
        assert result.settings.zero_r == ("none",)
        assert "partition_activations" not in result.valid.columns
    with pytest.raises(ValueError, match="zero_r must be \\('none',\\) for engine megatron"):
        plan("llama-2-7b", 16, 8, "a100-40gb", 2048, 64, engine="megatron", zero_r=("partition",))
    with pytest.raises(ValueError, match="zero_r must be from none, partition, partition\\+cpu"):
        plan("llama-2-7b", 16, 8, "a100-40gb", 2048, 64, zero_r=("P_a",))
    with pytest.raises(ValueError, match="give zero_r instead"):
        plan(zl.Run.of("llama-2-7b", 16, gpus_per_node=8, device="a100-40gb", seq_len=2048,
                        global_batch=64, recompute="full", partition_activations=True))


def test_describe_names_it():
    c = {"tensor_parallel": 8, "pipeline_parallel": 1, "data_parallel": 2, "sequence_parallel": False,
         "chunks": 1, "stage": 1, "shard_group": 2, "recompute": "full", "micro_batch": 1,
         "micro_batches": 4, "offload": "none", "partition_activations": True,
         "cpu_checkpointing": False}
    assert describe_configuration(c) == ("t 8 x p 1 (1F1B) x d 2, ZeRO-1, full recomputation "
                                         "with P_a, micro-batch 1 x 4, no offload")
