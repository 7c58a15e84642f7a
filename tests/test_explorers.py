"""The live explorers, driven headlessly: every control, its effect on .data and on the artists.

Setting ``control.value`` fires the observers synchronously in plain Python, as a slider move
does in a kernel. Expected numbers are worked out by hand for mixed-precision Adam (16 bytes per
parameter): 70B at 64 GPUs under stage 3 holds 70e9 x 16 / 64 = 17.5 GB per GPU; an A100 80GB
holds 85.9 GB, a V100 32GB 34.4 GB, an H200 141GB 151.4 GB.
"""
import IPython.display
import numpy as np
import pytest

from zerolib import explorers, plotting

GiB = 2**30
A100_GB = 80 * GiB / 1e9
V100_GB = 32 * GiB / 1e9
H200_GB = 141 * GiB / 1e9


@pytest.fixture(autouse=True)
def no_display(monkeypatch):
    """Callbacks must not call display(): the image widget is updated in place instead."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("display() called from an explorer")
    monkeypatch.setattr(IPython.display, "display", refuse)


class Watch:
    """Remembers the explorer's figure and image to check each change redraws in place."""

    def __init__(self, explorer):
        self.explorer = explorer
        self.figure = explorer.figure
        self.image = bytes(explorer.image.value)

    def changed(self) -> bool:
        """True if the image bytes changed since the last call; the Figure must be the same."""
        assert self.explorer.figure is self.figure
        new = bytes(self.explorer.image.value)
        changed, self.image = new != self.image, new
        return changed


def total(data, **where) -> int:
    rows = data
    for column, value in where.items():
        rows = rows[rows[column] == value]
    assert len(rows) == 1, where
    return int(rows["total"].iloc[0])


# --- GPU-count explorer ----------------------------------------------------------------------

@pytest.fixture
def gpu_explorer():
    return explorers.GpuCountExplorer()


def test_gpu_count_explorer_starts_at_the_chapter_figure(gpu_explorer):
    e = gpu_explorer
    assert set(e.controls) == {"params", "gpus", "layout", "parameters_bytes", "gradients_bytes",
                               "optimizer_bytes", "device", "unit"}
    assert len(e.data) == 64 * 4 and set(e.data["params"]) == {7 * 10**9}
    assert np.all(e.artists.lines[0].get_ydata() == 112.0)
    assert e.artists.device_line.get_ydata()[0] == pytest.approx(A100_GB)
    assert bytes(e.image.value)[:8] == b"\x89PNG\r\n\x1a\n" and e.image.format == "png"
    assert "7B parameters" in e.summary.value and "112 GB" in e.summary.value
    assert e.image in e.widget.children and e.summary in e.widget.children
    # The fewest GPUs per stage on an A100: never without ZeRO (112 GB however many GPUs);
    # stages 1-3 fit from 2 GPUs (70, 63 and 56 GB), not at 1 (112 GB).
    table = e.table.value
    assert "<td>Plain data parallelism</td><td style='text-align:right'>never</td>" in table
    for name, per_gpu in (("ZeRO stage 1 (optimizer)", "70.0 GB"),
                          ("ZeRO stage 2 (+ gradients)", "63.0 GB"),
                          ("ZeRO stage 3 (+ parameters)", "56.0 GB")):
        assert (f"<td>{name}</td><td style='text-align:right'>2</td>"
                f"<td style='text-align:right'>{per_gpu}</td>") in table


def test_gpu_count_explorer_model_size(gpu_explorer):
    e, watch = gpu_explorer, Watch(gpu_explorer)
    line = e.artists.lines[3]
    e.controls["params"].value = 70 * 10**9
    assert set(e.data["params"]) == {70 * 10**9}
    assert total(e.data, gpus=64, stage=3) == 17_500_000_000
    assert e.artists.lines[3] is line
    assert line.get_ydata()[-1] == pytest.approx(17.5)
    assert e.artists.end_labels[3].get_text() == "17.5 GB"
    assert "70B" in e.artists.title.get_text() and "70B parameters" in e.summary.value
    assert watch.changed()


def test_gpu_count_explorer_gpu_range(gpu_explorer):
    e, watch = gpu_explorer, Watch(gpu_explorer)
    e.controls["gpus"].value = (4, 1024)
    assert sorted(set(e.data["gpus"])) == list(range(4, 1025))
    x, y = e.artists.lines[3].get_data()
    assert x[0] == 4 and x[-1] == 1024 and y[-1] == pytest.approx(112 / 1024)
    assert e.artists.ax.get_xlim()[1] > 1024
    assert "4 to 1024 GPUs" in e.summary.value
    assert watch.changed()


