"""Issue 24, item 4: ``estimate`` refuses, by the planner's rule and in its words, what the
planner rejects."""
from __future__ import annotations

import pytest
from cli_support import estimate_json, run

from zerolib.core.planner import RULES


@pytest.mark.parametrize("argv, rule", [
    (["--tensor-parallel", "2", "--sequence-parallel", "--seq", "4097"], "sequence"),
    (["--pipeline-parallel", "2", "--stage", "3"], "pipeline_zero"),
    (["--pipeline-parallel", "2", "--stage", "2"], "pipeline_zero"),
    (["--pipeline-parallel", "2", "--offload-params", "cpu"], "pipeline_zero"),
    (["--tensor-parallel", "8", "--gpus-per-node", "4", "--shard-group", "1"], "node"),
])
def test_estimate_refuses_what_the_planner_rejects(capsys, argv, rule):
    status, out, err = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8", *argv)
    assert (status, out) == (2, "")
    assert err.startswith(f"zerolib estimate: error: {RULES[rule]}: "), err


def test_the_same_setting_is_rejected_by_the_planner_by_that_rule(capsys):
    status, out, err = run(capsys, "plan", "--model", "llama-2-7b", "--gpus", "2",
                           "--gpus-per-node", "2", "--device", "h100-80gb", "--seq", "4097",
                           "--global-batch", "2", "--sequence-parallel", "on", "--format", "json")
    import json
    rejected = {row["rule"] for row in json.loads(out)["rejected"]}
    assert "sequence" in rejected


def test_a_pipeline_shows_only_the_stages_that_run_with_it(capsys):
    result = estimate_json(capsys, "--model", "llama-2-7b", "--gpus", "8",
                           "--pipeline-parallel", "2")
    assert [row["stage"] for row in result["stages"]] == [0, 1]
    status, out, _ = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8",
                         "--pipeline-parallel", "2")
    assert status == 0 and "ZeRO stages 2 and 3 do not run with it" in out


def test_a_sequence_the_degree_divides_still_runs(capsys):
    result = estimate_json(capsys, "--model", "llama-2-7b", "--gpus", "8", "--tensor-parallel",
                           "2", "--sequence-parallel", "--seq", "4096", "--stage", "1")
    assert result["tensor_parallel"] == 2
