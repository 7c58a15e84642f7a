"""``--host`` and ``--cpu-adam-rate`` on ``zerolib estimate`` and ``zerolib plan``: what the JSON
and table say was assumed, and one-line errors (exit 2) for what they cannot change."""
import json

import pytest
from cli_support import estimate_json, run

LLAMA_2_70B = 68_976_648_192
BASE = ("--model", "llama-2-70b", "--gpus", "8", "--recompute", "full", "--device", "a100-80gb",
        "--stage", "3", "--link", "dgx-a100")
PLAN = ("plan", "--model", "llama-2-7b", "--gpus", "8", "--gpus-per-node", "8", "--device",
        "h100-80gb", "--seq", "4096", "--global-batch", "64", "--max-micro-batch", "1",
        "--host-memory", "2TiB", "--format", "json")


def test_estimate_json_says_which_host_and_times_its_cpu_step(capsys):
    result = estimate_json(capsys, *BASE, "--offload-optimizer", "cpu")
    c = result["stages"][0]["communication"]
    # The link's node is a DGX A100: its CPUs, 30 B x 68,976,648,192 / 409.6e9 B/s.
    assert c["host"]["host_settings"]["host"]["name"] == "dgx-a100"
    assert c["host"]["host_settings"]["cpu_step_basis"] == "roofline"
    assert c["cpu_step_seconds"] == pytest.approx(30 * LLAMA_2_70B / 409.6e9, rel=1e-12)
    named = estimate_json(capsys, *BASE, "--offload-optimizer", "cpu", "--host", "DGX-H100",
                          "--cpu-adam-rate", "5e9")
    c = named["stages"][0]["communication"]
    assert c["host"]["host_settings"]["host"]["name"] == "dgx-h100"
    assert c["host"]["host_settings"]["cpu_adam_rate"] == 5e9
    # 5e9 parameters per second for the node: 68,976,648,192 / 5e9 = 13.795 s, above the
    # DGX H100's 3.368 s roofline.
    assert c["cpu_step_seconds"] == pytest.approx(LLAMA_2_70B / 5e9, rel=1e-12)
    assert c["host"]["cpu_step"]["roofline_seconds"] == pytest.approx(30 * LLAMA_2_70B / 614.4e9)


def test_estimate_table_and_csv_show_the_cpu_step(capsys):
    status, out, err = run(capsys, "estimate", *BASE, "--offload-optimizer", "cpu")
    assert status == 0 and err == ""
    lines = out.splitlines()
    header = next(line for line in lines if "CPU step [s]" in line)
    row = lines[lines.index(header) + 2]
    # The column's right edge lines up with its value's (the table right-aligns numbers).
    end = header.index("CPU step [s]") + len("CPU step [s]")
    assert row[end - len("5.052"):end] == "5.052"
    status, out, err = run(capsys, "estimate", *BASE, "--offload-optimizer", "cpu",
                           "--format", "csv")
    lines = out.splitlines()
    column = lines[0].split(",").index("cpu_step_seconds")
    assert float(lines[1].split(",")[column]) == pytest.approx(5.0520006, rel=1e-7)


@pytest.mark.parametrize("extra, message", [
    (("--host", "dgx-h100"), "--host needs an offload"),
    (("--cpu-adam-rate", "2e9"), "--cpu-adam-rate needs an offloaded optimizer"),
    (("--offload-params", "cpu", "--cpu-adam-rate", "2e9"),
     "--cpu-adam-rate needs an offloaded optimizer"),
    (("--offload-optimizer", "cpu", "--host", "epyc"),
     "--host must be one of dgx-a100, dgx-h100, got 'epyc'"),
    (("--offload-optimizer", "cpu", "--cpu-adam-rate", "0"),
     "--cpu-adam-rate must be a positive whole number, got '0'"),
    (("--offload-optimizer", "cpu", "--cpu-adam-rate", "fast"),
     "--cpu-adam-rate must be parameters per second like 2e9"),
])
def test_estimate_refuses_in_one_line(capsys, extra, message):
    status, out, err = run(capsys, "estimate", *BASE, *extra)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_estimate_host_needs_a_link(capsys):
    status, _, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--stage", "3",
                         "--offload-optimizer", "cpu", "--host", "dgx-h100")
    assert status == 2 and "--host needs --link" in err and len(err.strip().splitlines()) == 1


def test_plan_json_says_which_host(capsys):
    status, out, err = run(capsys, *PLAN)
    assert status == 0, err
    settings = json.loads(out)["settings"]
    # The H100's node is a DGX H100: its own CPUs by default.
    assert settings["host_settings"]["host"]["name"] == "dgx-h100"
    assert settings["host_settings"]["cpu_adam_rate"] is None
    status, out, err = run(capsys, *PLAN, "--host", "dgx-a100", "--cpu-adam-rate", "3B")
    assert status == 0, err
    settings = json.loads(out)["settings"]["host_settings"]
    assert settings["host"]["name"] == "dgx-a100" and settings["cpu_adam_rate"] == 3e9


def test_plan_refuses_host_flags_without_offload(capsys):
    status, _, err = run(capsys, *PLAN, "--offload", "none", "--cpu-adam-rate", "3e9")
    assert status == 2 and "--cpu-adam-rate needs an offloaded optimizer" in err
    status, _, err = run(capsys, *PLAN, "--offload", "none", "--host", "dgx-h100")
    assert status == 2 and "--host needs an offload" in err