def test_gpu_count_explorer_device_moves_the_reference_line(gpu_explorer):
    e, watch = gpu_explorer, Watch(gpu_explorer)
    line = e.artists.device_line
    e.controls["device"].value = "v100-32gb"
    assert e.artists.device_line is line
    assert line.get_ydata()[0] == pytest.approx(V100_GB)
    assert e.artists.device_legend_text.get_text() == "V100 32GB capacity: 32 GiB = 34.4 GB"
    assert "V100 32GB" in e.table.value
    # On a V100 (34.36 GB), 7B under stage 3 needs 112 / N <= 34.36: N = 4 (28 GB). Stage 1
    # keeps 28 GB of parameters and gradients on every GPU plus 84 / N GB of optimizer state:
    # 84 / N <= 6.36 gives N = 14 (28 + 6 = 34 GB).
    assert ("<td>ZeRO stage 3 (+ parameters)</td><td style='text-align:right'>4</td>"
            in e.table.value)
    assert "<td>ZeRO stage 1 (optimizer)</td><td style='text-align:right'>14</td>" in e.table.value
    assert watch.changed()


def test_gpu_count_explorer_unit(gpu_explorer):
    e, watch = gpu_explorer, Watch(gpu_explorer)
    e.controls["unit"].value = "GiB"
    assert np.allclose(e.artists.lines[0].get_ydata(), 112e9 / GiB)     # 104.31 GiB
    assert e.artists.device_line.get_ydata()[0] == pytest.approx(80.0)
    assert "[GiB]" in e.artists.ax.get_ylabel()
    assert e.artists.device_legend_text.get_text() == "A100 80GB capacity: 80 GiB"
    assert "104 GiB" in e.summary.value
    assert total(e.data, gpus=1, stage=0) == 112 * 10**9                 # data stay in bytes
    assert watch.changed()


def test_gpu_count_explorer_layout_preset_sets_the_byte_sliders(gpu_explorer):
    e, watch = gpu_explorer, Watch(gpu_explorer)
    redraws = e.redraws
    e.controls["layout"].value = "bf16-fp32-grads"                       # 2 + 4 + 12 bytes
    assert e.redraws == redraws + 1                                      # one redraw, not four
    assert [e.controls[f"{c}_bytes"].value for c in ("parameters", "gradients", "optimizer")] == [
        2, 4, 12]
    assert total(e.data, gpus=1, stage=0) == 126 * 10**9                 # 7e9 x 18
    assert np.all(e.artists.lines[0].get_ydata() == 126.0)
    assert "2 + 4 + 12 = 18 bytes per parameter" in e.artists.subtitle.get_text()
    assert watch.changed()


@pytest.mark.parametrize("slider, value, expected_bytes", [
    ("parameters_bytes", 4.0, 4 + 2 + 12),
    ("gradients_bytes", 0.5, 2 + 0.5 + 12),
    ("optimizer_bytes", 6.0, 2 + 2 + 6),
])
def test_gpu_count_explorer_byte_sliders_make_a_custom_layout(gpu_explorer, slider, value,
                                                              expected_bytes):
    e, watch = gpu_explorer, Watch(gpu_explorer)
    e.controls[slider].value = value
    assert e.controls["layout"].value == "custom"
    assert total(e.data, gpus=1, stage=0) == int(7e9 * expected_bytes)
    assert e.artists.lines[0].get_ydata()[0] == pytest.approx(7 * expected_bytes)
    assert f"= {expected_bytes:g} bytes per parameter" in e.artists.subtitle.get_text()
    assert watch.changed()


# --- model-size explorer ----------------------------------------------------------------------

@pytest.fixture
def size_explorer():
    return explorers.ModelSizeExplorer()


def test_model_size_explorer_starts_at_the_chapter_figure(size_explorer):
    e = size_explorer
    assert set(e.controls) == {"gpus", "models", "layout", "parameters_bytes", "gradients_bytes",
                               "optimizer_bytes", "device", "unit"}
    assert total(e.data, params=70 * 10**9, stage=3) == 17_500_000_000
    assert e.artists.bars[3].patches[-1].get_height() == pytest.approx(17.5)
    assert e.artists.value_labels[3][-1].get_text() == "17.5"
    assert "70B under ZeRO stage 3: 17.5 GB per GPU" in e.summary.value
    assert "70B needs ZeRO stage 3 or higher" in e.summary.value
    assert "1B fits even without ZeRO" in e.summary.value
    assert "30B needs ZeRO stage 2 or higher" in e.summary.value        # 66.6 GB < 85.9 GB


