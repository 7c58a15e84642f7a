"""Issue 24, item 6: ``--gpus-per-node`` above ``--gpus`` has one meaning everywhere (the run's
GPUs sit on one node of that size), and the table says so; a count that does not fill whole
nodes is refused everywhere."""
from __future__ import annotations

import pytest
from cli_support import estimate_json, run

NOTE = ("Node: --gpus-per-node 16 is above --gpus 8: the run's 8 GPUs sit on one node of 16; "
        "only they share its CPU memory and NVMe, and its rings join only them.")


@pytest.mark.parametrize("flags", [["--offload-optimizer", "cpu", "--stage", "2"],
                                   ["--link", "dgx-h100"],
                                   ["--link", "dgx-h100", "--offload-optimizer", "cpu"]])
def test_estimate_says_what_a_larger_node_means(capsys, flags):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8",
                           "--gpus-per-node", "16", *flags)
    assert status == 0, err
    assert out.splitlines()[1] == NOTE


def test_no_note_when_the_run_fills_its_nodes(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "16",
                         "--gpus-per-node", "8", "--offload-optimizer", "cpu", "--stage", "2")
    assert status == 0 and "Node:" not in out


def test_the_json_carries_both_numbers(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "8", "--gpus-per-node", "16",
                           "--link", "dgx-h100", "--offload-optimizer", "cpu", "--stage", "1")
    assert result["gpus"] == 8 and result["interconnect"]["gpus_per_node"] == 16
    assert result["placement"]["gpus_per_node"] == 8      # the run's GPUs on that node


@pytest.mark.parametrize("argv", [
    ["estimate", "--params", "7B", "--gpus", "8", "--gpus-per-node", "3", "--offload-optimizer",
     "cpu"],
    ["plan", "--model", "llama-2-7b", "--gpus", "8", "--gpus-per-node", "3", "--device",
     "h100-80gb", "--seq", "4096", "--global-batch", "8"],
])
def test_a_count_that_does_not_fill_whole_nodes_is_refused_everywhere(capsys, argv):
    status, out, err = run(capsys, *argv)
    assert (status, out) == (2, "") and "must fill whole nodes" in err


def test_plan_says_what_a_larger_node_means(capsys):
    status, out, err = run(capsys, "plan", "--model", "llama-2-7b", "--gpus", "4",
                           "--gpus-per-node", "8", "--device", "h100-80gb", "--seq", "4096",
                           "--global-batch", "8", "--max-micro-batch", "1")
    assert status == 0, err
    assert "The run's 4 GPUs sit on one node of 8 (--gpus-per-node is above --gpus)." in out
