"""The engines (zerolib.core.step.engines): each one's collectives, micro-batches, overlap and
validity rules. Expected values are worked out by hand in the comments from the ring factors
(a ring pass over n GPUs sends (n - 1) chunks of ceil(E / n) elements, an all-reduce two passes)
and NCCL's latencies (8.4 us per collective, 5.7 us per PCIe step)."""
import math

import numpy as np
import pytest

import zerolib as zl
from zerolib.core.memory.placement import Placement
from zerolib.core.planner import plan
from zerolib.core.step.collectives import ring_timing
from zerolib.core.step.engines import (
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    ENGINES,
    Overlap,
    deepspeed_engine,
    get_engine,
    megatron_engine,
    overlap_rules,
)
from zerolib.core.step.parallel import cluster_interconnect, parallel_step_time
from zerolib.core.step.tables import overlap_frame
from zerolib.core.step.time import ComputeSettings, step_time
from zerolib.core.step.traffic import flat_traffic, traffic

# The hand numbers below take PCIe 4.0 x16 at its 31.5 GB/s line rate (not the rate NCCL reaches).
PCIE = zl.interconnect("pcie4-x16", efficiency="line-rate")

# 7B on 64 GPUs in 16-bit: chunks of ceil(7e9 / 64) = 109,375,000 elements; one ring pass sends
# 63 x 109,375,000 x 2 = 13,781,250,000 bytes per GPU.
PASS_7B_64 = 13_781_250_000


def sent(engine, stage, micro_batches=1, params=7 * 10**9, gpus=64):
    t = flat_traffic(params, gpus, stage, engine=engine, micro_batches=micro_batches)
    return int(t.total_sent), {k: int(v) for k, v in t.by_kind("calls").items()}


# --- names ------------------------------------------------------------------------------------

def test_the_engines_and_the_default():
    assert ENGINE_NAMES == ("paper", "deepspeed", "fsdp2", "megatron", "torchtitan")
    assert DEFAULT_ENGINE == "deepspeed"
    assert get_engine("FSDP2") is ENGINES["fsdp2"]
    with pytest.raises(ValueError, match="engine must be one of paper, deepspeed, fsdp2, megatron"):
        get_engine("colossal")
    with pytest.raises(TypeError, match="engine must be one of"):
        get_engine(3)
    for engine in ENGINES.values():   # every stated behaviour has a source
        assert engine.sources and all(engine.sources.values())
        assert set(engine.pipeline_stages) <= set(engine.stages)


# --- item 1: DeepSpeed's stages 1-2 all-reduce ----------------------------------------------------

def test_deepspeed_stage_1_sends_an_all_reduce_and_an_all_gather():
    # An all-reduce (2 passes) and the parameter all-gather (1 pass): 3 x 13,781,250,000 =
    # 41,343,750,000 B (the number), against the paper's reduce-scatter + all-gather,
    # 2 passes = 27,562,500,000 B. Calls: ceil(7e9 / 5e8) = 14 buckets of reduce_bucket_size,
    # and the 7e9-element padded buffer gathered in 7e9 // 5e8 = 14 shards of allgather_bucket_size.
    assert sent("deepspeed", 1) == (41_343_750_000, {"all_reduce": 14, "reduce_scatter": 0,
                                                     "all_gather": 14, "all_to_all": 0})
    assert sent("paper", 1) == (27_562_500_000, {"all_reduce": 0, "reduce_scatter": 1,
                                                 "all_gather": 1, "all_to_all": 0})
    assert sent("deepspeed", 2)[0] == 3 * PASS_7B_64
    assert sent("megatron", 1)[0] == 2 * PASS_7B_64     # reduce-scatter + all-gather
    assert sent("deepspeed", 3)[0] == sent("paper", 3)[0] == 3 * PASS_7B_64


