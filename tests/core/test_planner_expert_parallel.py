"""The planner searching expert parallelism for a mixture of experts: each configuration once
per degree E, the engines' rules for where the expert-parallel group sits, the experts' state
sharded over their own group, their all-to-alls and their smaller gradient ring in the step.

Mixtral-8x7B by hand (Jiang et al. 2024, Table 1; its published 46,702,792,704 parameters): 32
layers of 8 experts, each expert a SwiGLU MLP of 3 x 4096 x 14336 = 176,160,768 parameters, so
the routed experts hold 32 x 8 x 176,160,768 = 45,097,156,608 and everything else 1,605,636,096.
"""
from __future__ import annotations

import pytest

from zerolib.core.planner import REASONS, plan
from zerolib.core.step.expert_parallel_traffic import expert_traffic, expert_traffic_seconds
from zerolib.core.step.parallel import cluster_interconnect

EXPERT = 3 * 4096 * 14336
EXPERTS = 32 * 8 * EXPERT
DENSE = 46_702_792_704 - EXPERTS
ONE_NODE = ("mixtral-8x7b", 8, 8, "h100-80gb", 1024, 8)
SMALL = dict(stages=(1,), recompute=("none",), chunks=(1,), offload=("none",), shard_groups="whole",
             max_micro_batch=1, sequence_parallel=(False,))


def _row(result, **where):
    valid = result.valid
    keep = valid["fits"].notna()
    for name, value in where.items():
        keep &= valid[name] == value
    (index,) = keep[keep].index     # exactly one
    return valid.loc[index]


def test_hand_counts_of_the_model():
    assert EXPERT == 176_160_768 and EXPERTS == 45_097_156_608 and DENSE == 1_605_636_096


def test_degrees_searched_by_default_and_for_a_dense_model():
    # Every divisor of Mixtral's 8 routed experts; a dense model has nothing to spread.
    moe = plan(*ONE_NODE, **SMALL)
    assert moe.settings.expert_parallel == (1, 2, 4, 8)
    assert moe.settings.as_dict()["expert_parallel"] == [1, 2, 4, 8]
    assert set(moe.valid["expert_parallel"]) <= {1, 2, 4, 8}
    dense = plan("llama-2-7b", 8, 8, "h100-80gb", 1024, 8, **SMALL)
    assert dense.settings.expert_parallel == (1,)
    assert "expert_parallel" not in dense.valid.columns
    assert "expert_parallel" not in dense.settings.as_dict()
    # ... and on fewer GPUs than experts, only the degrees that fit in them
    assert plan("mixtral-8x7b", 4, 4, "h100-80gb", 1024, 4, **SMALL).settings.expert_parallel == (1, 2, 4)


def test_degrees_are_checked_at_the_door():
    with pytest.raises(ValueError, match="expert_parallel above 1 needs a mixture of experts; "
                                         "llama-2-7b has no experts"):
        plan("llama-2-7b", 8, 8, "h100-80gb", 1024, 8, expert_parallel=(1, 2))
    with pytest.raises(ValueError, match="expert_parallel must name at least one degree"):
        plan(*ONE_NODE, expert_parallel=())
    with pytest.raises(ValueError, match="expert_parallel"):
        plan(*ONE_NODE, expert_parallel=(0,))


def test_each_configuration_once_per_degree():
    ones = plan(*ONE_NODE, **SMALL, expert_parallel=(1,))
    both = plan(*ONE_NODE, **SMALL, expert_parallel=(1, 8))
    assert both.size == 2 * ones.size
    e1 = both.valid[both.valid["expert_parallel"] == 1]
    assert e1["peak_bytes"].tolist() == ones.valid["peak_bytes"].tolist()
    assert e1["step_seconds"].tolist() == pytest.approx(ones.valid["step_seconds"].tolist(), rel=1e-12)
    assert (e1["expert_seconds"] == 0).all()


