"""The placement explorer, driven headlessly: its controls, its redraws and its pure texts.
Expected values by hand (mixed-precision Adam, 16 bytes per parameter)."""
from __future__ import annotations

import IPython.display
import pytest

from zerolib.chapter import fast_png
from zerolib.chapter.explorers.placement import (
    PlacementExplorer,
    explorer_figure,
    option_rows,
    options_table_html,
    summary_html,
)
from zerolib.core.catalogue.devices import get_device
from zerolib.core.memory.placement import OPTIONS, TIERS
from zerolib.core.memory.tables import tier_table

GB = 10**9
TiB = 2**40
P70 = 70 * 10**9
A100 = get_device("a100-80gb")


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("display() called from an explorer")
    monkeypatch.setattr(IPython.display, "display", refuse)


@pytest.fixture
def explorer():
    return PlacementExplorer(params=P70, gpus=8, host_memory=TiB)


def test_explorer_starts_at_one_node_and_matches_a_full_render(explorer):
    assert explorer.data.attrs["gpus"] == 8 and explorer.shard_group == 8
    # Drawn as the explorer draws it: narrower than the published figure, its legend below.
    fresh, _ = explorer_figure(tier_table(P70, 8, shard_group=8, gpus_per_node=8), A100, "GB",
                               dpi=explorer.dpi)
    assert bytes(explorer.image.value) == fast_png.IncrementalPng(fresh, []).render()
    assert "1 TiB of CPU memory" in explorer.summary.value


def test_explorer_gpu_change_keeps_the_shard_group_valid_in_one_redraw(explorer):
    explorer.controls["gpus"].value = 64
    assert explorer.redraws == 1 and explorer.shard_group == 64        # "all" stays "all"
    explorer.controls["shard_group"].value = 16
    explorer.controls["gpus"].value = 8
    assert explorer.redraws == 3 and explorer.shard_group == 8         # 16 no longer divides 8
    assert [v for _, v in explorer.controls["shard_group"].options] == [1, 2, 4, 8]
    explorer.controls["gpus"].value = 1024
    assert explorer.shard_group == 1024                                # 8 was "all" of 8
    explorer.controls["shard_group"].value = 4
    explorer.controls["gpus"].value = 16
    assert explorer.shard_group == 4 and explorer.status.value == ""   # 4 divides 16: kept


def test_explorer_every_control_redraws(explorer):
    before = bytes(explorer.image.value)
    for name, value in (("params", 405 * 10**9), ("shard_group", 4), ("gpus_per_node", 4),
                        ("device", "h100-80gb"), ("unit", "GiB"), ("host_memory", 2 * TiB)):
        figure = explorer.figure
        explorer.controls[name].value = value
        assert explorer.figure is figure
        after = bytes(explorer.image.value)
        if name != "host_memory":              # host memory changes the texts, not the bars
            assert after != before, name
        before = after
    assert "2 TiB" in explorer.table.value


def test_explorer_rejects_bad_starting_values():
    for kwargs, says in (({"gpus": 6}, "gpus"), ({"gpus": 8, "shard_group": 3}, "shard_group"),
                         ({"params": 123}, "params"), ({"host_memory": 10}, "host_memory"),
                         ({"gpus_per_node": 3}, "gpus_per_node")):
        with pytest.raises(ValueError, match=says):
            PlacementExplorer(**kwargs)


def test_explorer_texts_are_pure_functions_of_the_table():
    table = tier_table(P70, 8)
    rows = {r["option"]: r for r in option_rows(table, A100, TiB)}
    # 16 B x 70e9 = 1,120 GB per node > 1 TiB = 1,099.5 GB: the host does not fit.
    assert rows["ZeRO-3 + optimizer on CPU"]["cpu_per_node"] == 16 * P70
    assert rows["ZeRO-3 + optimizer on CPU"]["gpu_fits"] and not rows["ZeRO-3 + optimizer on CPU"]["host_fits"]
    summary = summary_html(table, A100, "GB", TiB)
    assert "Only the GPU fits" in summary and "ZeRO-3 + optimizer on CPU" in summary
    # Which engine's options these are, and that no engine's schedule (no time) enters.
    assert ("The options are DeepSpeed 0.19.8's (offload_optimizer, offload_param, ZeRO++'s "
            "hpZ); no step time, so no engine's schedule enters.") in summary
    html = options_table_html(table, A100, "GB", TiB)
    assert html.count("<tr>") == len(OPTIONS) + 1 and "1,120 GB" in html
    assert set(TIERS) == {"gpu", "cpu", "nvme"}


def test_explorer_first_image_is_stable_and_device_and_unit_are_checked():
    # Re-executed notebooks save the same widget state only if the first image is stable.
    first, second = PlacementExplorer(gpus=8), PlacementExplorer(gpus=8)
    assert bytes(first.image.value) == bytes(second.image.value)
    first.controls["unit"].value = "GiB"
    assert bytes(first.image.value) == fast_png.IncrementalPng(first.figure).render()
    with pytest.raises(ValueError, match="device must be one of"):
        PlacementExplorer(device="tpu")
    with pytest.raises(ValueError, match="unit must be one of GB, GiB"):
        PlacementExplorer(unit="MB")
