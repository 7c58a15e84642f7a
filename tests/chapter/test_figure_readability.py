"""Every figure on the main path reads at the notebook's width: text at least 10 px, and no label
on the capacity line or on another label.

Displayed size: JupyterLab shows a PNG at its own pixel size unless it is wider than the cell,
about 1,000 px in a default window, where it is scaled down to the cell. A text of s points in a
figure of w inches at d dpi is then s x d / 72 x min(1, 1000 / (w x d)) px on screen. The
notebooks draw at 100 dpi, ``figures/`` at 150 dpi, and the explorers show their PNG at its own
size (never scaled, :func:`zerolib.chapter.explorers.panel.shown_at_own_size`).

Overlaps come from the Agg renderer's bounding boxes (``get_window_extent``): each text in the
axes (data labels, value labels, verdicts, the capacity tag, the title and subtitle) against
every other and against the capacity line's extent.
"""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.text import Text

import zerolib as zl
from zerolib.chapter import explorers
from zerolib.chapter.figures import PNG_DPI, PUBLISHED, published_figure
from zerolib.chapter.style import DEVICE_COLOR

CELL_WIDTH_PX = 1000
SMALLEST_PX = 10
NOTEBOOK_DPI = 100


def displayed_px(figure, text, shown_at_own_size=False) -> float:
    width = figure.get_size_inches()[0] * figure.dpi
    scale = 1.0 if shown_at_own_size else min(1.0, CELL_WIDTH_PX / width)
    return text.get_fontsize() * figure.dpi / 72 * scale


def shown_texts(figure):
    return [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]


def too_small(figure, shown_at_own_size=False):
    return sorted({(round(displayed_px(figure, t, shown_at_own_size), 2), t.get_text()[:40])
                   for t in shown_texts(figure)
                   if displayed_px(figure, t, shown_at_own_size) < SMALLEST_PX})


def overlaps(figure):
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    found = []
    for ax in figure.axes:
        texts = [t for t in [*ax.texts, ax.title] if t.get_visible() and t.get_text().strip()]
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
        for i, (a, box_a) in enumerate(boxes):
            found += [(a, b) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]
        for line in ax.lines:
            if line.get_visible() and str(line.get_color()).lower() == DEVICE_COLOR.lower():
                extent = line.get_window_extent(renderer)
                found += [(a, "the capacity line") for a, box in boxes if box.overlaps(extent)]
    return found


def will_it_fit_04():
    # 04's figure: Llama-2-7B on 8 H100 80GB, one 4,096-token sequence, selective recomputation.
    settings_ = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")
    return zl.will_it_fit_figure(zl.peak_frame("llama-2-7b", 8, zl.STAGES, settings_),
                                 "h100-80gb")[0]


def slow_timeline():
    # 05's second timeline: the same run over InfiniBand NDR alone.
    return zl.step_timeline_figure(zl.timeline_frame("llama-2-7b", 64, "ib-ndr", "h100-80gb"))[0]


FIGURES = {
    **{f"{name} at {dpi} dpi": (lambda name=name, dpi=dpi: published_figure(name, dpi=dpi))
       for name in PUBLISHED for dpi in (NOTEBOOK_DPI, PNG_DPI)},
    "04's will-it-fit figure": will_it_fit_04,
    "05's timeline over InfiniBand": slow_timeline,
}

# The notebooks' explorers at the settings the notebooks give them, and at their defaults.
EXPLORERS = {
    "GPU count (02)": lambda: explorers.GpuCountExplorer(params=70_000_000_000, gpus=(1, 1024)),
    "model size (03)": lambda: explorers.ModelSizeExplorer(gpus=8),
    "will it fit (04)": lambda: explorers.WillItFitExplorer(
        model="llama-2-7b", gpus=8, micro_batch=2, seq_len=4096, recompute="selective",
        flash_attention=True, device="h100-80gb"),
    "step time (05)": lambda: explorers.StepTimeExplorer(engine="paper"),
    "GPU count": explorers.GpuCountExplorer,
    "model size": explorers.ModelSizeExplorer,
    "will it fit": explorers.WillItFitExplorer,
    "step time": explorers.StepTimeExplorer,
}


@pytest.mark.parametrize("name", FIGURES)
def test_published_and_notebook_figures_are_readable(name):
    figure = FIGURES[name]()
    assert too_small(figure) == []
    assert overlaps(figure) == []


@pytest.mark.parametrize("name", EXPLORERS)
def test_explorer_figures_are_readable(name):
    figure = EXPLORERS[name]().figure
    assert too_small(figure, shown_at_own_size=True) == []
    assert overlaps(figure) == []


def control_values(control):
    w = explorers.base.widgets()
    if isinstance(control, w.Checkbox):
        return st.booleans()
    if isinstance(control, w.SelectionRangeSlider):
        options = [value for _, value in control.options]
        return st.tuples(st.sampled_from(options), st.sampled_from(options)).map(sorted).map(tuple)
    if isinstance(control, w.SelectMultiple):
        options = [value for _, value in control.options]
        return st.lists(st.sampled_from(options), min_size=1, max_size=5, unique=True).map(tuple)
    if isinstance(control, (w.Dropdown, w.ToggleButtons, w.SelectionSlider)):
        return st.sampled_from([o[1] if isinstance(o, tuple) else o for o in control.options])
    if isinstance(control, w.IntSlider):
        return st.integers(control.min, control.max)
    if isinstance(control, w.FloatSlider):
        steps = round((control.max - control.min) / control.step)
        return st.integers(0, steps).map(lambda k: round(control.min + k * control.step, 6))
    raise AssertionError(f"no strategy for {type(control).__name__}")


RANDOM = {"GPU count": explorers.GpuCountExplorer, "model size": explorers.ModelSizeExplorer,
          "will it fit": explorers.WillItFitExplorer, "step time": explorers.StepTimeExplorer}


@pytest.mark.parametrize("kind", RANDOM)
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_explorer_figures_stay_readable_at_random_settings(kind, data):
    explorer = RANDOM[kind]()
    names = sorted(explorer.controls)
    for _ in range(data.draw(st.integers(1, 5), label="changes")):
        name = data.draw(st.sampled_from(names), label="control")
        try:
            explorer.controls[name].value = data.draw(control_values(explorer.controls[name]),
                                                      label=name)
        except Exception:   # a value the control refuses is no setting a reader reaches
            continue
    assert too_small(explorer.figure, shown_at_own_size=True) == []
    assert overlaps(explorer.figure) == []
