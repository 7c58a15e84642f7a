"""The drawing functions: what they draw, how they update in place, and byte-stable rendering.

Expected values are worked out by hand for mixed-precision Adam (2 + 2 + 12 = 16 bytes per
parameter): a 7B model holds 7e9 x 16 = 112 GB unpartitioned; at N GPUs stage 1 holds
2 + 2 + 12/N, stage 2 holds 2 + 14/N and stage 3 16/N bytes per parameter. An A100 80GB
holds 80 x 2^30 = 85,899,345,920 bytes = 85.9 GB.
"""
import subprocess
import sys

import matplotlib
import numpy as np
import pytest

from zerolib.chapter import fast_png, style
from zerolib.chapter.charts import gpu_count as gpu_count_chart
from zerolib.chapter.charts import measured as measured_chart
from zerolib.chapter.charts import model_size as model_size_chart
from zerolib.chapter.charts import will_it_fit as will_it_fit_chart
from zerolib.core import units
from zerolib.core.memory.tables import memory_table

GB = 10**9
GiB = 2**30
A100_GB = 80 * GiB / GB      # 85.899345920
V100_GB = 32 * GiB / GB      # 34.359738368
H200_GB = 141 * GiB / GB     # 151.397597184
STAGE_NAMES = ["Plain data parallelism", "ZeRO stage 1 (optimizer)",
               "ZeRO stage 2 (+ gradients)", "ZeRO stage 3 (+ parameters)"]
CHAPTER_SIZES = [1e9, 7e9, 13e9, 30e9, 70e9]


@pytest.fixture
def gpu_count():
    table = memory_table(7e9, np.arange(1, 65))
    return gpu_count_chart.gpu_count_figure(table)


@pytest.fixture
def model_size():
    table = memory_table(CHAPTER_SIZES, 64)
    return model_size_chart.model_size_figure(table)


def line_by_label(artists, label):
    return next(line for line in artists.lines.values() if line.get_label() == label)


# --- labels and palette ------------------------------------------------------------------------

def test_device_label_names_the_capacity_in_both_units():
    assert style.device_label("a100-80gb") == "A100 80GB capacity: 80 GiB = 85.9 GB"
    assert style.device_label("a100-80gb", "GiB") == "A100 80GB capacity: 80 GiB"
    assert style.device_label("h200-141gb") == "H200 141GB capacity: 141 GiB = 151.4 GB"
    assert style.device_label("v100-32gb") == "V100 32GB capacity: 32 GiB = 34.4 GB"


def test_value_labels_have_three_significant_digits():
    assert [units.format_value(v) for v in (1120, 293.125, 155.3125, 17.5, 4.1875, 0.25)] == [
        "1,120", "293", "155", "17.5", "4.19", "0.25"]


def test_strategies_have_distinct_okabe_ito_colours():
    colours = [style.STRATEGY_COLORS[s] for s in range(4)]
    assert len(set(colours)) == 4
    assert set(colours) <= set(style.OKABE_ITO.values())
    assert style.DEVICE_COLOR not in colours


def test_the_same_strategy_has_the_same_colour_in_both_figures(gpu_count, model_size):
    (_, lines), (_, bars) = gpu_count, model_size
    for stage in range(4):
        line_colour = matplotlib.colors.to_hex(lines.lines[stage].get_color())
        bar_colour = matplotlib.colors.to_hex(bars.bars[stage].patches[0].get_facecolor())
        assert line_colour == bar_colour == style.STRATEGY_COLORS[stage].lower()
    assert (matplotlib.colors.to_hex(lines.device_line.get_color())
            == matplotlib.colors.to_hex(bars.device_line.get_color()))


# --- figure 1: per-GPU memory against GPU count ------------------------------------------------

def test_gpu_count_figure_has_four_series_and_the_a100_line(gpu_count):
    figure, artists = gpu_count
    assert [line.get_label() for line in artists.lines.values()] == STAGE_NAMES
    assert artists.device_line.get_ydata()[0] == pytest.approx(A100_GB)
    assert "85.9 GB" in artists.device_line.get_label()
    legend = [t.get_text() for t in artists.legend.get_texts()]
    assert legend == STAGE_NAMES + ["A100 80GB capacity: 80 GiB = 85.9 GB"]
    assert "[GB]" in artists.ax.get_ylabel()
    assert figure.get_size_inches().tolist() == list(gpu_count_chart.FIGSIZE)


