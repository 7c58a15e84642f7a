"""The planner searching context parallelism: each configuration once per CP degree, the
ZeRO group d x C, the micro-batches B / (d b), and the peaks and times of the working set and
the step model for the same setting. Under Megatron-LM's rules (its distributed optimizer is
ZeRO-1; it runs --context-parallel-size), and FSDP2's where its stages 2-3 matter."""
from __future__ import annotations

import numpy as np
import pytest

import zerolib.core.planner as planner
from zerolib.core.memory.working_set import peaks
from zerolib.core.step.parallel import cluster_interconnect, parallel_step_time

ARGS = ("llama-2-70b", 64, 8, "h100-80gb", 32_768, 64)
SMALL = dict(stages=(1,), recompute=("selective",), chunks=(1,), offload=("none",), shard_groups="whole",
             engine="megatron")


def test_under_one_degree_the_plan_has_no_cp_column():
    deepspeed = planner.plan(*ARGS, **dict(SMALL, engine="deepspeed", stages=(1,)))
    ones = planner.plan(*ARGS, **SMALL, context_parallel=(1,))
    assert "context_parallel" not in ones.valid.columns
    assert "context_parallel" not in ones.settings.as_dict()
    # DeepSpeed runs no ring attention: its default search is C = 1 alone
    assert deepspeed.settings.context_parallel == (1,)
    assert "context_parallel" not in deepspeed.valid.columns


def test_by_default_an_engine_with_ring_attention_searches_it():
    # 32,768 tokens on 64 GPUs: every degree up to 16 cuts the sequence into 2C whole chunks
    # (32,768 / 32 = 1,024) and fits in the GPUs, so the default is all five.
    default = planner.plan(*ARGS, **SMALL)
    named = planner.plan(*ARGS, **SMALL, context_parallel=(1, 2, 4, 8, 16))
    assert default.settings.context_parallel == (1, 2, 4, 8, 16)
    assert default.valid.equals(named.valid)


def test_the_default_degrees_stop_where_gpus_or_chunks_do():
    from zerolib.core.plan_settings import plan_settings
    # 8 GPUs: C at most 8. 24 tokens: 2C must divide 24, which 4 and 8 do (C = 2, 4) and 16
    # and 32 do not (C = 8, 16).
    assert plan_settings("llama-2-7b", 8, 8, "h100-80gb", 4096, 8,
                         engine="fsdp2").context_parallel == (1, 2, 4, 8)
    assert plan_settings("llama-2-7b", 64, 8, "h100-80gb", 24, 64,
                         engine="megatron").context_parallel == (1, 2, 4)
    # without flash attention ring attention cannot run: C = 1 alone
    assert plan_settings("llama-2-7b", 64, 8, "h100-80gb", 4096, 64, engine="megatron",
                         flash_attention=False).context_parallel == (1,)


def test_llama_405b_at_131072_tokens_is_planned_with_cp_by_default():
    # Meta's 405B long-context stage (arXiv:2407.21783, Table 4: 16,384 H100, 131,072 tokens, 16M
    # tokens per step = 128 sequences) under Megatron-LM's rules. Without CP each of the
    # 16,384 / (8 x 16) = 128 replicas runs one micro-batch through 16 stages: a bubble of
    # (p - 1) / (m + p - 1) = 15 / 16 of the pipeline's time, a little less of the step (which
    # also waits on collectives outside the pipeline). The default search finds CP (Meta ran
    # C 16) and a step many times shorter.
    args = ("llama-3.1-405b", 16_384, 8, "h100-80gb", 131_072, 128)
    without = planner.plan(*args, engine="megatron", context_parallel=(1,)).fits.iloc[0]
    first = planner.plan(*args, engine="megatron").fits.iloc[0]
    assert (without["tensor_parallel"], without["pipeline_parallel"]) == (8, 16)
    assert 0.9 < without["bubble_fraction"] <= 15 / 16
    assert first["context_parallel"] == 16
    assert first["step_seconds"] * 5 < without["step_seconds"]


def test_each_configuration_once_per_degree():
    plain = planner.plan(*ARGS, **SMALL, context_parallel=(1,))
    both = planner.plan(*ARGS, **SMALL, context_parallel=(1, 2))
    assert both.size == 2 * plain.size
    assert both.settings.as_dict()["context_parallel"] == [1, 2]
    ones = both.valid[both.valid["context_parallel"] == 1].drop(columns=["rank", "context_parallel"])
    assert ones.reset_index(drop=True).equals(plain.valid.drop(columns=["rank"]).reset_index(drop=True))


