"""The live explorers, driven headlessly: every control, its effect on .data and on the artists.

Setting ``control.value`` fires the observers synchronously in plain Python, as a slider move
does in a kernel. Expected numbers are worked out by hand for mixed-precision Adam (16 bytes per
parameter): 70B at 64 GPUs under stage 3 holds 70e9 x 16 / 64 = 17.5 GB per GPU; an A100 80GB
holds 85.9 GB, a V100 32GB 34.4 GB, an H200 141GB 151.4 GB.
"""
import IPython.display
import numpy as np
import pytest

from zerolib.chapter import explorers, fast_png

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
                               "optimizer_bytes", "device", "capacity", "unit"}
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
                               "optimizer_bytes", "device", "capacity", "unit"}
    assert total(e.data, params=70 * 10**9, stage=3) == 17_500_000_000
    assert e.artists.bars[3].patches[-1].get_height() == pytest.approx(17.5)
    assert e.artists.value_labels[3][-1].get_text() == "17.5"
    assert "70B under ZeRO stage 3: 17.5 GB of model state per GPU" in e.summary.value
    assert "70B: model state needs ZeRO stage 3 or higher" in e.summary.value
    assert "1B: model state fits even without ZeRO" in e.summary.value
    assert "30B: model state needs ZeRO stage 2 or higher" in e.summary.value        # 66.6 GB < 85.9 GB


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
    assert "70B: model state too big even with ZeRO stage 3" in e.summary.value   # 1,120 GB on one GPU
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
    assert "405B: model state too big even with ZeRO stage 3" in e.summary.value
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
    assert "70B: model state needs ZeRO stage 3 or higher" in e.summary.value
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
        assert bytes(first.image.value) == fast_png.IncrementalPng(first.figure).render()


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


@pytest.mark.parametrize("make", [explorers.GpuCountExplorer, explorers.ModelSizeExplorer,
                                  explorers.WillItFitExplorer])
def test_every_explorer_refuses_an_unknown_device_or_unit(make):
    with pytest.raises(ValueError, match="device must be one of"):
        make(device="tpu")
    with pytest.raises(ValueError, match="unit must be one of GB, GiB"):
        make(unit="MB")