def test_experts_state_over_the_expert_data_parallel_group_by_hand():
    # t 1 x p 1 x d 8, ZeRO-1, mixed-adam (2 + 2 + 12 bytes), E = 8: each GPU holds one expert of
    # each layer (32 x 176,160,768), whose group is d / E = 1 GPU: 16 bytes each, unsharded;
    # the dense part keeps 4 bytes and 12 / 8 of its optimizer state. Without E: all 8 experts,
    # 4 bytes whole and 12 over 8. The working set is the same in both, so the peaks differ by
    # the persistent bytes alone.
    result = plan(*ONE_NODE, **SMALL, expert_parallel=(1, 8))
    with_ep = 4 * DENSE + 12 * (DENSE // 8) + 16 * 32 * EXPERT
    without = 4 * (DENSE + EXPERTS) + 12 * ((DENSE + EXPERTS) // 8)
    assert (DENSE + EXPERTS) % 8 == DENSE % 8 == 0
    assert with_ep == 99_025_311_744 and without == 256_865_359_872
    e8 = _row(result, tensor_parallel=1, pipeline_parallel=1, expert_parallel=8)
    e1 = _row(result, tensor_parallel=1, pipeline_parallel=1, expert_parallel=1)
    assert e1["peak_bytes"] - e8["peak_bytes"] == without - with_ep
    assert e8["fits"] == bool(e8["peak_bytes"] <= 80 * 2**30)


def test_the_all_to_alls_by_hand_and_against_the_per_setting_function():
    # Per MoE layer and micro-batch 4 all-to-alls; each hands T x k = 1024 x 2 rows of 4096
    # 16-bit values, of which 7/8 leave the GPU (1,792 rows x 8,192 bytes = 14,680,064 bytes);
    # 32 layers, m = 8 / (8 x 1) = 1 micro-batch.
    result = plan(*ONE_NODE, **SMALL, expert_parallel=(1, 8))
    row = _row(result, tensor_parallel=1, pipeline_parallel=1, expert_parallel=8)
    traffic = expert_traffic("mixtral-8x7b", 1024, 1, 8, micro_batches=int(row["micro_batches"]))
    assert (traffic.calls, traffic.sent_bytes) == (4 * 32 * 1, 1792 * 8192)
    ic = cluster_interconnect("dgx-h100", 8)
    assert row["expert_seconds"] == pytest.approx(expert_traffic_seconds(traffic, ic), rel=1e-12)
    assert row["expert_seconds"] > 0
    parts = ("compute", "tensor", "pipeline", "data_parallel", "bubble", "expert")
    assert sum(row[f"{p}_seconds"] for p in parts) == pytest.approx(row["step_seconds"], rel=1e-12)


def test_the_experts_gradients_reduce_over_their_smaller_group():
    # E = 8 on d = 8: the experts' group is one GPU, so only the dense part's 1.6B parameters
    # are reduced across GPUs (ZeRO-1: a reduce-scatter and an all-gather); E = 1 reduces all
    # 46.7B. The data-parallel time shrinks with E, E = 2 and 4 in between.
    result = plan(*ONE_NODE, **SMALL, expert_parallel=(1, 2, 4, 8))
    seconds = [_row(result, tensor_parallel=1, pipeline_parallel=1, expert_parallel=e)["data_parallel_seconds"]
               for e in (1, 2, 4, 8)]
    assert seconds == sorted(seconds, reverse=True) and seconds[-1] < seconds[0] * DENSE / (DENSE + EXPERTS) * 1.5


def test_engines_place_the_expert_group_by_their_rules():
    # 16 GPUs at t 1, p 1 and C 4: the ZeRO group d x C is 16, d = 4. Megatron-LM and FSDP2
    # (torchtitan) take E from d x C, so E = 8 runs; DeepSpeed runs no ring attention, so it
    # never meets C 4 (DeepSpeed-MoE would carve E from d alone).
    args = ("mixtral-8x7b", 16, 8, "h100-80gb", 1024, 16)
    options = dict(SMALL, stages=(0,), expert_parallel=(8,), context_parallel=(4,),
                   flash_attention=True)
    code = REASONS.index("expert_parallel")
    with pytest.raises(ValueError, match="context_parallel must be \\(1,\\) for engine deepspeed"):
        plan(*args, **options, engine="deepspeed")
    for engine, rejected in (("megatron", False), ("fsdp2", False)):
        result = plan(*args, **options, engine=engine)
        mask = ((result.space.columns["tensor_parallel"] == 1)
                & (result.space.columns["pipeline_parallel"] == 1))
        assert mask.any()
        assert bool((result.reason[mask] == code).all()) == rejected, engine
        assert bool((result.reason[mask] == code).any()) == rejected, engine
    # torchtitan's EP takes all of C (``ep % cp == 0``): E = 2 under C = 4 runs in Megatron-LM only.
    options["expert_parallel"] = (2,)
    for engine, rejected in (("megatron", False), ("fsdp2", True)):
        result = plan(*args, **options, engine=engine)
        mask = ((result.space.columns["tensor_parallel"] == 1)
                & (result.space.columns["pipeline_parallel"] == 1))
        assert bool((result.reason[mask] == code).all()) == rejected, engine
        assert bool((result.reason[mask] == code).any()) == rejected, engine


def test_expert_parallel_with_tensor_parallel_needs_sequence_parallel():
    result = plan(*ONE_NODE, **dict(SMALL, sequence_parallel=(False, True)), expert_parallel=(2,))
    cols, code = result.space.columns, REASONS.index("expert_parallel")
    no_sp = (cols["tensor_parallel"] == 2) & ~cols["sequence_parallel"] & (cols["pipeline_parallel"] == 1)
    assert (result.reason[no_sp] == code).all()
    assert _row(result, tensor_parallel=2, pipeline_parallel=1, sequence_parallel=True)["expert_parallel"] == 2


def test_shard_groups_and_offload_are_not_planned_with_experts_spread():
    result = plan(*ONE_NODE, **dict(SMALL, shard_groups="all", offload=("none", "optimizer")),
                  expert_parallel=(1, 8), host_memory=2 * 10**12)
    valid = result.valid
    spread = valid[valid["expert_parallel"] == 8]
    assert len(spread) and (spread["offload"].astype(str) == "none").all()
    assert (spread["shard_group"] == spread["data_parallel"]).all()
    assert ((valid["expert_parallel"] == 1) & (valid["offload"].astype(str) == "optimizer")).any()


def test_compute_counts_the_active_parameters():
    # A token runs 2 of the 8 experts: 46,702,792,704 - 32 x 6 x 176,160,768 = 12,879,925,248
    # active parameters (the total Mixtral's source states, embedding and output included), at
    # 6 FLOPs each per token but for the 32,000 x 4,096 embedding (a lookup), and 3 x the causal
    # core (32 layers x 1,024 x 32 heads x 256), 1,024 tokens, on an H100's 989.5 TFLOP/s at
    # mfu 0.4; E does not change it.
    active = 46_702_792_704 - 32 * 6 * EXPERT
    assert active == 12_879_925_248
    flops = 6 * (active - 32_000 * 4096) + 3 * 32 * 1024 * 32 * 256
    result = plan(*ONE_NODE, **SMALL, expert_parallel=(1, 8), mfu=0.4)
    for e in (1, 8):
        row = _row(result, tensor_parallel=1, pipeline_parallel=1, expert_parallel=e)
        assert row["micro_batches"] == 1
        assert row["compute_seconds"] == pytest.approx(flops * 1024 / (989.5e12 * 0.4), rel=1e-12)
