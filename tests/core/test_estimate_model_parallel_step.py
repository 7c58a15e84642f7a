"""estimate of a model with a link and tensor or pipeline parallelism: timed by the planner's step
model (it was refused before), so ``estimate`` and ``plan`` give one configuration one time."""
from __future__ import annotations

import pytest

from zerolib.core.estimate import estimate
from zerolib.core.planner import plan

# 16 H100s on DGX H100 nodes, full recomputation, micro-batch 1, global batch 32.
COMMON = {"device": "h100-80gb", "link": "dgx-h100", "engine": "megatron"}


def _plan_row(t, p, stage, sequence_parallel, engine):
    frame = plan("llama-2-7b", 16, 8, "h100-80gb", 4096, 32, links="dgx-h100", engine=engine,
                 recompute=("full",), max_micro_batch=1, stages=(stage,), context_parallel=(1,)).valid
    rows = frame[(frame.tensor_parallel == t) & (frame.pipeline_parallel == p)
                 & (frame.sequence_parallel == sequence_parallel) & (frame.chunks == 1)
                 & (frame.shard_group == frame.data_parallel)]
    assert len(rows) == 1
    return rows.iloc[0]


@pytest.mark.parametrize("t, p, sp, stage, engine", [
    (2, 1, False, 1, "megatron"), (2, 1, True, 3, "fsdp2"), (4, 1, True, 2, "deepspeed"),
    (1, 2, False, 1, "megatron"), (2, 2, True, 0, "megatron"), (2, 2, False, 1, "deepspeed")])
def test_the_step_is_the_plans(t, p, sp, stage, engine):
    row = _plan_row(t, p, stage, sp, engine)
    d = 16 // (t * p)
    assert row.micro_batches == 32 // d          # global batch 32 over d ranks, micro-batch 1
    # one micro-batch count per run: the pipeline's, or gradient accumulation's without one
    found = estimate("llama-2-7b", 16, seq_len=4096, recompute="full", tensor_parallel=t,
                     sequence_parallel=sp, pipeline_parallel=p,
                     micro_batches=int(row.micro_batches), stages=(stage,),
                     device="h100-80gb", link="dgx-h100", engine=engine).as_dict()
    step = found["stages"][0]["parallel_step"]
    assert found["micro_batches"] == 32 // d
    assert step["step_seconds"] == pytest.approx(float(row.step_seconds), rel=1e-12)
    assert sum(step["parts"].values()) == pytest.approx(step["step_seconds"], rel=1e-12)
    for part in ("compute", "tensor", "pipeline", "data_parallel", "bubble"):
        assert step["parts"][part] == pytest.approx(float(row[f"{part}_seconds"]), rel=1e-12), part
    assert (step["parts"]["tensor"] > 0) == (t > 1)
    assert (step["parts"]["pipeline"] > 0) == (p > 1) == (step["parts"]["bubble"] > 0)
    # 1F1B idles (p - 1) micro-batch times, (p - 1) / m of the m micro-batches' time (Narayanan
    # et al. 2021, Sec. 2.2.1); at stages 0 and 1 the data-parallel reduction runs once a step
    parts, m = step["parts"], 32 // d
    if stage in (0, 1):
        assert parts["bubble"] == pytest.approx(
            (p - 1) / m * (parts["compute"] + parts["tensor"] + parts["pipeline"]), rel=1e-9)


def test_a_pipeline_without_micro_batches_runs_p_of_them():
    found = estimate("llama-2-7b", 16, recompute="full", pipeline_parallel=4, stages=(1,),
                     **COMMON).as_dict()
    assert found["micro_batches"] == 4
    parts = found["stages"][0]["parallel_step"]["parts"]
    assert parts["bubble"] == pytest.approx(3 / 4 * (parts["compute"] + parts["pipeline"]), rel=1e-9)


def test_what_the_step_model_does_not_time_is_refused():
    tp = dict(recompute="full", tensor_parallel=2)
    # a shard group is timed as the planner times it (test_planner.py: every row's run); the
    # engine's rule still holds: Megatron-LM shards over the whole data-parallel group
    with pytest.raises(ValueError, match=r"^engine megatron shards in groups smaller than every "
                                         r"GPU at no stage"):
        estimate("llama-2-7b", 16, **tp, stages=(1,), shard_group=4, **COMMON)
    # ZeRO++'s hpZ is not in the planner's step model
    with pytest.raises(ValueError, match=r"^ZeRO\+\+'s hpZ or NVMe offload is not modelled with "
                                         r"model parallelism"):
        estimate("llama-2-7b", 16, **tp, stages=(3,), hpz=True, gpus_per_node=8,
                 **{**COMMON, "engine": "deepspeed"})
    with pytest.raises(ValueError, match="needs a device"):
        estimate("llama-2-7b", 16, **tp, stages=(1,), link="dgx-h100", engine="megatron")
