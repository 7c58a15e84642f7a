"""``--leaf-nodes`` and ``--oversubscription`` on ``zerolib estimate`` and ``zerolib plan`` (and
the run file's keys). Expected by hand (data/ring_at_scale.md): 64 DGX H100 nodes on leaves of 32
behind a 2:1 spine, min(370, 8 x 48 / 2) = 192 GB/s; 32 nodes, one leaf: 370.
"""
import json

import pytest
from cli_support import estimate_json, run

GB = 10**9
FABRIC = ("--leaf-nodes", "32", "--oversubscription", "2:1")
PLAN = ("plan", "--model", "llama-2-7b", "--gpus", "512", "--gpus-per-node", "8",
        "--device", "h100-80gb", "--seq", "4096", "--global-batch", "512", "--stages", "0",
        "--recompute", "none", "--chunks", "1", "--max-micro-batch", "1")


@pytest.mark.parametrize("gpus, given, bandwidth", [
    ("512", (), 370), ("512", FABRIC, 192), ("256", FABRIC, 370),
    ("512", ("--leaf-nodes", "32", "--oversubscription", "4"), 96),
    ("512", ("--leaf-nodes", "32"), 370)])
def test_estimate_json_carries_the_fabric(capsys, gpus, given, bandwidth):
    result = estimate_json(capsys, "--params", "7B", "--gpus", gpus, "--link", "dgx-h100", *given)
    assert result["interconnect"]["bus_bandwidth"] == bandwidth * GB


def test_estimate_table_names_it(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "512", "--link", "dgx-h100",
                         *FABRIC)
    assert status == 0
    assert ("bus bandwidth 192.0 GB/s per GPU and direction (the links at the bus bandwidth NCCL "
            "reaches; 32 nodes per rail leaf, spine 2:1 beyond)") in out


@pytest.mark.parametrize("argv, message", [
    (("--oversubscription", "2"), "--oversubscription needs --link"),
    (("--link", "dgx-h100", "--oversubscription", "0.5"), "--oversubscription must be a number from 1 to 64"),
    (("--link", "dgx-h100", "--oversubscription", "2:3"), "--oversubscription must be"),
    (("--link", "dgx-h100", "--oversubscription", "9" * 5000), "--oversubscription must be"),
    (("--link", "dgx-h100", "--oversubscription", "nan"), "--oversubscription must be"),
    (("--link", "dgx-h100", "--leaf-nodes", "0"), "--leaf-nodes must be"),
    (("--link", "dgx-h100", "--leaf-nodes", "many"), "--leaf-nodes must be")])
def test_estimate_refuses_in_one_line(capsys, argv, message):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "64", *argv)
    assert status == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plan_takes_the_fabric(capsys):
    status, out, _ = run(capsys, *PLAN, *FABRIC, "--format", "json")
    assert status == 0
    links = json.loads(out)["settings"]["links"]
    assert (links["leaf_nodes"], links["oversubscription"]) == (32, 2.0)
    status, out, _ = run(capsys, *PLAN, *FABRIC)
    assert status == 0 and "32 nodes per rail leaf, spine 2:1 beyond" in out
    status, out, err = run(capsys, *PLAN, "--oversubscription", "0")
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--oversubscription must be" in err


def test_a_run_file_carries_the_keys(capsys, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nparams = 7000000000\n\n[cluster]\ngpus = 512\nlink = "dgx-h100"\n'
                    'leaf_nodes = 32\noversubscription = 2\n')
    result = estimate_json(capsys, "--run", str(path))
    assert result["interconnect"]["bus_bandwidth"] == 192 * GB
    path.write_text('[model]\nparams = 7000000000\n\n[cluster]\ngpus = 512\nlink = "dgx-h100"\n'
                    'oversubscription = 0.5\n')
    status, out, err = run(capsys, "estimate", "--run", str(path), "--format", "json")
    assert status == 2 and "cluster.oversubscription" in err and len(err.strip().splitlines()) == 1
