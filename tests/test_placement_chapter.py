"""The chapter's placement pieces: the group-size and tier tables, their charts, the conventions
chart and the placement explorer (driven headlessly). Expected values by hand (mixed-precision
Adam, 16 bytes per parameter)."""
from __future__ import annotations

import IPython.display
import numpy as np
import pytest

from zerolib.chapter import fast_png
from zerolib.chapter.charts.conventions import conventions_figure
from zerolib.chapter.charts.group_size import group_size_figure, update_group_size
from zerolib.chapter.charts.offload_tiers import (
    offload_tiers_figure,
    params_words,
    update_offload_tiers,
)
from zerolib.chapter.explorers.placement import (
    PlacementExplorer,
    explorer_figure,
    option_rows,
    options_table_html,
    summary_html,
)
from zerolib.chapter.style import render_png
from zerolib.core.devices import get_device
from zerolib.core.placement import OPTIONS, TIERS
from zerolib.core.tables import divisors, group_size_table, tier_table
from zerolib.crosscheck.conventions.side_by_side import model_state_by_convention

GB = 10**9
TiB = 2**40
P70 = 70 * 10**9
A100 = get_device("a100-80gb")


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("display() called from an explorer")
    monkeypatch.setattr(IPython.display, "display", refuse)


# --- tables ----------------------------------------------------------------------------------

def test_divisors():
    assert divisors(64) == [1, 2, 4, 8, 16, 32, 64]
    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1]
    with pytest.raises(ValueError, match="gpus"):
        divisors(0)


def test_group_size_table_by_hand():
    table = group_size_table(P70, 64, [1, 3])
    stage3 = table[table["stage"] == 3].set_index("shard_group")
    # 16 B x 70e9 / G for G = 1 ... 64.
    assert stage3["total"].tolist() == [16 * P70 // g for g in (1, 2, 4, 8, 16, 32, 64)]
    assert stage3["replicas"].tolist() == [64, 32, 16, 8, 4, 2, 1]
    stage1 = table[table["stage"] == 1].set_index("shard_group")
    assert stage1.loc[8, "total"] == 4 * P70 + 12 * P70 // 8
    assert (table["cluster_total"] == 64 * table["total"]).all()
    assert group_size_table(P70, 64, [3], shard_groups=[4, 16])["shard_group"].tolist() == [4, 16]
    with pytest.raises(ValueError, match="shard_group must divide gpus"):
        group_size_table(P70, 64, [3], shard_groups=[3])


def test_tier_table_by_hand():
    table = tier_table(P70, 8)
    assert list(dict.fromkeys(table["option"])) == [o.name for o in OPTIONS]
    got = table.set_index(["option", "tier"])
    # ZeRO-3 + optimizer on CPU, one node of 8: GPU 2 B x 70e9 / 8; host 16 B x 70e9 / 8 each.
    assert got.loc[("ZeRO-3 + optimizer on CPU", "gpu"), "bytes"] == 2 * P70 // 8
    assert got.loc[("ZeRO-3 + optimizer on CPU", "cpu"), "per_node"] == 16 * P70
    assert got.loc[("ZeRO-2", "gpu"), "bytes"] == 2 * P70 + 14 * P70 // 8
    assert table["offered"].all() and table.attrs["gpus_on_node"] == 8
    grouped = tier_table(P70, 64, shard_group=16).set_index(["option", "tier"])
    assert not grouped.loc[("ZeRO-3 + hpZ copy (ZeRO++)", "gpu"), "offered"]
    assert "shard group to be every GPU" in grouped.loc[("ZeRO-3 + hpZ copy (ZeRO++)", "gpu"), "note"]
    assert grouped.loc[("ZeRO-3", "gpu"), "bytes"] == 16 * P70 // 16
    with pytest.raises(ValueError, match="shard_group must divide gpus"):
        tier_table(P70, 64, shard_group=3)
    with pytest.raises(ValueError, match="fill whole nodes"):
        tier_table(P70, 12)


# --- charts -----------------------------------------------------------------------------------

def test_params_words():
    assert [params_words(p) for p in (70 * 10**9, 68_976_648_192, 1_500 * 10**9)] == ["70B", "69.0B",
                                                                                     "1.5T"]


def test_group_size_chart_draws_the_table_and_updates_in_place():
    table = group_size_table(P70, 64)
    figure, artists = group_size_figure(table, A100, "GB")
    x, y = artists.lines[3].get_data()
    assert list(x) == divisors(64) and np.allclose(y, [16 * P70 / g / GB for g in divisors(64)])
    assert artists.device_line.get_ydata()[0] == pytest.approx(80 * 2**30 / GB)
    assert artists.end_labels[3].get_text() == "17.5 GB"
    line = artists.lines[3]
    update_group_size(artists, group_size_table(P70, 16), A100, "GiB")
    assert artists.lines[3] is line and list(line.get_xdata()) == [1, 2, 4, 8, 16]
    assert artists.ax.get_ylabel() == "Model state per GPU [GiB]"
    assert render_png(figure) == render_png(figure)


def test_offload_chart_stacks_tiers_and_judges_the_gpu():
    table = tier_table(P70, 8)
    figure, artists = offload_tiers_figure(table, A100, "GB")
    index = artists.options.index("ZeRO-3 + optimizer on CPU")
    gpu, cpu = artists.bars["gpu"][index], artists.bars["cpu"][index]
    assert gpu.get_height() == pytest.approx(2 * P70 / 8 / GB)        # 17.5
    assert cpu.get_y() == pytest.approx(gpu.get_height())              # stacked on the GPU part
    assert cpu.get_height() == pytest.approx(16 * P70 / 8 / GB)        # 140
    assert artists.gpu_labels[index].get_text() == "GPU 17.5 GB"
    assert artists.verdict_labels[index].get_text() == "fits"
    zero3 = artists.options.index("ZeRO-3")
    assert artists.verdict_labels[zero3].get_text() == "too big"      # 140 GB > 85.9 GB
    grouped = tier_table(P70, 64, shard_group=16)
    with pytest.raises(ValueError, match="options"):
        update_offload_tiers(artists, grouped.iloc[:-3].copy(), A100, "GB")
    update_offload_tiers(artists, grouped, get_device("h200-141gb"), "GB")
    hpz = artists.options.index("ZeRO-3 + hpZ copy (ZeRO++)")
    assert artists.verdict_labels[hpz].get_text() == "not offered"
    assert artists.bars["gpu"][hpz].get_height() == 0
    assert "shard group 16" in artists.title.get_text()


def test_conventions_chart_draws_each_convention_where_defined():
    table = model_state_by_convention("llama-3-8b", 8)
    figure, artists = conventions_figure(table, "GB")
    assert len(artists.bars["Megatron-LM"]) == 2 and len(artists.bars["ZeRO paper (the chapter)"]) == 4
    heights = [b.get_height() for b in artists.bars["ZeRO paper (the chapter)"]]
    expected = table[table["convention"] == "ZeRO paper (the chapter)"]["bytes"] / GB
    assert np.allclose(heights, expected)
    assert "llama-3-8b on 8 data-parallel GPUs" in artists.title.get_text()
    assert render_png(figure) == render_png(figure)


# --- the explorer -------------------------------------------------------------------------------

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