def test_gpu_count_lines_hold_the_seed_claims(gpu_count):
    _, artists = gpu_count
    baseline = line_by_label(artists, "Plain data parallelism")
    assert list(baseline.get_xdata()) == list(range(1, 65))
    assert np.all(baseline.get_ydata() == 112.0)              # flat at 112 GB
    for stage in (1, 2, 3):                                   # all under the A100 at 2 GPUs
        x, y = artists.lines[stage].get_data()
        assert y[list(x).index(2)] < A100_GB
    # At 2 GPUs: (2 + 2 + 12/2) x 7 = 70; (2 + 14/2) x 7 = 63; 16/2 x 7 = 56 GB.
    assert [artists.lines[s].get_ydata()[1] for s in (1, 2, 3)] == pytest.approx([70, 63, 56])
    # At 64 GPUs: (4 + 12/64) x 7 = 29.3125; (2 + 14/64) x 7 = 15.53125; 16/64 x 7 = 1.75.
    assert [artists.lines[s].get_ydata()[-1] for s in (1, 2, 3)] == pytest.approx(
        [29.3125, 15.53125, 1.75])
    assert [artists.end_labels[s].get_text() for s in range(4)] == [
        "112 GB", "29.3 GB", "15.5 GB", "1.75 GB"]
    # Stage 3 is a hyperbola: memory x GPUs is constant (112 GB).
    x, y = artists.lines[3].get_data()
    assert np.allclose(y * x, 112.0)


def test_gpu_count_update_changes_the_same_artists(gpu_count):
    figure, artists = gpu_count
    lines = dict(artists.lines)
    device_line, ax = artists.device_line, artists.ax
    gpu_count_chart.update_memory_vs_gpu_count(artists, memory_table(70e9, np.arange(1, 65)),
                                        device="v100-32gb", unit="GiB")
    assert artists.lines == lines and artists.device_line is device_line and artists.ax is ax
    assert figure.axes == [ax]
    # 70e9 x 16 bytes = 1.12e12 bytes = 1043.08 GiB.
    assert np.allclose(lines[0].get_ydata(), 1.12e12 / GiB)
    assert device_line.get_ydata()[0] == pytest.approx(32.0)  # 32 GiB in GiB
    assert artists.device_legend_text.get_text() == "V100 32GB capacity: 32 GiB"
    assert "[GiB]" in ax.get_ylabel()
    assert ax.get_ylim()[1] >= 1043
    assert "70B" in artists.title.get_text()


def test_gpu_count_update_follows_a_new_gpu_range(gpu_count):
    _, artists = gpu_count
    gpu_count_chart.update_memory_vs_gpu_count(artists, memory_table(7e9, [2, 3, 4]))
    x, y = artists.lines[3].get_data()
    assert list(x) == [2, 3, 4]
    assert list(y) == pytest.approx([56, 112 / 3, 28])
    assert artists.ax.get_xscale() == "linear"
    gpu_count_chart.update_memory_vs_gpu_count(artists, memory_table(7e9, np.arange(1, 1025)))
    assert artists.ax.get_xscale() == "log"
    assert artists.lines[3].get_ydata()[-1] == pytest.approx(112 / 1024)


# --- figure 2: per-GPU memory across model sizes ----------------------------------------------

def test_model_size_figure_has_four_series_of_five_bars_and_the_a100_line(model_size):
    figure, artists = model_size
    assert [c.get_label() for c in artists.bars.values()] == STAGE_NAMES
    assert [len(c.patches) for c in artists.bars.values()] == [5, 5, 5, 5]
    assert artists.device_line.get_ydata()[0] == pytest.approx(A100_GB)
    assert "85.9 GB" in artists.device_legend_text.get_text()
    assert [t.get_text() for t in artists.ax.get_xticklabels()] == ["1B", "7B", "13B", "30B", "70B"]
    assert artists.ax.get_yscale() == "log"
    assert figure.get_size_inches().tolist() == list(model_size_chart.FIGSIZE)


