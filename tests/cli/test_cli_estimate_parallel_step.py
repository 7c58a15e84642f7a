"""``zerolib estimate --link`` with --context-parallel / --expert-parallel: the planner's step
time, in the table, the CSV and the JSON; what it does not time is one line, exit 2."""
from __future__ import annotations

import json

import pytest
from cli_support import run

from zerolib.core.planner import plan

CP = ("estimate", "--model", "llama-2-7b", "--gpus", "16", "--seq", "32768", "--recompute", "full",
      "--context-parallel", "4", "--device", "h100-80gb", "--link", "dgx-h100", "--engine",
      "megatron", "--stage", "1")


def test_json_step_is_the_plans(capsys):
    code, out, _ = run(capsys, *CP, "--format", "json")
    assert code == 0
    step = json.loads(out)["stages"][0]["parallel_step"]
    frame = plan("llama-2-7b", 16, 8, "h100-80gb", 32_768, 4, links="dgx-h100", engine="megatron",
                 recompute=("full",), stages=(1,), max_micro_batch=1, context_parallel=(4,)).valid
    row = frame[(frame.tensor_parallel == 1) & (frame.pipeline_parallel == 1)]
    assert int(row.micro_batches.iloc[0]) == 1     # 4 sequences on d = 4, one each
    assert step["step_seconds"] == pytest.approx(float(row.step_seconds.iloc[0]), rel=1e-12)


def test_table_and_csv_show_the_parts(capsys):
    code, out, _ = run(capsys, *CP)
    assert code == 0
    assert "Step timed as zerolib plan times it (C = 4): on dgx-h100, engine megatron" in out
    assert "context [s]" in out and "step [s]" in out
    code, out, _ = run(capsys, *CP, "--format", "csv")
    header = out.splitlines()[0].split(",")
    assert code == 0 and header[-2:] == ["step_seconds", "network_wait_fraction"]
    assert "context_seconds" in header and "expert_seconds" in header


def test_run_cost_uses_the_step(capsys):
    code, out, _ = run(capsys, *CP, "--tokens", "1T", "--format", "json")
    result = json.loads(out)
    assert code == 0
    # tokens per step: 8,192 per GPU (32,768 / 4) x 16 GPUs = 131,072
    assert result["run"]["tokens_per_step"] == 131_072
    assert result["stages"][0]["run"]["seconds"] == pytest.approx(
        result["run"]["steps"] * result["stages"][0]["parallel_step"]["step_seconds"])


@pytest.mark.parametrize("extra, words", [
    (("--qwz",), "qwz is not modelled with model parallelism (tensor, pipeline, context or expert) and a link"),
    (("--tokens-per-gpu", "4096"), "tokens_per_gpu is not modelled with model parallelism"),
])
def test_what_it_does_not_time_is_one_line(capsys, extra, words):
    code, out, err = run(capsys, *CP, *extra)
    assert code == 2 and out == ""
    assert words in err and len(err.strip().splitlines()) == 1
