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

from zerolib import plotting
from zerolib.curves import memory_table

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
    return plotting.gpu_count_figure(table)


@pytest.fixture
def model_size():
    table = memory_table(CHAPTER_SIZES, 64)
    return plotting.model_size_figure(table)


def line_by_label(artists, label):
    return next(line for line in artists.lines.values() if line.get_label() == label)


# --- labels and palette ------------------------------------------------------------------------

def test_device_label_names_the_capacity_in_both_units():
    assert plotting.device_label("a100-80gb") == "A100 80GB capacity: 80 GiB = 85.9 GB"
    assert plotting.device_label("a100-80gb", "GiB") == "A100 80GB capacity: 80 GiB"
    assert plotting.device_label("h200-141gb") == "H200 141GB capacity: 141 GiB = 151.4 GB"
    assert plotting.device_label("v100-32gb") == "V100 32GB capacity: 32 GiB = 34.4 GB"


def test_value_labels_have_three_significant_digits():
    assert [plotting.format_value(v) for v in (1120, 293.125, 155.3125, 17.5, 4.1875, 0.25)] == [
        "1,120", "293", "155", "17.5", "4.19", "0.25"]


def test_strategies_have_distinct_okabe_ito_colours():
    colours = [plotting.STRATEGY_COLORS[s] for s in range(4)]
    assert len(set(colours)) == 4
    assert set(colours) <= set(plotting.OKABE_ITO.values())
    assert plotting.DEVICE_COLOR not in colours