def test_model_size_bars_hold_the_seed_claims(model_size):
    _, artists = model_size
    heights = {s: [p.get_height() for p in artists.bars[s].patches] for s in range(4)}
    # 70B at 64 GPUs: 70e9 x 16 = 1120 GB; stage 1 (4 + 12/64) x 70 = 293.125 GB;
    # stage 2 (2 + 14/64) x 70 = 155.3125 GB; stage 3 16/64 x 70 = 17.5 GB.
    assert [heights[s][-1] for s in range(4)] == pytest.approx([1120, 293.125, 155.3125, 17.5])
    assert [t.get_text() for t in (artists.value_labels[s][-1] for s in range(4))] == [
        "1,120", "293", "155", "17.5"]
    assert all(h < 20 for h in heights[3])                   # stage 3 under 20 GB for all
    assert heights[3][0] == pytest.approx(0.25)               # 1B: 16 GB / 64
    low, high = artists.ax.get_ylim()
    assert low <= 0.25 and high >= 1120                       # every bar is on the axes


def test_model_size_update_keeps_bars_when_the_count_is_unchanged(model_size):
    figure, artists = model_size
    patches = [list(c.patches) for c in artists.bars.values()]
    model_size_chart.update_memory_vs_model_size(artists, memory_table(CHAPTER_SIZES, 8),
                                         device="h200-141gb")
    assert [list(c.patches) for c in artists.bars.values()] == patches
    assert artists.bars[3].patches[-1].get_height() == pytest.approx(140)   # 70 x 16 / 8
    assert artists.device_line.get_ydata()[0] == pytest.approx(H200_GB)
    assert artists.device_legend_text.get_text() == "H200 141GB capacity: 141 GiB = 151.4 GB"


def test_model_size_update_with_other_models_redraws_in_the_same_axes(model_size):
    figure, artists = model_size
    ax = artists.ax
    model_size_chart.update_memory_vs_model_size(artists, memory_table([7e9, 70e9, 175e9], 64))
    assert figure.axes == [ax] and artists.ax is ax
    assert [len(c.patches) for c in artists.bars.values()] == [3, 3, 3, 3]
    assert len(ax.patches) == 12                               # the old bars are gone
    assert [t.get_text() for t in ax.get_xticklabels()] == ["7B", "70B", "175B"]
    assert artists.bars[0].patches[-1].get_height() == pytest.approx(2800)   # 175 x 16


# --- bad input -----------------------------------------------------------------------------------

def test_bad_tables_and_units_are_rejected_with_the_argument_named():
    figure = style.new_figure(gpu_count_chart.FIGSIZE)
    ax = style.add_axes(figure, gpu_count_chart.MARGINS)
    with pytest.raises(ValueError, match="one params value"):
        gpu_count_chart.draw_memory_vs_gpu_count(ax, memory_table([7e9, 13e9], [1, 2]))
    with pytest.raises(ValueError, match="one gpus value"):
        model_size_chart.draw_memory_vs_model_size(ax, memory_table(7e9, [1, 2]))
    with pytest.raises(ValueError, match="unit"):
        gpu_count_chart.draw_memory_vs_gpu_count(ax, memory_table(7e9, [1, 2]), unit="MB")
    with pytest.raises(ValueError, match="lacks the columns"):
        gpu_count_chart.draw_memory_vs_gpu_count(ax, memory_table(7e9, [1, 2])[["params", "gpus"]])
    with pytest.raises(TypeError, match="DataFrame"):
        gpu_count_chart.draw_memory_vs_gpu_count(ax, [[1, 2]])
    bare = memory_table(7e9, [1, 2])
    bare.attrs.clear()   # a table that does not say which layout made its numbers
    with pytest.raises(ValueError, match="lacks attrs layout"):
        gpu_count_chart.draw_memory_vs_gpu_count(ax, bare)
    with pytest.raises(ValueError, match="device"):
        gpu_count_chart.draw_memory_vs_gpu_count(ax, memory_table(7e9, [1, 2]), device="tpu")


# --- rendering ----------------------------------------------------------------------------------

def test_png_and_svg_are_byte_stable_without_dates_or_versions(gpu_count):
    figure, _ = gpu_count
    png, svg = style.render_png(figure), style.render_svg(figure)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert style.render_png(figure) == png and style.render_svg(figure) == svg
    assert b"Software" not in png and b"Matplotlib" not in png
    assert b"<dc:date>" not in svg and matplotlib.__version__.encode() not in svg
    # The same drawing in a second figure gives the same bytes (fixed SVG ids).
    again, _ = gpu_count_chart.gpu_count_figure(memory_table(7e9, np.arange(1, 65)))
    assert style.render_svg(again) == svg and style.render_png(again) == png