# --- will-it-fit explorer -----------------------------------------------------------------------
#
# Worked out by hand for its start: Llama-2-7B (P = 6,738,415,616 parameters, published count; 32
# layers, h = 4096, a = 32, f = 11008 gated MLP, V = 32,000, no dropout), 8 GPUs, sequence 4096,
# micro-batch 1, selective recomputation, flash attention, mixed-precision Adam, H100 80GB
# (80 GiB = 85,899,345,920 bytes = 85.9 GB).
# Per GPU, in bytes: activations L(16sbh + 8sbf) + 4asb + 4sbh = 20,200,292,352 (Korthikanti et
# al. 2022, term by term for Llama's block: 8 h-wide and 4 f-wide 2-byte tensors per layer; the
# recomputed layer's fp32 log-sum-exp; the final norm's and output projection's inputs);
# logits + loss 6sbV = 786,432,000. Together 20,986,724,352 per sequence of the micro-batch.
# Fixed parts: DDP bucket 2P (stage 0); reduce bucket 1e9 (stages 1-3, DeepSpeed 5e8 elements
# x 2 bytes); gathered parameters 2e9 (stage 3, 1e9 live elements x 2 bytes); reserve 2 GiB.
# Persistent (P/8 = 842,301,952): stage 0 16P; stage 1 4P + 12P/8; stage 2 2P + 14P/8;
# stage 3 16P/8.
P7 = 6_738_415_616
PER_SEQUENCE = 20_200_292_352 + 786_432_000
FIXED = {0: 16 * P7 + 2 * P7 + 2 * GiB,
         1: 4 * P7 + 12 * P7 // 8 + 10**9 + 2 * GiB,
         2: 2 * P7 + 14 * P7 // 8 + 10**9 + 2 * GiB,
         3: 16 * P7 // 8 + 10**9 + 2 * 10**9 + 2 * GiB}
H100 = 80 * GiB


def peak_bytes(data, stage) -> int:
    return int(data[data["stage"] == stage]["bytes"].sum())


def term(data, stage, component) -> int:
    rows = data[(data["stage"] == stage) & (data["component"] == component)]
    assert len(rows) == 1
    return int(rows["bytes"].iloc[0])


def row(table_html, strategy) -> str:
    start = table_html.index(f"<td>{strategy}</td>")
    return table_html[start:table_html.index("</tr>", start)]


def cells(table_html, strategy) -> list[str]:
    import re
    return re.findall(r"<td[^>]*>([^<]*)</td>", row(table_html, strategy))


@pytest.fixture
def fit_explorer():
    return explorers.WillItFitExplorer()


def test_hand_numbers_of_the_will_it_fit_start():
    # Peaks 144.4, 61.2, 49.4, 39.6 GB; largest micro-batch on 8 GPUs floor((H100 - fixed) /
    # per sequence): stage 1 2.18 -> 2, stage 2 2.74 -> 2, stage 3 3.21 -> 3; stage 0 not 1.
    assert [round((FIXED[s] + PER_SEQUENCE) / 1e9, 1) for s in range(4)] == [144.4, 61.2, 49.4, 39.6]
    assert [(H100 - FIXED[s]) // PER_SEQUENCE for s in range(1, 4)] == [2, 2, 3]
    assert FIXED[0] + PER_SEQUENCE > H100


def test_will_it_fit_explorer_starts_at_the_worksheet(fit_explorer):
    e = fit_explorer
    assert set(e.controls) == {"model", "gpus", "micro_batch", "seq_len", "recompute",
                               "flash_attention", "engine", "fp8", "compile", "device",
                               "capacity", "unit"}
    assert set(e.data["model"]) == {"llama-2-7b"} and set(e.data["gpus"]) == {8}
    for stage in range(4):
        assert peak_bytes(e.data, stage) == FIXED[stage] + PER_SEQUENCE
    assert bytes(e.image.value)[:8] == b"\x89PNG\r\n\x1a\n" and e.image.format == "png"
    assert e.image in e.widget.children and e.summary in e.widget.children
    assert e.table in e.widget.children
    s = e.summary.value
    assert "<b>llama-2-7b</b> (6,738,415,616 parameters) on <b>8 GPUs</b>" in s
    assert ("Fits under ZeRO stage 1 (optimizer), ZeRO stage 2 (+ gradients) and ZeRO stage 3 "
            "(+ parameters). Too big under Plain data parallelism.") in s
    assert "activations (20.2 GB) and the logits and loss (0.79 GB)" in s
    assert "H100 80GB capacity: 80 GiB = 85.9 GB" in s
    # Fewest GPUs at micro-batch 1: stage 1 needs 26.95 GB (4P) + 12 x ceil(P/N) <= 85.9 -
    # 24.13 GB of working set: ceil(P/N) <= 2.90e9, N = 3; stage 2: 14 x ceil(P/N) <= 48.29 GB,
    # N = 2 (1.95 -> 2); stage 3: 16 x ceil(P/N) <= 85.9 - 26.13 GB, N = 2 (1.80 -> 2).
    table = e.table.value
    assert cells(table, "Plain data parallelism") == [
        "Plain data parallelism", "144 GB", "160 GB", "too big", "never", "never"]
    # the reserved peak beside each: allocated a = peak - 2 GiB, a + floor(a x 108,403 / 10^6)
    # + 2 GiB: 159.85, 67.60, 54.53, 43.67 GB
    assert cells(table, "ZeRO stage 1 (optimizer)")[1:] == ["61.2 GB", "67.6 GB", "fits", "3", "2"]
    assert cells(table, "ZeRO stage 2 (+ gradients)")[1:] == ["49.4 GB", "54.5 GB", "fits", "2", "2"]
    assert cells(table, "ZeRO stage 3 (+ parameters)")[1:] == ["39.6 GB", "43.7 GB", "fits", "2", "3"]


def test_will_it_fit_explorer_micro_batch_doubles_the_activation_terms(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    before = e.data.copy()
    bars = e.artists.bars["activations"]
    e.controls["micro_batch"].value = 2
    for stage in range(4):
        for component in ("activations", "logits_loss"):
            assert term(e.data, stage, component) == 2 * term(before, stage, component)
        for component in ("parameters", "gradients", "optimizer", "reduce_bucket",
                          "ddp_buckets", "gathered_parameters", "reserve"):
            assert term(e.data, stage, component) == term(before, stage, component)
        assert peak_bytes(e.data, stage) == FIXED[stage] + 2 * PER_SEQUENCE
    assert e.artists.bars["activations"] is bars
    assert bars.patches[0].get_height() == pytest.approx(2 * 20_200_292_352 / 1e9)
    assert e.artists.peak_labels[1].get_text() == "82.2 GB"       # 82.18 GB: still under 85.9
    assert "micro-batch 2" in e.summary.value and "activations (40.4 GB)" in e.summary.value
    # Fewest GPUs at micro-batch 2 (working set 45.12 GB, 47.12 GB at stage 3): stage 1
    # 12 x ceil(P/N) <= 85.9 - 45.12 - 26.95 GB, N = 6 (5.85 -> 6); stage 2 14 x ceil(P/N) <=
    # 27.30 GB, N = 4 (3.46 -> 4); stage 3 16 x ceil(P/N) <= 38.78 GB, N = 3 (2.78 -> 3).
    table = e.table.value
    assert "Fewest GPUs that fit (micro-batch 2)" in table
    # reserved (a + floor(a x 108,403 / 10^6) + 2 GiB, a = peak - 2 GiB): 90.86, 77.79, 66.93
    # GB; the chapter's count judges the peak, so stage 1 fits at 82.2 GB
    assert cells(table, "ZeRO stage 1 (optimizer)")[1:] == ["82.2 GB", "90.9 GB", "fits", "6", "2"]
    assert cells(table, "ZeRO stage 2 (+ gradients)")[1:] == ["70.4 GB", "77.8 GB", "fits", "4", "2"]
    assert cells(table, "ZeRO stage 3 (+ parameters)")[1:] == ["60.6 GB", "66.9 GB", "fits", "3", "3"]
    assert watch.changed()


def test_will_it_fit_explorer_gpu_count(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    e.controls["gpus"].value = 64
    # P / 64 = 105,287,744 elements per GPU for a partitioned category.
    assert term(e.data, 3, "parameters") == 2 * 105_287_744
    assert term(e.data, 2, "optimizer") == 12 * 105_287_744
    assert term(e.data, 0, "optimizer") == 12 * P7                        # not partitioned
    assert term(e.data, 3, "activations") == 20_200_292_352               # independent of N
    assert "on 64 GPUs" in e.artists.title.get_text() and "<b>64 GPUs</b>" in e.summary.value
    # Largest micro-batch on 64 GPUs, stage 2: 2P + 14 x 105,287,744 + 1e9 + 2 GiB =
    # 18.10 GB fixed; (85.90 - 18.10) / 20.99 = 3.23 -> 3 (it was 2 on 8 GPUs).
    assert cells(e.table.value, "ZeRO stage 2 (+ gradients)")[-1] == "3"
    assert "Largest micro-batch that fits (64 GPUs)" in e.table.value
    assert watch.changed()


def test_will_it_fit_explorer_sequence_length(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    e.controls["seq_len"].value = 8192
    # With flash attention and selective recomputation every stored tensor is linear in s.
    assert term(e.data, 2, "activations") == 2 * 20_200_292_352
    assert term(e.data, 2, "logits_loss") == 2 * 786_432_000
    assert "sequence 8,192" in e.artists.subtitle.get_text()
    assert watch.changed()


def test_will_it_fit_explorer_recomputation_and_flash_attention(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    sbh, sbf, asb = 4096 * 4096, 4096 * 11008, 32 * 4096
    layer = 16 * sbh + 8 * sbf                   # the 2-byte tensors a Llama layer keeps
    e.controls["recompute"].value = "full"
    # Full: each layer keeps its 2-byte input (2sbh); the layer being recomputed holds all of a
    # layer's activations (with its fp32 log-sum-exp) for a moment.
    full = 32 * 2 * sbh + (layer + 4 * asb) + 4 * sbh
    assert term(e.data, 0, "activations") == full == 1_770_520_576
    assert watch.changed()
    e.controls["recompute"].value = "none"
    assert term(e.data, 0, "activations") == 32 * (layer + 4 * asb) + 4 * sbh
    assert watch.changed()
    e.controls["flash_attention"].value = False
    # Without flash attention each layer stores its a x s x s softmax output in 2 bytes
    # (Korthikanti's 5as/h term without the dropout parts: Llama has no dropout).
    no_flash = 32 * (layer + 2 * 32 * 4096 * 4096) + 4 * sbh
    assert term(e.data, 0, "activations") == no_flash == 54_559_506_432
    assert "attention scores stored" in e.artists.subtitle.get_text()
    assert e.artists.verdict_labels[1].get_text() == "too big"            # 95.5 GB
    assert watch.changed()
    e.controls["recompute"].value = "selective"
    # Selective recomputation drops the s x s term again; the recomputed layer holds it briefly.
    assert term(e.data, 0, "activations") == 32 * layer + 2 * 32 * 4096 * 4096 + 4 * sbh
    assert watch.changed()


def test_will_it_fit_explorer_device_moves_the_capacity_line(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    line, before = e.artists.device_line, e.data
    e.controls["device"].value = "a100-40gb"
    assert e.artists.device_line is line
    assert line.get_ydata()[0] == pytest.approx(40 * GiB / 1e9)           # capacity / 1e9 GB
    assert e.artists.device_tag.get_text() == "42.9 GB"
    assert e.artists.device_legend_text.get_text() == "A100 40GB capacity: 40 GiB = 42.9 GB"
    assert e.data["bytes"].tolist() == before["bytes"].tolist()           # bytes do not move
    # On 42.95 GB only stage 3 fits (39.6 GB). Fewest GPUs: stage 2 14 x ceil(P/N) <= 42.95 -
    # 24.13 - 13.48 GB: N = 18 (17.67 -> 18); stage 3 16 x ceil(P/N) <= 42.95 - 26.13 GB:
    # N = 7 (6.41 -> 7); stage 1's 4P = 26.95 GB plus 24.13 GB never fits.
    table = e.table.value
    assert cells(table, "ZeRO stage 1 (optimizer)")[1:] == ["61.2 GB", "67.6 GB", "too big", "never",
                                                        "never"]
    assert cells(table, "ZeRO stage 2 (+ gradients)")[1:] == ["49.4 GB", "54.5 GB", "too big", "18",
                                                          "never"]
    assert cells(table, "ZeRO stage 3 (+ parameters)")[1:] == ["39.6 GB", "43.7 GB", "fits", "7", "1"]
    assert "A100 40GB" in table
    assert watch.changed()


def test_will_it_fit_explorer_unit(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    data = e.data
    e.controls["unit"].value = "GiB"
    assert e.artists.device_line.get_ydata()[0] == pytest.approx(80.0)
    assert e.artists.device_tag.get_text() == "80.0 GiB"
    assert "[GiB]" in e.artists.ax.get_ylabel()
    assert peak_bytes(e.data, 3) == peak_bytes(data, 3)                   # data stay in bytes
    # 39,611,039,232 bytes = 36.89 GiB.
    assert e.artists.peak_labels[3].get_text() == "36.9 GiB"
    assert cells(e.table.value, "ZeRO stage 3 (+ parameters)")[1] == "36.9 GiB"
    assert watch.changed()


def test_will_it_fit_explorer_model(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    e.controls["model"].value = "llama-3-8b"
    assert set(e.data["model"]) == {"llama-3-8b"}
    # Llama-3's 128,256-token vocabulary: (2 + 4) bytes x 4096 x 128,256 = 3.15 GB of logits.
    assert term(e.data, 0, "logits_loss") == 6 * 4096 * 128_256
    assert term(e.data, 0, "parameters") == 2 * 8_030_261_248             # published count
    assert "(8,030,261,248 parameters)" in e.summary.value
    assert "llama-3-8b" in e.artists.title.get_text()
    assert watch.changed()
    e.controls["model"].value = "llama-2-70b"
    # 70B on 8 GPUs: stage 3 alone holds 16 x 68,976,648,192 / 8 = 138 GB of model state.
    assert "Fits under no strategy: the smallest peak is" in e.summary.value
    assert peak_bytes(e.data, 3) > 16 * 68_976_648_192 // 8 > H100
    assert [e.artists.verdict_labels[s].get_text() for s in range(4)] == ["too big"] * 4


def test_will_it_fit_explorer_keeps_the_sequence_within_the_models_context(fit_explorer):
    e, watch = fit_explorer, Watch(fit_explorer)
    redraws = e.redraws
    e.controls["model"].value = "gpt2"           # learned positions up to 1,024 tokens
    # The sequence control now ends at 1,024 and moved there: one redraw, nothing refused.
    assert [n for _, n in e.controls["seq_len"].options][-1] == 1024
    assert e.controls["seq_len"].value == 1024 and e.settings.seq_len == 1024
    assert set(e.data["model"]) == {"gpt2"} and watch.changed() and e.redraws == redraws + 1
    assert e.status.value == ""
    # GPT-2 small (124M parameters: 2 GB of model state) fits an H100 however it is run, with
    # more sequences per GPU than the slider offers: the table says where the search stopped.
    assert "Fits under every strategy, even plain data parallelism." in e.summary.value
    assert cells(e.table.value, "ZeRO stage 3 (+ parameters)")[-1] == "64 or more"
    # Back to a rotary model: the whole range returns, the sequence stays where it was.
    e.controls["model"].value = "llama-2-7b"
    assert [n for _, n in e.controls["seq_len"].options][-1] == 131072
    assert e.controls["seq_len"].value == 1024


def test_a_setting_that_cannot_be_drawn_is_reported_and_the_explorer_recovers(fit_explorer,
                                                                              monkeypatch):
    e = fit_explorer
    image, data = bytes(e.image.value), e.data
    real_update = type(e)._update

    def refuse(self):
        raise ValueError("seq_len must be at most 1024 for gpt2")
    monkeypatch.setattr(type(e), "_update", refuse)
    e.controls["micro_batch"].value = 2
    assert "Not redrawn" in e.status.value and "at most 1024" in e.status.value
    assert "last setting that could be drawn" in e.status.value
    assert bytes(e.image.value) == image and e.data is data
    monkeypatch.setattr(type(e), "_update", real_update)
    e.controls["micro_batch"].value = 3        # the next change draws and clears the message
    assert e.status.value == "" and bytes(e.image.value) != image


def test_will_it_fit_first_image_is_deterministic_and_matches_a_full_render():
    first, second = explorers.WillItFitExplorer(), explorers.WillItFitExplorer()
    assert bytes(first.image.value) == bytes(second.image.value)
    for name, value in (("device", "a100-40gb"), ("unit", "GiB"), ("micro_batch", 3),
                        ("model", "mistral-7b-v0.1")):
        first.controls[name].value = value
        assert bytes(first.image.value) == fast_png.IncrementalPng(first.figure).render()


def test_will_it_fit_bad_starting_values_are_rejected():
    with pytest.raises(ValueError, match="model"):
        explorers.WillItFitExplorer(model="llama-9b")
    with pytest.raises(ValueError, match="gpus"):
        explorers.WillItFitExplorer(gpus=0)
    with pytest.raises(ValueError, match="micro_batch"):
        explorers.WillItFitExplorer(micro_batch=65)
    with pytest.raises(ValueError, match="seq_len"):
        explorers.WillItFitExplorer(seq_len=5000)
    with pytest.raises(ValueError, match="recompute"):
        explorers.WillItFitExplorer(recompute="some")
    with pytest.raises(TypeError, match="flash_attention"):
        explorers.WillItFitExplorer(flash_attention="yes")
    with pytest.raises(ValueError, match="seq_len must be one of 128, 256, 512, 1024 for gpt2"):
        explorers.WillItFitExplorer(model="gpt2", seq_len=4096)
