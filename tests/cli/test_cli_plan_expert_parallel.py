"""zerolib plan --expert-parallel LIST and --context-parallel LIST: the degrees searched, shown
as columns of the table and the CSV only when searched, and one-line errors."""
from __future__ import annotations

import csv
import io

from cli_support import run

BASE = ("plan", "--model", "mixtral-8x7b", "--gpus", "32", "--gpus-per-node", "8", "--device",
        "h100-80gb", "--seq", "1024", "--global-batch", "32", "--stages", "1", "--recompute", "none",
        "--chunks", "1", "--offload", "none", "--max-micro-batch", "1")


def test_expert_parallel_list_becomes_a_column(capsys):
    status, out, _ = run(capsys, *BASE, "--expert-parallel", "1,8", "--format", "csv")
    assert status == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {row["expert_parallel"] for row in rows} <= {"1", "8"} and rows
    assert "context_parallel" not in rows[0] and "expert_seconds" in rows[0]
    status, out, _ = run(capsys, *BASE, "--expert-parallel", "1,8")
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert header.split()[:6] == ["rank", "t", "SP", "E", "ETP", "p"]   # ETP: a mixture of experts


def test_both_degrees_searched(capsys):
    # Under Megatron-LM's rules: it runs ring attention (--context-parallel-size) and ZeRO-1.
    status, out, _ = run(capsys, *BASE, "--expert-parallel", "2", "--context-parallel", "1,2",
                         "--flash", "--engine", "megatron", "--format", "csv")
    assert status == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert {row["context_parallel"] for row in rows} == {"1", "2"}
    assert {row["expert_parallel"] for row in rows} == {"2"}
    status, out, _ = run(capsys, *BASE, "--expert-parallel", "2", "--context-parallel", "1,2",
                         "--flash", "--engine", "megatron")
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert header.split()[:7] == ["rank", "t", "SP", "C", "E", "ETP", "p"]


def test_a_dense_model_without_experts_is_a_line(capsys):
    status, out, err = run(capsys, "plan", "--model", "llama-2-7b", *BASE[3:], "--expert-parallel", "2")
    assert status == 2 and out == ""
    assert err.strip().count("\n") == 0
    assert "expert_parallel above 1 needs a mixture of experts; llama-2-7b has no experts" in err


def test_a_bad_list_is_a_line(capsys):
    for value in ("1,,2", "x", "0"):
        status, out, err = run(capsys, *BASE, "--expert-parallel", value)
        assert status == 2 and out == "" and err.strip().count("\n") == 0, value
        assert "--expert-parallel" in err, value


def test_estimate_with_a_link_times_experts_as_the_plan_does(capsys):
    # refused before; now timed by the planner's step model, which needs the device
    status, out, err = run(capsys, "estimate", "--model", "mixtral-8x7b", "--gpus", "8",
                           "--expert-parallel", "2", "--link", "dgx-h100")
    assert status == 2 and out == "" and err.strip().count("\n") == 0
    assert "a link with model parallelism (tensor, pipeline, context or expert) needs a device" in err