def test_incremental_png_gives_the_pixels_of_a_full_draw(gpu_count):
    figure, artists = gpu_count
    fast = fast_png.IncrementalPng(figure, fast_png.text_blocks(artists))
    for params, gpus, device, unit in [(7e9, range(1, 65), "a100-80gb", "GB"),
                                       (7e9, range(1, 33), "a100-80gb", "GB"),
                                       (70e9, range(1, 33), "a100-80gb", "GB"),
                                       (70e9, range(1, 33), "v100-32gb", "GiB"),
                                       (70e9, range(4, 9), "v100-32gb", "GiB")]:
        gpu_count_chart.update_memory_vs_gpu_count(artists, memory_table(params, list(gpus)), device, unit)
        assert fast.render() == fast_png.IncrementalPng(figure).render()
    assert fast.full_draws == 1     # only the first render drew every text block


def test_library_uses_no_pyplot_and_changes_no_global_style():
    code = (
        "import matplotlib, sys\n"
        # dict.items reads the stored values (rcParams["backend"] would import pyplot)
        "before = dict(dict.items(matplotlib.rcParams))\n"
        "import numpy as np\n"
        "from zerolib.chapter import explorers, style\n"
        "from zerolib.chapter.charts import gpu_count as gpu_count_chart\n"
        "from zerolib.core.memory.tables import memory_table\n"
        "figure, _ = gpu_count_chart.gpu_count_figure(memory_table(7e9, np.arange(1, 65)))\n"
        "style.render_png(figure); style.render_svg(figure)\n"
        "explorers.GpuCountExplorer().controls['params'].value = 13 * 10**9\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'\n"
        "after = dict(dict.items(matplotlib.rcParams))\n"
        "assert before == after, {k for k in before if before[k] != after[k]}\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_encode_png_holds_exactly_the_canvas_pixels(gpu_count):
    import io

    import PIL.Image
    figure, _ = gpu_count
    figure.canvas.draw()
    rgba = np.asarray(figure.canvas.buffer_rgba())
    png = fast_png.encode_png(rgba)
    decoded = np.asarray(PIL.Image.open(io.BytesIO(png)))
    assert decoded.shape == rgba.shape[:2] + (3,)
    assert np.array_equal(decoded, rgba[..., :3]) and np.all(rgba[..., 3] == 255)  # opaque
    assert fast_png.encode_png(rgba) == png


# --- measured against predicted, per rank (notebook 05) -----------------------------------------

def measured_table():
    """Two panels worked out by hand: 2 ranks; zerolib predicts 100 B of each category per rank."""
    import pandas as pd

    rows = []
    for panel, stage, measured in (("A\nat rest", 1, {"parameters": (100, 100),
                                                        "gradients": (100, 100),
                                                        "optimizer": (150, 50)}),
                                   ("B\npeak", 3, {"parameters": (300, 300),
                                                   "gradients": (110, 110),
                                                   "optimizer": (100, 90)})):
        for category, values in measured.items():
            for rank, value in enumerate(values):
                rows.append({"panel": panel, "strategy": "x", "stage": stage, "phase": "rest",
                             "rank": rank, "category": category, "measured_bytes": value,
                             "predicted_bytes": 100, "relative_difference": value / 100 - 1})
    return pd.DataFrame(rows)


def test_format_relative_for_reading():
    assert [units.format_relative(v) for v in (0, 0.000048, 0.0023, -0.314, 0.117, 2.6196, -0.5)] == [
        "0%", "+0.0048%", "+0.23%", "-31.4%", "+11.7%", "+262%", "-50.0%"]


def test_measured_figure_draws_each_rank_and_the_prediction():
    figure, panels = measured_chart.measured_vs_predicted_figure(measured_table(), "title", "subtitle")
    assert len(panels) == len(figure.axes) == 2
    first, second = panels
    assert first.categories == ("parameters", "gradients", "optimizer") and first.ranks == (0, 1)
    assert [bar.get_height() for bar in first.bars["optimizer"]] == [150, 50]
    assert [t.get_text() for t in first.difference_labels["optimizer"]] == ["+50.0%", "-50.0%"]
    assert [t.get_text() for t in second.difference_labels["parameters"]] == ["+200%", "+200%"]
    for artists in panels:
        for line in artists.predictions.values():
            assert line.get_segments()[0][0][1] == 100  # the prediction, at 100 B
    # Bars take the colour of the stage they are compared with, as in the chapter's figures.
    assert (matplotlib.colors.to_hex(first.bars["gradients"].patches[0].get_facecolor())
            == style.STRATEGY_COLORS[1].lower())
    assert (matplotlib.colors.to_hex(second.bars["gradients"].patches[0].get_facecolor())
            == style.STRATEGY_COLORS[3].lower())
    # One y axis for every panel, with room above the tallest bar (300 B) for its label.
    assert first.ax.get_ylim() == second.ax.get_ylim() and first.ax.get_ylim()[1] > 300
    assert first.title.get_text() == "A\nat rest"
    legend = figure.legends[0].get_texts()
    assert [t.get_text() for t in legend] == [
        "measured on each rank, vs ZeRO stage 1 (optimizer)",
        "measured on each rank, vs ZeRO stage 3 (+ parameters)",
        "zerolib's prediction (the same for every rank)"]


def test_measured_figure_png_is_byte_stable():
    png = style.render_png(measured_chart.measured_vs_predicted_figure(measured_table(), "t")[0])
    again = style.render_png(measured_chart.measured_vs_predicted_figure(measured_table(), "t")[0])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png == again and b"Software" not in png


def test_measured_figure_rejects_bad_tables():
    table = measured_table()
    with pytest.raises(TypeError, match="table"):
        measured_chart.measured_vs_predicted_figure(table.to_dict(), "t")
    with pytest.raises(ValueError, match="predicted_bytes"):
        measured_chart.measured_vs_predicted_figure(table.drop(columns="predicted_bytes"), "t")
    uneven = table.copy()
    uneven.loc[0, "predicted_bytes"] = 99  # zerolib never predicts different bytes per rank
    with pytest.raises(ValueError, match="predicted_bytes"):
        measured_chart.measured_vs_predicted_figure(uneven, "t")
    with pytest.raises(ValueError, match="category"):
        measured_chart.measured_vs_predicted_figure(table.replace({"category": {"optimizer": "other"}}), "t")
    with pytest.raises(ValueError, match="ncols"):
        measured_chart.measured_vs_predicted_figure(table, "t", ncols=0)
    figure = style.new_figure((4, 3))
    with pytest.raises(ValueError, match="one panel"):
        measured_chart.draw_measured_vs_predicted(figure.add_subplot(), table)


# --- figure 3: will it fit? persistent state + working set per stage against the device ----------
#
# Worked out by hand for Llama-2-7B (P = 6,738,415,616 parameters, the published count; 32 layers,
# h = 4096, a = 32 heads, f = 11008 gated MLP, V = 32,000, no dropout) on 8 GPUs, sequence
# s = 4096, micro-batch b = 1, selective recomputation, flash attention, mixed-precision Adam.
# Persistent state (ZeRO paper, Sec. V): 2P = 13,476,831,232 bytes of 16-bit parameters (or
# gradients), 12P = 80,860,987,392 bytes of optimizer state; partitioned over 8: P / 8 =
# 842,301,952 elements. Working set:
# - activations (Korthikanti et al., MLSys 2023, term by term): per layer 8 tensors of s x h in 2 bytes
#   (two norm inputs, QKV and MLP inputs, Q, K, V, attention output projection input) = 16sbh
#   plus 4 f-wide tensors of the gated MLP in 2 bytes = 8sbf; 32 layers; plus the final norm's and
#   output projection's inputs (2 x 2sbh) and the one layer whose attention core is recomputed
#   (flash: 4 bytes of log-sum-exp per head and token, 4asb);
# - logits and loss: (2 + 4) bytes x s x b x V;
# - DDP buckets (stage 0): a second copy of the 16-bit gradients, 2P;
# - DeepSpeed reduce bucket (stages 1-3): 5e8 elements x 2 bytes; all-gather in place: 0;
# - stage 3 gathered parameters: max(stage3_max_live_parameters 1e9, largest module 32000 x 4096
#   + prefetch 5e7) = 1e9 elements x 2 bytes;
# - reserve: 2 GiB.
LLAMA_P = 6_738_415_616
S, B, H, A, F, V, LAYERS = 4096, 1, 4096, 32, 11008, 32_000, 32
ACTIVATIONS = LAYERS * (16 * S * B * H + 8 * S * B * F) + 4 * A * S * B + 2 * 2 * S * B * H
LOGITS = 6 * S * B * V
RESERVE = 2 * GiB
WORKSHEET = {  # stage -> component -> bytes on one of 8 GPUs
    0: {"parameters": 2 * LLAMA_P, "gradients": 2 * LLAMA_P, "optimizer": 12 * LLAMA_P,
        "ddp_buckets": 2 * LLAMA_P, "reduce_bucket": 0, "gathered_parameters": 0},
    1: {"parameters": 2 * LLAMA_P, "gradients": 2 * LLAMA_P, "optimizer": 12 * LLAMA_P // 8,
        "ddp_buckets": 0, "reduce_bucket": 10**9, "gathered_parameters": 0},
    2: {"parameters": 2 * LLAMA_P, "gradients": 2 * LLAMA_P // 8, "optimizer": 12 * LLAMA_P // 8,
        "ddp_buckets": 0, "reduce_bucket": 10**9, "gathered_parameters": 0},
    3: {"parameters": 2 * LLAMA_P // 8, "gradients": 2 * LLAMA_P // 8,
        "optimizer": 12 * LLAMA_P // 8, "ddp_buckets": 0, "reduce_bucket": 10**9,
        "gathered_parameters": 2 * 10**9},
}
for _stage in WORKSHEET.values():
    _stage.update(activations=ACTIVATIONS, logits_loss=LOGITS, allgather_bucket=0, reserve=RESERVE)
PEAKS = {stage: sum(parts.values()) for stage, parts in WORKSHEET.items()}
H100_GB = 80 * GiB / GB
A100_40_GB = 40 * GiB / GB
STACK = ["parameters", "gradients", "optimizer", "activations", "logits_loss", "ddp_buckets",
         "reduce_bucket", "allgather_bucket", "gathered_parameters", "reserve"]


def test_hand_worksheet_is_consistent():
    # The sums behind the expected values (so a typo above cannot hide): 20.2 GB of activations.
    assert ACTIVATIONS == 20_200_292_352 and LOGITS == 786_432_000
    assert [round(PEAKS[s] / GB, 2) for s in range(4)] == [144.43, 61.2, 49.4, 39.61]


def _settings(**changes):
    from zerolib.core.memory.working_set import WorkingSetSettings
    return WorkingSetSettings(**{"seq_len": 4096, "micro_batch": 1, "recompute": "selective",
                                 "flash_attention": True, **changes})


def _frame(settings=None, model="llama-2-7b", gpus=8):
    from zerolib.core.memory.tables import peak_frame
    return peak_frame(model, gpus, (0, 1, 2, 3), settings or _settings())


@pytest.fixture
def will_it_fit():
    settings = _settings()
    return will_it_fit_chart.will_it_fit_figure(_frame(settings), "h100-80gb")


def heights_gb(artists, stage_index):
    return {c: artists.bars[c].patches[stage_index].get_height() for c in STACK}


def test_will_it_fit_stacks_every_component_of_the_hand_worksheet(will_it_fit):
    figure, artists = will_it_fit
    assert figure.get_size_inches().tolist() == list(will_it_fit_chart.FIGSIZE)
    assert list(will_it_fit_chart.COMPONENTS) == STACK
    for i, stage in enumerate(range(4)):
        bottom = 0.0
        for component in STACK:
            rectangle = artists.bars[component].patches[i]
            assert rectangle.get_height() == pytest.approx(WORKSHEET[stage][component] / GB)
            assert rectangle.get_y() == pytest.approx(bottom)      # stacked in this order
            bottom += WORKSHEET[stage][component] / GB
        assert bottom == pytest.approx(PEAKS[stage] / GB)
    assert [artists.peak_labels[s].get_text() for s in range(4)] == [
        "144 GB", "61.2 GB", "49.4 GB", "39.6 GB"]
    assert [artists.verdict_labels[s].get_text() for s in range(4)] == [
        "too big", "fits", "fits", "fits"]                        # against 85.9 GB
    # Values written inside the segments tall enough to hold them: 80.9 GB of optimizer
    # state without ZeRO, 20.2 GB of activations everywhere; not inside the 1 GB reduce bucket.
    assert artists.segment_labels["optimizer"][0].get_text() == "80.9"
    assert artists.segment_labels["activations"][3].get_text() == "20.2"
    assert artists.segment_labels["activations"][3].get_visible()
    assert not artists.segment_labels["reduce_bucket"][1].get_visible()
    assert [t.get_text() for t in artists.stage_labels.values()] == [
        "Plain data\nparallelism", "ZeRO stage 1\n(optimizer)", "ZeRO stage 2\n(+ gradients)",
        "ZeRO stage 3\n(+ parameters)"]
    assert "[GB]" in artists.ax.get_ylabel()
    assert artists.ax.get_ylim()[1] > PEAKS[0] / GB                  # the tallest bar is inside


def test_will_it_fit_capacity_line_is_at_the_capacity_and_labelled(will_it_fit):
    _, artists = will_it_fit
    assert artists.device_line.get_ydata()[0] == pytest.approx(H100_GB)
    assert artists.device_tag.get_position()[1] == pytest.approx(H100_GB)
    assert artists.device_tag.get_text() == "85.9 GB"
    assert artists.device_legend_text.get_text() == "H100 80GB capacity: 80 GiB = 85.9 GB"
    title, subtitle = artists.title.get_text(), artists.subtitle.get_text()
    assert "llama-2-7b on 8 GPUs" in title
    for words in ("sequence 4,096", "micro-batch 1", "selective recomputation", "flash attention",
                  "mixed-adam (16 bytes/param)", "reserve 2 GiB"):
        assert words in subtitle


def test_will_it_fit_components_have_their_own_colour_blind_safe_colours(will_it_fit):
    _, artists = will_it_fit
    colours = [will_it_fit_chart.COMPONENT_COLORS[c] for c in STACK]
    assert len(set(colours)) == len(STACK)
    assert set(colours) <= set(will_it_fit_chart.TOL_MUTED.values())
    # Strategy colours stay with strategies, the device keeps its own.
    assert not set(colours) & {*style.STRATEGY_COLORS.values(), style.DEVICE_COLOR}
    for component in STACK:
        faces = {matplotlib.colors.to_hex(p.get_facecolor()) for p in artists.bars[component].patches}
        assert faces == {will_it_fit_chart.COMPONENT_COLORS[component].lower()}   # same in every bar
        legend = artists.legend_text(component).get_text()
        assert legend.startswith(will_it_fit_chart.COMPONENT_LABELS[component])
    # A term that is 0 in every bar says so (DeepSpeed all-gathers in place).
    assert artists.legend_text("allgather_bucket").get_text().endswith(": 0 here")
    assert not artists.legend_text("reduce_bucket").get_text().endswith(": 0 here")
    # Text inside a segment is black or white, whichever contrasts more (indigo: white).
    assert artists.segment_labels["parameters"][0].get_color() == "#ffffff"
    assert artists.segment_labels["reserve"][0].get_color() == "#000000"


def test_will_it_fit_update_changes_the_same_artists():
    settings = _settings()
    figure, artists = will_it_fit_chart.will_it_fit_figure(_frame(settings), "h100-80gb")
    patches = {c: list(artists.bars[c].patches) for c in STACK}
    line, ax = artists.device_line, artists.ax
    # Micro-batch 2 doubles the activations and the logits (both linear in b), nothing else.
    doubled = _settings(micro_batch=2)
    will_it_fit_chart.update_will_it_fit(artists, _frame(doubled), "a100-40gb", "GB")
    assert {c: list(artists.bars[c].patches) for c in STACK} == patches
    assert artists.device_line is line and figure.axes == [ax]
    for i in range(4):
        got = heights_gb(artists, i)
        assert got["activations"] == pytest.approx(2 * ACTIVATIONS / GB)
        assert got["logits_loss"] == pytest.approx(2 * LOGITS / GB)
        assert got["optimizer"] == pytest.approx(WORKSHEET[i]["optimizer"] / GB)
    # An A100 40GB holds 40 GiB = 42.9 GB; at micro-batch 2 every stage needs 20.99 GB more
    # (activations + logits), so even stage 3 needs 39.61 + 20.99 = 60.6 GB: nothing fits.
    assert artists.device_line.get_ydata()[0] == pytest.approx(A100_40_GB)
    assert artists.device_tag.get_text() == "42.9 GB"
    assert artists.device_legend_text.get_text() == "A100 40GB capacity: 40 GiB = 42.9 GB"
    assert [artists.verdict_labels[s].get_text() for s in range(4)] == ["too big"] * 4
    assert artists.peak_labels[3].get_text() == "60.6 GB"
    assert "micro-batch 2" in artists.subtitle.get_text()
    # In GiB the same bytes are smaller numbers and the line sits at exactly 40.
    will_it_fit_chart.update_will_it_fit(artists, _frame(doubled), "a100-40gb", "GiB")
    assert artists.device_line.get_ydata()[0] == pytest.approx(40.0)
    assert artists.device_tag.get_text() == "40.0 GiB"
    assert heights_gb(artists, 0)["activations"] == pytest.approx(2 * ACTIVATIONS / GiB)
    assert "[GiB]" in artists.ax.get_ylabel()


def test_will_it_fit_bad_input_is_rejected_with_the_argument_named(will_it_fit):
    _, artists = will_it_fit
    figure = style.new_figure(will_it_fit_chart.FIGSIZE)
    ax = style.add_axes(figure, will_it_fit_chart.MARGINS)
    frame = _frame()
    with pytest.raises(TypeError, match="table must be a DataFrame"):
        will_it_fit_chart.draw_will_it_fit(ax, [[1, 2]])
    with pytest.raises(ValueError, match="lacks the columns"):
        will_it_fit_chart.draw_will_it_fit(ax, frame[["stage", "bytes"]])
    with pytest.raises(ValueError, match="every component exactly once"):
        will_it_fit_chart.draw_will_it_fit(ax, frame.iloc[1:])
    with pytest.raises(ValueError, match="one gpus value"):
        will_it_fit_chart.draw_will_it_fit(ax, __import__("pandas").concat([frame, _frame(gpus=16)]))
    # A frame that does not say which settings made it cannot be titled: refused.
    bare = frame.copy()
    bare.attrs.pop("settings")
    with pytest.raises(ValueError, match="lacks attrs settings"):
        will_it_fit_chart.draw_will_it_fit(ax, bare)
    with pytest.raises(ValueError, match="unit"):
        will_it_fit_chart.draw_will_it_fit(ax, frame, unit="MB")
    with pytest.raises(ValueError, match="device"):
        will_it_fit_chart.draw_will_it_fit(ax, frame, device="tpu")
    from zerolib.core.memory.tables import peak_frame
    with pytest.raises(ValueError, match="stages"):
        will_it_fit_chart.update_will_it_fit(artists, peak_frame("llama-2-7b", 8, (2, 3), _settings()))


def test_will_it_fit_renders_byte_stable_and_incrementally(will_it_fit):
    figure, artists = will_it_fit
    png = style.render_png(figure)
    again, _ = will_it_fit_chart.will_it_fit_figure(_frame(), "h100-80gb")
    assert style.render_png(again) == png
    fast = fast_png.IncrementalPng(figure, will_it_fit_chart.will_it_fit_blocks(artists))
    for settings, device, unit in [(_settings(), "h100-80gb", "GB"),
                                   (_settings(micro_batch=2), "h100-80gb", "GB"),
                                   (_settings(micro_batch=2), "a100-40gb", "GiB"),
                                   (_settings(recompute="full"), "a100-40gb", "GiB")]:
        will_it_fit_chart.update_will_it_fit(artists, _frame(settings), device, unit)
        assert fast.render() == fast_png.IncrementalPng(figure).render()


def test_will_it_fit_labels_the_capacity_line_would_cross_sit_above_it():
    # Micro-batch 2 on the H100: stage 1 peaks at 82.2 GB, so its two labels (value and "fits",
    # 36 points above the bar) would straddle the 85.9 GB line: they start at the line instead.
    # Stage 3 at 60.6 GB is far below it and keeps its labels on its bar.
    settings = _settings(micro_batch=2)
    _, artists = will_it_fit_chart.will_it_fit_figure(_frame(settings), "h100-80gb")
    capacity = 80 * 2**30 / 1e9
    assert artists.peak_labels[1].get_text() == "82.2 GB"
    assert artists.peak_labels[1].get_position()[1] == pytest.approx(capacity)
    assert artists.verdict_labels[1].get_position()[1] == pytest.approx(capacity)
    assert artists.peak_labels[3].get_text() == "60.6 GB"
    assert artists.peak_labels[3].get_position()[1] == pytest.approx(60.6, abs=0.05)
    assert all(t.get_bbox_patch() is None for t in artists.peak_labels.values())
    will_it_fit_chart.update_will_it_fit(artists, _frame(), "h100-80gb")
    assert artists.peak_labels[1].get_position()[1] == pytest.approx(61.2, abs=0.05)  # clear again
