"""``zerolib estimate --link`` with a shard group, hpZ, ZeRO++'s quantised collectives and
offload: the communication object's new keys beside the old ones, the table and CSV columns,
one-line errors. Expected values worked out by hand."""
import csv
import io

import pytest
from cli_support import estimate_json, run

COMMUNICATION_KEYS = {"collectives", "sent_bytes", "received_bytes", "communication_seconds",
                      "compute_seconds", "exposed_seconds", "step_seconds",
                      "network_wait_fraction"}
NEW_KEYS = {"shard_group", "replicas", "qwz", "qgz", "cross_node_bytes", "host_seconds",
            "schedule", "host", "cpu_step_seconds"}


def test_a_shard_group_is_timed_on_its_links(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--link", "dgx-h100",
                     "--link-efficiency", "line-rate", "--shard-group", "8", "--stage", "2",
                     "--device", "h100-80gb", "--engine", "paper")
    (row,) = result["stages"]
    c = row["communication"]
    assert set(c) == COMMUNICATION_KEYS | NEW_KEYS
    assert set(c["collectives"]) == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}
    # Shards of 875e6 elements in groups of 8 (one node each), 8 replicas.
    assert (c["shard_group"], c["replicas"]) == (8, 8)
    assert c["collectives"]["reduce_scatter"]["sent_bytes"] == 12_250_000_000
    assert c["collectives"]["all_reduce"]["sent_bytes"] == 3_062_500_000
    assert c["collectives"]["all_gather"]["sent_bytes"] == 12_250_000_000
    assert c["sent_bytes"] == 27_562_500_000
    assert c["cross_node_bytes"] == 8 * 3_062_500_000
    assert [(e["name"], e["link"], e["ring_gpus"]) for e in c["schedule"]] == [
        ("gradient_reduce_scatter", "nvlink4", 8), ("replica_all_reduce", "ib-ndr", 8),
        ("parameter_all_gather", "nvlink4", 8)]
    # 50 GB/s for each of the node's 8 replica rings (8 NDR ports of 50 GB/s shared).
    assert c["schedule"][1]["bus_bandwidth"] == 50e9
    assert c["host"] is None and c["host_seconds"] == 0.0


def test_zeropp_flags_default_to_stage_3(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--link", "dgx-h100", "--hpz",
                     "--qwz", "--qgz")
    assert [row["stage"] for row in result["stages"]] == [3]
    c = result["stages"][0]["communication"]
    assert c["qwz"] and c["qgz"]
    names = [e["name"] for e in c["schedule"]]
    assert names == ["forward_all_gather", "backward_all_gather", "gradient_all_to_all_node",
                     "gradient_all_to_all_nodes"]
    # qwZ: the forward gather over 64 in 8 bits: 63 x 109,375,000 x 1 B, all of it across
    # nodes. qgZ across the 8 nodes: 8 GPUs x 7 x ceil(875e6 / 8) x 0.5 B leave each node.
    assert c["schedule"][0]["cross_node_bytes"] == 63 * 109_375_000
    assert c["schedule"][3]["cross_node_bytes"] == 8 * 7 * 109_375_000 // 2
    assert c["schedule"][1]["cross_node_bytes"] == 0     # hpZ: inside the node


def test_offload_reports_the_host_link(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "8", "--link", "dgx-h100",
                     "--offload-optimizer", "cpu", "--stage", "2", "--host-link", "pcie5-x16")
    host = result["stages"][0]["communication"]["host"]
    assert (host["link"], host["bandwidth"]) == ("pcie5-x16", 63_000_000_000)
    # The 875e6-element partition's 16-bit gradients down, its parameters up.
    assert host["to_host_bytes"] == host["to_gpu_bytes"] == 1_750_000_000
    assert [t["name"] for t in host["transfers"]] == ["gradients_down", "parameters_up_after_step"]


def test_table_and_csv_columns(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--link",
                         "dgx-h100", "--shard-group", "8", "--engine", "paper")
    assert status == 0 and "leaves node [GB]" in out and "24.50" in out
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--link",
                         "dgx-h100", "--format", "csv")
    assert "leaves node" not in out
    header = out.splitlines()[0].split(",")
    # The earlier columns keep their places; the new ones come last, before what a model-state
    # answer leaves out.
    assert header[-11:-3] == ["all_to_all_calls", "all_to_all_handed_bytes", "all_to_all_sent_bytes",
                              "shard_group", "replicas", "cross_node_bytes", "host_seconds",
                              "cpu_step_seconds"]
    assert header[-12] == "network_wait_fraction"
    assert header[-3:] == ["fits_judges", "leaves_out", "working_set_needs"]
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[3]["cross_node_bytes"] == "41343750000" and rows[3]["replicas"] == "1"


@pytest.mark.parametrize("argv, flag", [
    (["--qwz"], "--qwz"),
    (["--host-link", "pcie4-x16"], "--host-link"),
    (["--link", "dgx-h100", "--host-link", "pcie5-x16"], "--host-link"),
    (["--link", "dgx-h100", "--offload-optimizer", "cpu", "--host-link", "nvlink4"], "--host-link"),
    (["--link", "dgx-h100", "--qgz", "--stage", "2"], "stage 3"),
    (["--link", "dgx-h100", "--qwz", "--shard-group", "8"], "every GPU"),
    (["--link", "dgx-h100", "--shard-group", "16", "--gpus-per-node", "6", "--engine", "paper"],
     "divide one another"),
    (["--link", "dgx-h100", "--shard-group", "8", "--stage", "1"], "stages 3"),
    (["--engine", "megatron", "--stage", "2"], "offers ZeRO stages 0, 1"),
])
def test_bad_input_is_one_line(capsys, argv, flag):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "48", *argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err


def test_a_single_link_runs_every_ring_alike(capsys):
    # ib-ndr joins every GPU alike (no nodes): any group that divides the GPUs, every ring at
    # one port's 50 GB/s, nothing counted as leaving a node.
    result = estimate_json(capsys, "--params", "7B", "--gpus", "48", "--link", "ib-ndr",
                     "--link-efficiency", "line-rate", "--shard-group", "12", "--stage", "3")
    c = result["stages"][0]["communication"]
    assert c["cross_node_bytes"] is None and (c["shard_group"], c["replicas"]) == (12, 4)
    assert {e["link"] for e in c["schedule"]} == {"ib-ndr"}
    assert {e["bus_bandwidth"] for e in c["schedule"]} == {50e9}