def test_deepspeed_flags_change_the_schedule():
    # use_multi_rank_bucket_allreduce=False with reduce_scatter=True: each bucket slice reduced
    # to its owner, a reduce-scatter's bytes: 2 passes.
    reduce = deepspeed_engine(use_multi_rank_bucket_allreduce=False)
    assert sent(reduce, 1)[0] == 2 * PASS_7B_64
    assert sent(deepspeed_engine(reduce_scatter=False), 1)[0] == 3 * PASS_7B_64
    # Buckets of 1e9 elements: ceil(7e9 / 1e9) = 7 all-reduce calls.
    assert sent(deepspeed_engine(reduce_bucket_size=10**9), 1)[1]["all_reduce"] == 7
    assert ENGINES["deepspeed"].overlap.backward_hidden == (3,)     # overlap_comm: stage 3 only
    assert deepspeed_engine(overlap_comm=True).overlap.backward_hidden == (2, 3)
    assert ENGINES["deepspeed"].with_flags(overlap_comm=True).flags["overlap_comm"] is True
    with pytest.raises(ValueError, match="reduce_bucket_size must be a whole number"):
        deepspeed_engine(reduce_bucket_size=0)
    with pytest.raises(ValueError, match="overlap_param_gather needs overlap_grad_reduce"):
        megatron_engine(overlap_param_gather=True)


# --- item 2: gradient accumulation -----------------------------------------------------------------

def test_gradient_accumulation_per_stage_and_engine():
    m = 4
    # Stages 0-1 synchronise at the last micro-batch only: 2 passes whatever m.
    assert sent("paper", 0, m)[0] == sent("paper", 1, m)[0] == 2 * PASS_7B_64
    # The paper's stage 2: a reduce-scatter per micro-batch plus one all-gather: (m + 1) passes.
    assert sent("paper", 2, m)[0] == (m + 1) * PASS_7B_64
    # Stage 3: two gathers and a reduce-scatter per micro-batch: 3m passes.
    assert sent("paper", 3, m)[0] == 3 * m * PASS_7B_64 == sent("deepspeed", 3, m)[0]
    # DeepSpeed's stage 2 all-reduces every micro-batch: (2m + 1) passes; its stage 1 once.
    assert sent("deepspeed", 2, m)[0] == (2 * m + 1) * PASS_7B_64
    assert sent("deepspeed", 1, m)[0] == 3 * PASS_7B_64
    # FSDP2's stage 2 gathers before each forward and reduce-scatters each backward: 2m passes.
    assert sent("fsdp2", 2, m)[0] == 2 * m * PASS_7B_64
    assert sent("megatron", 1, m)[0] == 2 * PASS_7B_64
    with pytest.raises(ValueError, match="micro_batches"):
        flat_traffic(10**9, 8, 1, micro_batches=0)


def test_stage_0_reduction_hides_only_behind_the_last_micro_batch():
    # 10^9 fp32 gradients on 2 GPUs over PCIe 4.0: the all-reduce sends 2 x 1 x 5e8 x 4 = 4e9 B
    # at 31.5 GB/s = 0.126984 s. 1,000 tokens: backward 4 x 1e9 x 1e3 / (0.4 x 312e12) =
    # 0.0320513 s for the step. One micro-batch: 0.126984 - 0.0320513 exposed; four: only the
    # last quarter of the backward is left to hide behind, 0.126984 - 0.0080128.
    compute = ComputeSettings(1000, 0.4)
    backward = 4e12 / (0.4 * 312e12)
    latency = float(ring_timing(PCIE, "all_reduce", 2)[0])
    wire = 4e9 / 31.5e9 + latency
    for m in (1, 4):
        t = flat_traffic(10**9, 2, 0, "fp32-adam", engine="paper", micro_batches=m)
        s = step_time(t, PCIE, "a100-80gb", compute)
        assert math.isclose(float(s.exposed["backward"]), wire - backward / m, rel_tol=1e-9)


# --- item 3: overlap rules ----------------------------------------------------------------------

