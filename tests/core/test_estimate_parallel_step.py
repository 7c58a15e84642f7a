"""estimate of a model with a link and context or expert parallelism: timed by the planner's step
model, so ``estimate`` and ``plan`` give one configuration the same step time."""
from __future__ import annotations

import pytest

from zerolib.core.estimate import estimate
from zerolib.core.planner import plan


def _plan_row(model, gpus, seq_len, batch, **options):
    frame = plan(model, gpus, 8, "h100-80gb", seq_len, batch, links="dgx-h100", engine="megatron",
                 recompute=("full",), max_micro_batch=1, **options).valid
    return frame[(frame.tensor_parallel == 1) & (frame.pipeline_parallel == 1)]


def test_context_parallel_step_agrees_with_the_plan():
    # 16 GPUs, C = 4: d x C = 16, one sequence of 32,768 tokens each per d rank and micro-batch
    rows = _plan_row("llama-2-7b", 16, 32_768, 16, context_parallel=(4,), stages=(0, 1))
    settings = dict(seq_len=32_768, recompute="full", context_parallel=4)
    found = estimate("llama-2-7b", 16, **settings, device="h100-80gb", link="dgx-h100",
                           stages=(0, 1), engine="megatron",
                           micro_batches=int(rows.micro_batches.iloc[0])).as_dict()
    for row in found["stages"]:
        theirs = rows[rows.stage == row["stage"]]
        assert len(theirs) == 1
        step = row["parallel_step"]
        assert step["step_seconds"] == pytest.approx(float(theirs.step_seconds.iloc[0]), rel=1e-12)
        assert step["parts"]["context"] > 0 and step["context_parallel"] == 4
        assert sum(step["parts"].values()) == pytest.approx(step["step_seconds"], rel=1e-12)
    # the compute settings count a GPU's share of each sequence: 32,768 / 4 tokens
    assert found["compute_settings"]["tokens_per_gpu"] == 8_192 * found["micro_batches"]


def test_expert_parallel_step_agrees_with_the_plan():
    rows = _plan_row("mixtral-8x7b", 64, 4096, 64, expert_parallel=(8,), stages=(1,))
    rows = rows[rows.expert_parallel == 8]
    settings = dict(seq_len=4096, recompute="full")
    found = estimate("mixtral-8x7b", 64, **settings, device="h100-80gb", link="dgx-h100",
                           stages=(1,), engine="megatron", expert_parallel=8,
                           micro_batches=int(rows.micro_batches.iloc[0])).as_dict()
    step = found["stages"][0]["parallel_step"]
    assert step["step_seconds"] == pytest.approx(float(rows.step_seconds.iloc[0]), rel=1e-12)
    assert step["parts"]["expert"] > 0 and step["expert_parallel"] == 8
    assert found["stages"][0]["expert_parallel"]["expert_data_parallel"] == 8


def test_what_the_step_model_does_not_time_is_refused():
    settings = dict(seq_len=32_768, recompute="full", context_parallel=4)
    common = {"link": "dgx-h100", "stages": (1,), "engine": "megatron"}
    with pytest.raises(ValueError, match="needs a device"):
        estimate("llama-2-7b", 16, **settings, **common)
    with pytest.raises(ValueError, match=r"^qwz is not modelled with model parallelism "
                                         r"\(tensor, pipeline, context or expert\)"):
        estimate("llama-2-7b", 16, **settings, device="h100-80gb", qwz=True, **common)
    with pytest.raises(ValueError, match="^tokens_per_gpu is not modelled"):
        estimate("llama-2-7b", 16, **settings, device="h100-80gb", tokens_per_gpu=4096, **common)
    # expert_tensor_parallel other than t is timed now (test_estimate_expert_tensor_parallel.py)


def test_the_engines_rules_are_the_planners():
    # the planner searches C > 1 only under megatron and fsdp2, and under FSDP2 C | E
    with pytest.raises(ValueError, match="^engine deepspeed runs no ring-attention context parallelism"):
        estimate("llama-2-7b", 16, **dict(seq_len=32_768, recompute="full",
                                                            context_parallel=4),
                       device="h100-80gb", link="dgx-h100", stages=(1,), engine="deepspeed")
    with pytest.raises(ValueError, match=r"context_parallel \(4\) must divide expert_parallel, got 2"):
        estimate("mixtral-8x7b", 16, **dict(recompute="full", context_parallel=4),
                       device="h100-80gb", link="dgx-h100", stages=(2,), engine="fsdp2",
                       expert_parallel=2)