def test_the_same_strategy_has_the_same_colour_in_both_figures(gpu_count, model_size):
    (_, lines), (_, bars) = gpu_count, model_size
    for stage in range(4):
        line_colour = matplotlib.colors.to_hex(lines.lines[stage].get_color())
        bar_colour = matplotlib.colors.to_hex(bars.bars[stage].patches[0].get_facecolor())
        assert line_colour == bar_colour == plotting.STRATEGY_COLORS[stage].lower()
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
    assert figure.get_size_inches().tolist() == list(plotting.GPU_COUNT_FIGSIZE)


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
    plotting.update_memory_vs_gpu_count(artists, memory_table(70e9, np.arange(1, 65)),
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
    plotting.update_memory_vs_gpu_count(artists, memory_table(7e9, [2, 3, 4]))
    x, y = artists.lines[3].get_data()
    assert list(x) == [2, 3, 4]
    assert list(y) == pytest.approx([56, 112 / 3, 28])
    assert artists.ax.get_xscale() == "linear"
    plotting.update_memory_vs_gpu_count(artists, memory_table(7e9, np.arange(1, 1025)))
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
    assert figure.get_size_inches().tolist() == list(plotting.MODEL_SIZE_FIGSIZE)


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
    plotting.update_memory_vs_model_size(artists, memory_table(CHAPTER_SIZES, 8),
                                         device="h200-141gb")
    assert [list(c.patches) for c in artists.bars.values()] == patches
    assert artists.bars[3].patches[-1].get_height() == pytest.approx(140)   # 70 x 16 / 8
    assert artists.device_line.get_ydata()[0] == pytest.approx(H200_GB)
    assert artists.device_legend_text.get_text() == "H200 141GB capacity: 141 GiB = 151.4 GB"


def test_model_size_update_with_other_models_redraws_in_the_same_axes(model_size):
    figure, artists = model_size
    ax = artists.ax
    plotting.update_memory_vs_model_size(artists, memory_table([7e9, 70e9, 175e9], 64))
    assert figure.axes == [ax] and artists.ax is ax
    assert [len(c.patches) for c in artists.bars.values()] == [3, 3, 3, 3]
    assert len(ax.patches) == 12                               # the old bars are gone
    assert [t.get_text() for t in ax.get_xticklabels()] == ["7B", "70B", "175B"]
    assert artists.bars[0].patches[-1].get_height() == pytest.approx(2800)   # 175 x 16


# --- bad input -----------------------------------------------------------------------------------

def test_bad_tables_and_units_are_rejected_with_the_argument_named():
    figure = plotting.new_figure(plotting.GPU_COUNT_FIGSIZE)
    ax = plotting.add_axes(figure, "gpu_count")
    with pytest.raises(ValueError, match="one params value"):
        plotting.draw_memory_vs_gpu_count(ax, memory_table([7e9, 13e9], [1, 2]))
    with pytest.raises(ValueError, match="one gpus value"):
        plotting.draw_memory_vs_model_size(ax, memory_table(7e9, [1, 2]))
    with pytest.raises(ValueError, match="unit"):
        plotting.draw_memory_vs_gpu_count(ax, memory_table(7e9, [1, 2]), unit="MB")
    with pytest.raises(ValueError, match="lacks the columns"):
        plotting.draw_memory_vs_gpu_count(ax, memory_table(7e9, [1, 2])[["params", "gpus"]])
    with pytest.raises(TypeError, match="DataFrame"):
        plotting.draw_memory_vs_gpu_count(ax, [[1, 2]])
    with pytest.raises(ValueError, match="layout"):   # numbers of one layout, title of another
        plotting.draw_memory_vs_gpu_count(ax, memory_table(7e9, [1, 2], layout="fp32-adam"),
                                          layout="bf16-fp32-grads")
    with pytest.raises(ValueError, match="device"):
        plotting.draw_memory_vs_gpu_count(ax, memory_table(7e9, [1, 2]), device="tpu")


# --- rendering ----------------------------------------------------------------------------------

def test_png_and_svg_are_byte_stable_without_dates_or_versions(gpu_count):
    figure, _ = gpu_count
    png, svg = plotting.render_png(figure), plotting.render_svg(figure)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert plotting.render_png(figure) == png and plotting.render_svg(figure) == svg
    assert b"Software" not in png and b"Matplotlib" not in png
    assert b"<dc:date>" not in svg and matplotlib.__version__.encode() not in svg
    # The same drawing in a second figure gives the same bytes (fixed SVG ids).
    again, _ = plotting.gpu_count_figure(memory_table(7e9, np.arange(1, 65)))
    assert plotting.render_svg(again) == svg and plotting.render_png(again) == png


def test_incremental_png_gives_the_pixels_of_a_full_draw(gpu_count):
    figure, artists = gpu_count
    fast = plotting.IncrementalPng(figure, plotting.text_blocks(artists))
    for params, gpus, device, unit in [(7e9, range(1, 65), "a100-80gb", "GB"),
                                       (7e9, range(1, 33), "a100-80gb", "GB"),
                                       (70e9, range(1, 33), "a100-80gb", "GB"),
                                       (70e9, range(1, 33), "v100-32gb", "GiB"),
                                       (70e9, range(4, 9), "v100-32gb", "GiB")]:
        plotting.update_memory_vs_gpu_count(artists, memory_table(params, list(gpus)), device, unit)
        assert fast.render() == plotting.IncrementalPng(figure).render()
    assert fast.full_draws == 1     # only the first render drew every text block


def test_library_uses_no_pyplot_and_changes_no_global_style():
    code = (
        "import matplotlib, sys\n"
        # dict.items reads the stored values (rcParams["backend"] would import pyplot)
        "before = dict(dict.items(matplotlib.rcParams))\n"
        "import numpy as np\n"
        "from zerolib import plotting, figures, explorers\n"
        "from zerolib.curves import memory_table\n"
        "figure, _ = plotting.gpu_count_figure(memory_table(7e9, np.arange(1, 65)))\n"
        "plotting.render_png(figure); plotting.render_svg(figure)\n"
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
    png = plotting.encode_png(rgba)
    decoded = np.asarray(PIL.Image.open(io.BytesIO(png)))
    assert decoded.shape == rgba.shape[:2] + (3,)
    assert np.array_equal(decoded, rgba[..., :3]) and np.all(rgba[..., 3] == 255)  # opaque
    assert plotting.encode_png(rgba) == png