def test_deepspeed_stage_1_waits_for_its_reduction_and_the_playbook_hides_the_gather():
    # Stage 1, 10^9 fp32 parameters on 2 GPUs over PCIe 4.0, 1,000 tokens: DeepSpeed reduces
    # after the backward (overlap_comm off), so its whole all-reduce waits, where the paper's
    # rule hides the backward's 0.0320513 s of it. The post-step all-gather, 2e9 B / 31.5e9 +
    # latency, hides behind the next forward's 2e12 / (0.4 x 312e12) = 0.0160256 s under the
    # Ultra-Scale Playbook's rule.
    compute = ComputeSettings(1000, 0.4)
    forward, backward = 2e12 / (0.4 * 312e12), 4e12 / (0.4 * 312e12)
    ds = step_time(flat_traffic(10**9, 2, 1, "fp32-adam", engine="deepspeed"), PCIE,
                   "a100-80gb", compute)
    paper = step_time(flat_traffic(10**9, 2, 1, "fp32-adam", engine="deepspeed"), PCIE,
                      "a100-80gb", compute, overlap=Overlap("paper"))
    assert math.isclose(float(ds.step_seconds - paper.step_seconds), backward, rel_tol=1e-9)
    playbook = overlap_rules(ENGINES["deepspeed"])["post-step gather hidden"]
    hidden = step_time(flat_traffic(10**9, 2, 1, "fp32-adam", engine="deepspeed"), PCIE,
                       "a100-80gb", compute, overlap=playbook)
    assert math.isclose(float(ds.step_seconds - hidden.step_seconds), forward, rel_tol=1e-9)
    assert ds.overlap.name == "deepspeed" and ds.engine == "deepspeed"


def test_first_gather_and_latency_rules():
    # Stage 3, one flat layer of 10^9 fp32 on 2 GPUs: the forward gather (2e9 B at 31.5 GB/s +
    # 8.4 + 5.7 us) is one call, so "first gather exposed" exposes all of it; "nothing hidden"
    # exposes every collective: the step is compute + communication.
    compute = ComputeSettings(10**6, 0.4)     # 6.41 s of forward: everything else could hide
    t = flat_traffic(10**9, 2, 3, "fp32-adam", engine="paper")
    gather = 2e9 / 31.5e9 + 8.4e-6 + 5.7e-6
    rules = overlap_rules(ENGINES["paper"])
    first = step_time(t, PCIE, "a100-80gb", compute, overlap=rules["first gather exposed"])
    assert math.isclose(float(first.exposed["forward"]), gather, rel_tol=1e-9)
    none = step_time(t, PCIE, "a100-80gb", compute, overlap=rules["nothing hidden"])
    assert math.isclose(float(none.step_seconds),
                        float(none.compute_seconds + none.communication_seconds), rel_tol=1e-12)
    latency = step_time(t, PCIE, "a100-80gb", compute, overlap=rules["latency charged"])
    # Three calls (forward gather, backward gather, reduce-scatter) of 8.4 + 5.7 us each.
    assert math.isclose(float(latency.exposed_seconds), 3 * 14.1e-6, rel_tol=1e-9)


def test_overlap_frame_is_tidy_and_brackets_the_engine():
    frame = overlap_frame(7 * 10**9, 64, "dgx-h100", "h100-80gb", engine="deepspeed")
    assert list(frame.columns) == ["engine", "overlap", "stage", "strategy", "compute_seconds",
                                   "communication_seconds", "exposed_seconds", "step_seconds",
                                   "network_wait_fraction"]
    assert len(frame) == 6 * 4 and set(frame["engine"]) == {"deepspeed"}
    by = frame.set_index(["overlap", "stage"])["step_seconds"]
    for stage in range(4):   # hiding everything is fastest, hiding nothing slowest
        assert by["all hidden", stage] <= by["engine", stage] <= by["nothing hidden", stage]
    assert (frame["step_seconds"] >= frame["compute_seconds"]).all()


# --- item 4: G = 1 is plain data parallelism ------------------------------------------------------

def test_a_shard_group_of_one_gpu_is_plain_data_parallelism_at_every_stage():
    # Llama-2-7B (6,738,415,616 parameters) on 64 GPUs, G = 1: one all-reduce of every gradient,
    # 6,738,415,616 / 64 = 105,287,744 elements per chunk; 2 x 63 x 105,287,744 x 2 B =
    # 26,532,511,488 B, in one call (not 35 per-layer all-reduces).
    for stage in (1, 2, 3):
        t = traffic("llama-2-7b", 64, stage, shard_group=1, engine="paper")
        assert int(t.total_sent) == 26_532_511_488
        assert int(t.by_kind("calls")["all_reduce"]) == 1
        assert int(t.by_kind("calls")["all_gather"]) == int(t.by_kind("calls")["reduce_scatter"]) == 0
    plain = traffic("llama-2-7b", 64, 0, engine="paper")
    assert int(plain.total_sent) == 26_532_511_488
    # and, like plain data parallelism, it synchronises once over 4 micro-batches.
    for stage in (2, 3):
        accumulated = traffic("llama-2-7b", 64, stage, shard_group=1, micro_batches=4)
        assert int(accumulated.total_sent) == 26_532_511_488


