"""``--link-efficiency`` on ``zerolib estimate`` and ``zerolib plan``: achieved (the default),
line-rate or a fraction; the JSON and the text say which was used; bad input is one line and
exit status 2. Expected rates from the catalogue's cited figures: NVLink 4 370 of 450 GB/s, an NDR
port 48 of 50 GB/s (DGX H100 across nodes: min(370, 8 x 48) = 370; at line rate min(450, 400)).
"""
import json

import pytest
from cli_support import estimate_json, run

GB = 10**9
PLAN = ("plan", "--model", "llama-2-7b", "--gpus", "16", "--gpus-per-node", "8",
        "--device", "h100-80gb", "--seq", "4096", "--global-batch", "16", "--stages", "0",
        "--recompute", "none", "--chunks", "1", "--max-micro-batch", "1")


@pytest.mark.parametrize("given, name, bandwidth", [
    ((), "achieved", 370 * GB), (("--link-efficiency", "achieved"), "achieved", 370 * GB),
    (("--link-efficiency", "line-rate"), "line-rate", 400 * GB),
    # 0.8 x 450 = 360 inside, 8 x 0.8 x 50 = 320 across: 320.
    (("--link-efficiency", "0.8"), "0.8", 320 * GB),
    (("--link-efficiency", "80%"), "0.8", 320 * GB)])
def test_estimate_json_says_which_efficiency(capsys, given, name, bandwidth):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--link", "dgx-h100", *given)
    assert result["interconnect"]["link_efficiency"] == name
    assert result["interconnect"]["bus_bandwidth"] == bandwidth
    assert result["interconnect"]["intra"]["achieved_bandwidth"] == 370 * GB


def test_estimate_table_names_it(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--link", "ib-ndr")
    assert status == 0
    assert "bus bandwidth 48.0 GB/s per GPU and direction (the links at the bus bandwidth NCCL " \
           "reaches)" in out
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--link", "ib-ndr",
                         "--link-efficiency", "line-rate")
    assert "bus bandwidth 50.0 GB/s per GPU and direction (the links at line rate)" in out
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--link", "ib-ndr",
                         "--link-efficiency", "0.5")
    assert "bus bandwidth 25.0 GB/s per GPU and direction (the links at 0.5 of line rate)" in out


@pytest.mark.parametrize("argv, message", [
    (("--link-efficiency", "0.8"), "--link-efficiency needs --link"),
    (("--link", "dgx-h100", "--link-efficiency", "1.5"),
     "--link-efficiency must be achieved or ring or line-rate or a fraction above 0 and at most 1, got "
     "'1.5'"),
    (("--link", "dgx-h100", "--link-efficiency", "fast"), "--link-efficiency must be"),
    (("--link", "dgx-h100", "--link-efficiency", "0"), "--link-efficiency must be")])
def test_estimate_refuses_in_one_line(capsys, argv, message):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "64", *argv)
    assert status == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plan_json_and_table_say_which_efficiency(capsys):
    status, out, _ = run(capsys, *PLAN, "--format", "json")
    assert status == 0
    assert json.loads(out)["settings"]["links"]["link_efficiency"] == "achieved"
    status, out, _ = run(capsys, *PLAN, "--link-efficiency", "line-rate", "--format", "json")
    assert json.loads(out)["settings"]["links"]["link_efficiency"] == "line-rate"
    status, out, _ = run(capsys, *PLAN, "--link-efficiency", "0.9")
    assert status == 0 and "the links at 0.9 of line rate" in out


def test_plan_refuses_a_bad_efficiency_in_one_line(capsys):
    status, out, err = run(capsys, *PLAN, "--link-efficiency", "2")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--link-efficiency must be" in err
