"""estimate of a model with a link and expert tensor parallelism: timed by the planner's step model,
so estimate and plan give one configuration the same step time and peak; the plan searches ETP
under Megatron-LM only."""
from __future__ import annotations

import pytest

from zerolib.core.estimate import estimate
from zerolib.core.planner import plan

SETTINGS = dict(seq_len=4096, recompute="full")


def _plan(engine="megatron", **options):
    return plan("mixtral-8x7b", 16, 8, "h100-80gb", 4096, 16, links="dgx-h100", engine=engine,
                recompute=("full",), max_micro_batch=1, stages=(1,), context_parallel=(1,), **options)


def test_etp_step_and_peak_agree_with_the_plan():
    frame = _plan(expert_parallel=(2,)).valid
    rows = frame[(frame.tensor_parallel == 1) & (frame.pipeline_parallel == 1)
                 & (frame.expert_parallel == 2) & (frame.expert_tensor_parallel == 2)]
    assert len(rows) == 1
    found = estimate("mixtral-8x7b", 16, **SETTINGS, device="h100-80gb", link="dgx-h100",
                           stages=(1,), engine="megatron", expert_parallel=2,
                           expert_tensor_parallel=2,
                           micro_batches=int(rows.micro_batches.iloc[0])).as_dict()
    row = found["stages"][0]
    step = row["parallel_step"]
    assert step["step_seconds"] == pytest.approx(float(rows.step_seconds.iloc[0]), rel=1e-12)
    assert step["parts"]["expert"] == pytest.approx(float(rows.expert_seconds.iloc[0]), rel=1e-12)
    assert row["peak"] == int(rows.peak_bytes.iloc[0])
    # Megatron-LM's expert data parallel: world / (ETP x EP x PP) = 16 / (2 x 2 x 1) = 4
    assert row["expert_parallel"]["expert_data_parallel"] == 4
    assert step["expert_tensor_parallel"] == 2 and row["expert_traffic"]["etp_calls"] > 0


def test_etp_t_is_the_estimate_as_before():
    common = dict(device="h100-80gb", link="dgx-h100", stages=(1,), engine="megatron",
                  expert_parallel=2)
    before = estimate("mixtral-8x7b", 16, **SETTINGS, **common).as_dict()["stages"][0]
    same = estimate("mixtral-8x7b", 16, **SETTINGS, expert_tensor_parallel=1,
                          **common).as_dict()["stages"][0]
    assert same["parallel_step"]["step_seconds"] == before["parallel_step"]["step_seconds"]
    assert same["peak"] == before["peak"]


def test_the_plan_searches_megatrons_etp_for_experts_only():
    degrees = _plan(expert_parallel=(2,)).settings.expert_tensor_parallel
    assert degrees == (1, 2, 4, 7, 8, 14, 16)   # divisors of 14,336 = 2^11 x 7 up to 16 GPUs
    assert _plan("deepspeed", expert_parallel=(2,)).settings.expert_tensor_parallel is None
    dense = plan("llama-2-7b", 16, 8, "h100-80gb", 4096, 16, engine="megatron", stages=(1,))
    assert dense.settings.expert_tensor_parallel is None
    assert "expert_tensor_parallel" not in dense.valid.columns


@pytest.mark.parametrize("model, engine, etp, message", [
    ("llama-2-7b", "megatron", (2,), "expert_tensor_parallel needs a mixture of experts; "
                                     "llama-2-7b has no experts"),
    ("mixtral-8x7b", "deepspeed", (2,), "expert_tensor_parallel is searched under engine megatron "
                                        "only; engine deepspeed keeps it at tensor_parallel"),
    ("mixtral-8x7b", "megatron", (3,), r"expert_tensor_parallel must divide ffn_hidden \(each "
                                       r"expert's width, 14336 for mixtral-8x7b\), got 3"),
])
def test_plan_refusals(model, engine, etp, message):
    with pytest.raises(ValueError, match=message):
        plan(model, 16, 8, "h100-80gb", 4096, 16, engine=engine, expert_tensor_parallel=etp)