# --- item 8: validity follows the engine ----------------------------------------------------------

def test_each_engine_refuses_what_it_does_not_run():
    with pytest.raises(ValueError, match="engine megatron offers ZeRO stages 0, 1, got stage 2"):
        flat_traffic(10**9, 8, 2, engine="megatron")
    with pytest.raises(ValueError, match="engine fsdp2 offers ZeRO stages 0, 2, 3, got stage 1"):
        flat_traffic(10**9, 8, 1, engine="fsdp2")
    with pytest.raises(ValueError, match="engine deepspeed shards in groups smaller than every "
                                         "GPU at stages 3, got a shard group at stage 1"):
        flat_traffic(10**9, 16, 1, shard_group=8, engine="deepspeed")
    with pytest.raises(ValueError, match="ZeRO\\+\\+"):
        flat_traffic(10**9, 16, 3, placement=Placement(qwz=True), engine="fsdp2")


def test_fsdp2_composes_zero_3_with_a_pipeline_and_deepspeed_does_not():
    ic = cluster_interconnect("dgx-h100", 8)
    common = dict(seq_len=4096, micro_batch=1, tensor_parallel=8, pipeline_parallel=4,
                  data_parallel=2, stage=3, micro_batches=8)
    result = parallel_step_time("llama-2-70b", ic, "h100-80gb", engine="fsdp2", **common)
    assert float(result.step_seconds) > 0
    with pytest.raises(ValueError, match="ZeRO stages 2 and 3 do not run with pipeline "
                                         "parallelism"):
        parallel_step_time("llama-2-70b", ic, "h100-80gb", engine="deepspeed", **common)
    # estimate follows the same rule: fsdp2 estimates ZeRO-3 at TP 8 / PP 4, deepspeed refuses.
    settings = dict(tensor_parallel=8, pipeline_parallel=4, micro_batches=8)
    assert zl.estimate("llama-2-70b", 64, **settings, stages=(3,), engine="fsdp2").stages
    with pytest.raises(ValueError, match="ZeRO stages 2 and 3 do not run with pipeline"):
        zl.estimate("llama-2-70b", 64, **settings, stages=(3,), engine="deepspeed")
    assert [r["stage"] for r in zl.estimate(7e9, 8, engine="megatron").stages] == [0, 1]


@pytest.mark.parametrize("engine, stages, pipeline_rejected", [
    ("deepspeed", {0, 1, 2, 3}, True), ("fsdp2", {0, 2, 3}, False), ("megatron", {0, 1}, False),
])
def test_the_planner_follows_the_engine(engine, stages, pipeline_rejected):
    result = plan("llama-2-7b", 16, 8, "a100-80gb", 2048, 64, max_micro_batch=1, engine=engine)
    assert set(np.unique(result.space.columns["stage"])) == stages
    assert ("pipeline_zero" in set(result.rejected["rule"])) == pipeline_rejected
    assert result.settings.as_dict()["engine"] == engine
    assert result.settings.as_dict()["overlap"]["name"] == engine


def test_the_step_tables_take_an_engine():
    # Llama-2-7B on 64 GPUs: a pass sends 63 x 105,287,744 x 2 = 13,266,255,744 B; stage 1 is
    # 2 passes under the paper's schedule (the chapter's default), 3 under DeepSpeed's.
    paper = zl.tradeoff_frame("llama-2-7b", 64, "ib-ndr", "h100-80gb").set_index("stage")
    ds = zl.tradeoff_frame("llama-2-7b", 64, "ib-ndr", "h100-80gb", engine="deepspeed").set_index("stage")
    assert int(paper["sent_bytes"][1]) == 2 * 13_266_255_744
    assert int(ds["sent_bytes"][1]) == 3 * 13_266_255_744
    assert ds.attrs["engine"].name == "deepspeed" and paper.attrs["engine"].name == "paper"
    frame = zl.traffic_frame(7 * 10**9, 64, stages=[2], engine="deepspeed", micro_batches=4)
    assert int(frame["sent_bytes"].sum()) == 9 * PASS_7B_64      # (2m + 1) passes
