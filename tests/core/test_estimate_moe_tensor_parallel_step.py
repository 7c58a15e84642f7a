"""estimate and plan on a mixture of experts at t > 1: Mixtral-8x7B on 64 H100s (DGX H100
nodes), Megatron-LM, t 2 with sequence parallelism, E 4, ETP 1 and 2, stage 1, full
recomputation; one configuration, one step, part by part (as
test_estimate_model_parallel_step.py does for llama-2-7b)."""
from __future__ import annotations

import pytest

from zerolib.core.estimate import estimate
from zerolib.core.planner import plan

SETTINGS = dict(seq_len=4096, recompute="full", tensor_parallel=2,
                              sequence_parallel=True)


@pytest.fixture(scope="module")
def frame():
    return plan("mixtral-8x7b", 64, 8, "h100-80gb", 4096, 64, links="dgx-h100", engine="megatron",
                recompute=("full",), max_micro_batch=1, stages=(1,), expert_parallel=(4,)).valid


@pytest.mark.parametrize("etp", [1, 2])
def test_the_step_is_the_plans(frame, etp):
    rows = frame[(frame.tensor_parallel == 2) & (frame.pipeline_parallel == 1)
                 & frame.sequence_parallel & (frame.expert_parallel == 4)
                 & (frame.expert_tensor_parallel == etp) & (frame.chunks == 1)
                 & (frame.shard_group == frame.data_parallel)]
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row.micro_batches == 2              # global batch 64 over d = 64 / 2 = 32, b 1
    found = estimate("mixtral-8x7b", 64, **SETTINGS, stages=(1,), device="h100-80gb",
                           link="dgx-h100", engine="megatron", expert_parallel=4,
                           expert_tensor_parallel=etp, micro_batches=2).as_dict()
    stage = found["stages"][0]
    step = stage["parallel_step"]
    for part in ("compute", "tensor", "expert", "data_parallel"):
        assert step["parts"][part] == pytest.approx(float(row[f"{part}_seconds"]), rel=1e-12), part
    assert step["step_seconds"] == pytest.approx(float(row.step_seconds), rel=1e-12)
    assert stage["peak"] == int(row.peak_bytes)
    # 6 all-to-alls per MoE layer and micro-batch (full recomputation), all 32 layers on the
    # GPU, the step's 2 micro-batches (gradient accumulation); ETP 2 as many all-gathers and
    # reduce-scatters, none at ETP 1
    traffic = stage["expert_traffic"]
    assert (traffic["moe_layers"], traffic["micro_batches"]) == (32, 2)
    assert traffic["all_to_all_calls"] == 32 * 6 * 2
    assert traffic["etp_calls"] == (0 if etp == 1 else 32 * 6 * 2)
