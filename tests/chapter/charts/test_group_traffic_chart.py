"""The group-size trade figure (zerolib.chapter.charts.group_traffic): it draws what the tables
hold, updates the same artists, renders byte-stably and refuses tables of different settings."""
import numpy as np
import pytest

import zerolib as zl
from zerolib.chapter.charts.group_traffic import group_tradeoff_figure, update_group_traffic
from zerolib.core.memory.tables import group_size_table
from zerolib.core.step.tables import group_traffic_table

GB = 10**9
P7 = zl.parameter_count("llama-2-7b")


@pytest.fixture(scope="module")
def tables():
    traffic = group_traffic_table("llama-2-7b", 64, "dgx-h100", "h100-80gb")
    return group_size_table(P7, 64), traffic


def test_the_figure_draws_the_tables(tables):
    memory, traffic = tables
    figure, (memory_artists, artists) = group_tradeoff_figure(memory, traffic, "h100-80gb")
    stage3 = traffic[traffic["stage"] == 3]
    x, y = artists.crossing[3].get_data()
    assert list(x) == [1, 2, 4, 8, 16, 32, 64]
    assert np.allclose(y, stage3["cross_node_bytes"] / GB)
    assert np.allclose(artists.step[3].get_ydata(), stage3["step_seconds"])
    assert np.allclose(artists.back_to_back[0].get_ydata(),
                       traffic[traffic["stage"] == 0]["communication_seconds"])
    # The compute of (6 x 6,607,343,616 multiplied parameters + 3 x 1,073,741,824 of causal
    # attention core) x 4,096 FLOPs at 40 % of 989.5 TFLOP/s: 0.4436 s, printed as
    # format_value prints it.
    assert artists.compute_line.get_label() == "compute alone (0.44 s)"
    assert memory_artists.end_labels[3].get_text() == "1.68 GB"
    assert artists.traffic_ax.get_ylabel() == "Leaving each node [GB]"
    assert render_twice(figure)


def render_twice(figure) -> bool:
    return zl.render_png(figure) == zl.render_png(figure)


def test_update_keeps_the_artists(tables):
    memory, traffic = tables
    figure, (_, artists) = group_tradeoff_figure(memory, traffic, "h100-80gb")
    line = artists.crossing[3]
    smaller = group_traffic_table("llama-2-7b", 16, "dgx-h100", "h100-80gb")
    update_group_traffic(artists, smaller, "GiB")
    assert artists.crossing[3] is line and list(line.get_xdata()) == [1, 2, 4, 8, 16]
    assert artists.traffic_ax.get_ylabel() == "Leaving each node [GiB]"
    with pytest.raises(ValueError, match="stages"):
        update_group_traffic(artists, group_traffic_table("llama-2-7b", 16, "dgx-h100",
                                                          "h100-80gb", stages=[3]))


def test_tables_of_other_settings_are_refused(tables):
    memory, traffic = tables
    with pytest.raises(ValueError, match="same GPU count"):
        group_tradeoff_figure(group_size_table(P7, 32), traffic)
    with pytest.raises(ValueError, match="same model size"):
        group_tradeoff_figure(group_size_table(7 * 10**9, 64), traffic)
    with pytest.raises(ValueError, match="group_traffic_table"):
        group_tradeoff_figure(memory, memory)


def test_the_time_panel_names_its_schedule_and_link_rates(tables):
    """group_traffic_table times the ZeRO paper's schedule at NCCL's achieved rates: the time
    panel says so, and follows another link efficiency."""
    memory, traffic = tables
    _, (_, artists) = group_tradeoff_figure(memory, traffic, "h100-80gb")
    subtitle = artists.titles[3].get_text()
    assert subtitle == ("4,096 tokens per GPU · 40% of peak · the ZeRO paper's schedule · "
                        "achieved link rates")
    for efficiency, words in (("line-rate", "links at line rate"),
                              (0.8, "links at 80% of line rate")):
        other = group_traffic_table("llama-2-7b", 64,
                                    zl.interconnect("dgx-h100", efficiency=efficiency), "h100-80gb")
        update_group_traffic(artists, other)
        assert artists.titles[3].get_text().endswith(f"the ZeRO paper's schedule · {words}")