def test_model_size_explorer_gpu_count(size_explorer):
    e, watch = size_explorer, Watch(size_explorer)
    patches = list(e.artists.bars[3].patches)
    e.controls["gpus"].value = 1024
    assert set(e.data["gpus"]) == {1024}
    assert list(e.artists.bars[3].patches) == patches                     # same rectangles
    # 70B on 1024 GPUs: stage 3 holds 70e9 x 16 / 1024 = 1.09375 GB.
    assert total(e.data, params=70 * 10**9, stage=3) == 1_093_750_000
    assert patches[-1].get_height() == pytest.approx(1.09375)
    assert "1,024 GPUs" in e.artists.title.get_text() and "<b>1024 GPUs</b>" in e.summary.value
    assert watch.changed()
    e.controls["gpus"].value = 1
    assert "70B does not fit, even with ZeRO stage 3" in e.summary.value   # 1,120 GB on one GPU
    assert watch.changed()


def test_model_size_explorer_models_shown(size_explorer):
    e, watch = size_explorer, Watch(size_explorer)
    ax = e.artists.ax
    e.controls["models"].value = (7 * 10**9, 175 * 10**9, 405 * 10**9)
    assert sorted(set(e.data["params"])) == [7 * 10**9, 175 * 10**9, 405 * 10**9]
    assert e.artists.ax is ax and e.figure.axes == [ax]
    assert [len(c.patches) for c in e.artists.bars.values()] == [3, 3, 3, 3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["7B", "175B", "405B"]
    # 405B at 64 GPUs, stage 3: 405e9 x 16 / 64 = 101.25 GB: over the A100 even fully sharded.
    assert e.artists.bars[3].patches[-1].get_height() == pytest.approx(101.25)
    assert "405B does not fit, even with ZeRO stage 3" in e.summary.value
    assert watch.changed()


def test_model_size_explorer_with_no_model_keeps_the_last_figure(size_explorer):
    e, watch = size_explorer, Watch(size_explorer)
    data = e.data
    e.controls["models"].value = ()
    assert e.data is data and not watch.changed()
    assert "Select at least one model size" in e.summary.value


def test_model_size_explorer_device_moves_the_reference_line(size_explorer):
    e, watch = size_explorer, Watch(size_explorer)
    e.controls["device"].value = "h200-141gb"
    assert e.artists.device_line.get_ydata()[0] == pytest.approx(H200_GB)
    assert e.artists.device_legend_text.get_text() == "H200 141GB capacity: 141 GiB = 151.4 GB"
    # 70B at 64 GPUs, stage 2: (2 + 14/64) x 70 = 155.3 GB: still over 151.4 GB.
    assert "70B needs ZeRO stage 3 or higher" in e.summary.value
    assert watch.changed()


def test_model_size_explorer_unit_and_layout(size_explorer):
    e, watch = size_explorer, Watch(size_explorer)
    e.controls["unit"].value = "GiB"
    assert e.artists.bars[0].patches[-1].get_height() == pytest.approx(1120e9 / GiB)
    assert "[GiB]" in e.artists.ax.get_ylabel()
    assert watch.changed()
    e.controls["layout"].value = "adam-8bit"                            # 2 + 2 + 6 = 10 bytes
    assert total(e.data, params=70 * 10**9, stage=0) == 700 * 10**9
    assert watch.changed()
    e.controls["optimizer_bytes"].value = 12.0                          # back to 16 bytes
    assert e.controls["layout"].value == "custom"
    assert total(e.data, params=70 * 10**9, stage=3) == 17_500_000_000
    assert watch.changed()


# --- both -------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [explorers.GpuCountExplorer, explorers.ModelSizeExplorer])
def test_first_image_is_deterministic_and_matches_a_full_render(make):
    # Re-executed notebooks save the same widget state only if the first image is stable.
    first, second = make(), make()
    assert bytes(first.image.value) == bytes(second.image.value)
    for name, value in (("device", "h100-80gb"), ("unit", "GiB"), ("device", "v100-32gb")):
        first.controls[name].value = value
        # The incremental renderer gives the pixels of a full draw of the same figure.
        assert bytes(first.image.value) == plotting.IncrementalPng(first.figure).render()


def test_the_image_is_in_the_widget_state():
    e = explorers.GpuCountExplorer()
    e.controls["params"].value = 13 * 10**9
    state = e.image.get_state()
    assert bytes(state["value"]) == bytes(e.image.value) and state["format"] == "png"


def test_bad_starting_values_are_rejected():
    with pytest.raises(ValueError, match="params"):
        explorers.GpuCountExplorer(params=6 * 10**9)
    with pytest.raises(ValueError, match="gpus"):
        explorers.GpuCountExplorer(gpus=(64, 8))
    with pytest.raises(ValueError, match="device"):
        explorers.ModelSizeExplorer(device="tpu")
    with pytest.raises(ValueError, match="models"):
        explorers.ModelSizeExplorer(models=())
