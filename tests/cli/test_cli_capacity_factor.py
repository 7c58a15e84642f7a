"""``--capacity-factor`` on ``estimate`` and ``plan``: said in the JSON, carried to the
activations, and refused in one line where it would change nothing or is not a factor."""
from __future__ import annotations

import json

import pytest
from cli_support import estimate_json, run
from conftest import REPO

MIXTRAL = str(REPO / "tests" / "data" / "mixtral-8x7b-v0.1.json")
PLAN = ("--gpus", "64", "--gpus-per-node", "8", "--device", "h100-80gb", "--seq", "4096",
        "--global-batch", "512", "--format", "json")


def test_estimate_states_the_factor_and_grows_the_expert_buffers(capsys):
    common = ("--config", MIXTRAL, "--gpus", "8", "--seq", "4096", "--stage", "3")
    dropless, padded = estimate_json(capsys, *common), estimate_json(capsys, *common, "--capacity-factor", "1.25")
    assert dropless["working_set_settings"]["capacity_factor"] is None
    assert padded["working_set_settings"]["capacity_factor"] == 1.25
    # 32 layers; each expert holds ceil(1.25 x 2 x 4,096 / 8) = 1,280 slots, 10,240 for the 8
    # against 8,192 dropless: 2,048 more token rows in the expert input and output (4,096 wide)
    # and in the gated MLP's four 14,336-wide tensors, 2 bytes each.
    grown = 32 * (2 * 2 * 2048 * 4096 + 4 * 2 * 2048 * 14336)
    before, after = (r["stages"][0]["working_set"]["activations"] for r in (dropless, padded))
    assert after - before == grown


def test_plan_states_the_factor(capsys):
    status, out, err = run(capsys, "plan", "--config", MIXTRAL, *PLAN, "--capacity-factor", "2")
    assert status == 0 and err == ""
    assert json.loads(out)["settings"]["capacity_factor"] == 2.0


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_a_dense_model_refuses_it_in_one_line(capsys, command):
    argv = ("--model", "llama-2-7b", "--gpus", "8") if command == "estimate" else (
        "--model", "llama-2-7b", *PLAN)
    status, out, err = run(capsys, command, *argv, "--capacity-factor", "1.25")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--capacity-factor needs a model with experts (llama-2-7b is dense" in err


@pytest.mark.parametrize("bad", ["0.5", "65", "abc", "nan", "inf"])
def test_a_bad_factor_is_refused_in_one_line(capsys, bad):
    status, out, err = run(capsys, "estimate", "--config", MIXTRAL, "--gpus", "8", "--capacity-factor", bad)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--capacity-factor must be a number from 1 to 64" in err
