"""The placement charts: the group-size and offload-tier charts and the conventions chart draw
their tables and update in place. Expected values by hand (mixed-precision Adam, 16 bytes per
parameter)."""
from __future__ import annotations

import numpy as np
import pytest

from zerolib.chapter.charts.conventions import conventions_figure
from zerolib.chapter.charts.group_size import group_size_figure, update_group_size
from zerolib.chapter.charts.offload_tiers import (
    offload_tiers_figure,
    params_words,
    update_offload_tiers,
)
from zerolib.chapter.style import render_png
from zerolib.core.catalogue.devices import get_device
from zerolib.core.memory.tables import divisors, group_size_table, tier_table
from zerolib.crosscheck.conventions.side_by_side import model_state_by_convention

GB = 10**9
P70 = 70 * 10**9
A100 = get_device("a100-80gb")


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
