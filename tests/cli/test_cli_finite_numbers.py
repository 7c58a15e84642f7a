"""Issue 24, item 3: every float the command line takes is bounded so that every number it
derives stays finite, and the JSON it writes is standard JSON (no Infinity, no NaN)."""
from __future__ import annotations

import json

import pytest
from cli_support import run

from zerolib.cli._output import json_text


def _strict(text: str):
    """json.loads that refuses the non-standard constants Python's json would accept."""
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


PLAN = ("plan", "--model", "llama-2-7b", "--gpus", "8", "--gpus-per-node", "8", "--device",
        "h100-80gb", "--seq", "4096", "--global-batch", "8", "--max-micro-batch", "1")


@pytest.mark.parametrize("mfu", ["1e-320", "5e-324", "0.0009", "0.0999%"])
def test_estimate_refuses_a_utilisation_too_small_to_keep_times_finite(capsys, mfu):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--link",
                           "dgx-h100", "--device", "h100-80gb", "--mfu", mfu, "--format", "json")
    assert (status, out) == (2, "")
    assert err.startswith("zerolib estimate: error: --mfu must be at least 0.001 (0.1%)")
    assert len(err.splitlines()) == 1


def test_plan_refuses_a_tiny_utilisation_in_one_line(capsys):
    status, out, err = run(capsys, *PLAN, "--mfu", "1e-320")
    assert (status, out) == (2, "")
    assert err.startswith("zerolib plan: error: --mfu must be at least 0.001 (0.1%)")


def test_the_smallest_utilisation_gives_finite_standard_json(capsys):
    # The lowest mfu with the largest count and the most tokens a GPU may take per step on the
    # slowest catalogued device: every time is still a finite number.
    status, out, err = run(capsys, "estimate", "--params", "1e15", "--gpus", "16777216",
                           "--link", "ib-edr", "--device", "t4-16gb", "--mfu", "0.1%",
                           "--tokens-per-gpu", str(2**40), "--format", "json")
    assert status == 0, err
    result = _strict(out)
    assert all(row["communication"]["step_seconds"] > 0 for row in result["stages"])
    status, out, err = run(capsys, *PLAN, "--mfu", "0.001", "--format", "json")
    assert status == 0, err
    assert _strict(out)["fits"]


def test_json_text_writes_null_for_nan_and_refuses_infinity():
    assert json_text({"a": [float("nan"), 1.5]}) == '{\n  "a": [\n    null,\n    1.5\n  ]\n}'
    with pytest.raises(ValueError):
        json_text({"a": float("inf")})