def test_a_cp_row_by_hand():
    # t = 8 x C = 2 x d = 4 on 64 GPUs, p = 1, micro-batch 1: the ZeRO group is d x C = 8 and
    # each of the d = 4 replicas runs 64 / (4 x 1) = 16 micro-batches per step.
    result = planner.plan(*ARGS, **SMALL, context_parallel=(1, 2))
    valid = result.valid
    row = valid[(valid.tensor_parallel == 8) & (valid.context_parallel == 2) & (valid.pipeline_parallel == 1)
                & (valid.micro_batch == 1) & valid.sequence_parallel].iloc[0]
    assert (row.data_parallel, row.micro_batches, row.shard_group) == (4, 16, 8)
    run = result.run(row)
    ws, placement = run.working_set_settings(), run.placement()
    assert ws.context_parallel == 2
    # Megatron-LM's bf16 layout: 2 + 4 + 12 bytes per parameter (its fp32 gradient buffer)
    assert run.trainer.layout_of == "bf16-fp32-grads"
    assert peaks("llama-2-70b", 64, [1], ws, "bf16-fp32-grads", placement=placement)[0].total == \
        row.peak_bytes
    step = parallel_step_time("llama-2-70b", cluster_interconnect("dgx-h100", 8), "h100-80gb",
                              seq_len=32_768, micro_batch=1, tensor_parallel=8, pipeline_parallel=1,
                              data_parallel=8, stage=1, micro_batches=16, sequence_parallel=True,
                              recompute="selective", context_parallel=2, engine="megatron",
                              layout="bf16-fp32-grads")
    assert float(step.step_seconds) == pytest.approx(row.step_seconds, rel=1e-12)
    assert "x C 2" in planner.describe_configuration(row)


def test_a_degree_must_divide_the_zero_group():
    # t = 8 x p = 8 leaves one GPU per ZeRO group: C = 2 cannot split it.
    result = planner.plan(*ARGS, **SMALL, context_parallel=(2,))
    columns = result.space.columns
    sel = (columns["tensor_parallel"] == 8) & (columns["pipeline_parallel"] == 8)
    assert np.all(result.reason[sel] == planner.REASONS.index("context_parallel"))
    assert "context_parallel" in set(result.rejected["rule"])


def test_the_door_checks_the_degrees():
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel"):
        planner.plan(*ARGS, **SMALL, context_parallel=(3,))
    with pytest.raises(ValueError, match="context_parallel above 1 needs flash_attention"):
        planner.plan(*ARGS, **SMALL, context_parallel=(2,),
                     flash_attention=False)
    with pytest.raises(ValueError, match="context_parallel must name at least one degree"):
        planner.plan(*ARGS, **SMALL, context_parallel=())


def test_fsdp2_runs_stages_2_and_3_beside_a_pipeline_at_every_degree():
    # FSDP2 runs ZeRO-2/3 inside pipeline stages (torchtitan); at C = 2 as at C = 1. Llama 2 7B on
    # 16 GPUs, t 1 x p 2: the ZeRO group (the shard group) is 8 GPUs, d = 8 / C replicas of
    # b = 1 each run 16 / d micro-batches: d 8 and 2 at C = 1, d 4 and 4 at C = 2.
    result = planner.plan("llama-2-7b", 16, 8, "h100-80gb", 8192, 16, engine="fsdp2", stages=(2, 3),
                          context_parallel=(1, 2), recompute=("full",), chunks=(1,), max_micro_batch=1,
                          shard_groups="whole", offload=("none",))
    valid = result.valid
    piped = valid[(valid.tensor_parallel == 1) & (valid.pipeline_parallel == 2)]
    assert sorted(zip(piped.context_parallel, piped.stage, piped.data_parallel, piped.shard_group,
                      piped.micro_batches)) == [
        (1, 2, 8, 8, 2), (1, 3, 8, 8, 2), (2, 2, 4, 8, 4), (2, 3, 4, 8, 4)]
    assert "pipeline_zero" not in set(result.rejected["rule"])
    row = piped[(piped.context_parallel == 2) & (piped.stage == 3)].iloc[0]
    run = result.run(row)
    ws, placement = run.working_set_settings(), run.placement()
    assert peaks("llama-2-7b", 16, [3], ws, placement=placement)[0].total == row.peak_bytes
    step = parallel_step_time("llama-2-7b", cluster_interconnect("dgx-h100", 8), "h100-80gb",
                              seq_len=8192, micro_batch=1, tensor_parallel=1, pipeline_parallel=2,
                              data_parallel=8, stage=3, micro_batches=4, recompute="full",
                              context_parallel=2, engine="fsdp2")
    assert float(step.step_seconds) == pytest.approx(row.step_seconds, rel=1e-12)


def test_engines_without_ring_attention_refuse_degrees_above_1():
    for engine in ("deepspeed", "paper"):
        with pytest.raises(ValueError, match=f"context_parallel must be \\(1,\\) for engine {engine}"):
            planner.plan(*ARGS, **dict(SMALL, engine=engine), context_parallel=(1, 2))
    assert planner.plan(*ARGS, **dict(SMALL, engine="deepspeed"), context_parallel=(1,)).size
