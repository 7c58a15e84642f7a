"""A legend's drawing calls remembered under its state (fast_png.legend_state): the dry run is
skipped only when nothing that can touch its pixels changed, and every image stays the full
render's, byte for byte."""
import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from zerolib.chapter import explorers, fast_png


def full_render(figure) -> bytes:
    return fast_png.IncrementalPng(figure).render()


def legend_figure(**legend_options):
    figure = Figure(figsize=(4, 3), dpi=60)
    FigureCanvasAgg(figure)
    ax = figure.add_axes((0.1, 0.1, 0.5, 0.8))
    line, = ax.plot([0, 1], [0, 1], color="C0", label="first")
    bars = ax.bar([0.5], [0.5], color="C1", label="second")
    legend = ax.legend(loc=legend_options.pop("loc", "upper left"),
                       bbox_to_anchor=(1.0, 1.0), **legend_options)
    return figure, ax, legend, line, bars


def test_an_unchanged_legend_skips_its_dry_run():
    figure, _, legend, _, _ = legend_figure()
    renderer = fast_png.IncrementalPng(figure, [legend])
    for _ in range(3):
        assert renderer.render() == full_render(figure)
    # The first render lays it out, the second from the state that draw left; then it is known.
    assert renderer.dry_runs_skipped >= 1


CHANGES = {
    "text": lambda f, ax, legend: legend.get_texts()[0].set_text("renamed"),
    "text colour": lambda f, ax, legend: legend.get_texts()[1].set_color("#aa0000"),
    # In place, through the shared FontProperties: no setter, no stale flag.
    "font size in place": lambda f, ax, legend: legend.get_texts()[0].get_fontproperties()
    .set_size(14),
    "handle colour": lambda f, ax, legend: legend.legend_handles[0].set_color("#00aa00"),
    "handle width in place": lambda f, ax, legend: legend.legend_handles[0]
    .__setattr__("_linewidth", 6.0),
    "frame": lambda f, ax, legend: legend.get_frame().set_edgecolor("#0000ff"),
    "axes moved": lambda f, ax, legend: ax.set_position((0.1, 0.3, 0.4, 0.5)),
    "anchor": lambda f, ax, legend: legend.set_bbox_to_anchor((1.0, 0.6)),
    "figure size": lambda f, ax, legend: f.set_size_inches(5, 3),
    "dpi": lambda f, ax, legend: f.set_dpi(72),
    "title": lambda f, ax, legend: legend.set_title("Legend"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_whatever_touches_the_legend_is_drawn_afresh(change):
    figure, ax, legend, _, _ = legend_figure()
    renderer = fast_png.IncrementalPng(figure, [legend])
    for _ in range(3):
        renderer.render()
    before = renderer.render()
    CHANGES[change](figure, ax, legend)
    after = renderer.render()
    assert after == full_render(figure)
    assert after != before, change


def test_an_rc_setting_read_at_draw_time_is_part_of_the_state():
    figure, _, legend, _, _ = legend_figure()
    renderer = fast_png.IncrementalPng(figure, [legend])
    for _ in range(3):
        renderer.render()
    with matplotlib.rc_context({"hatch.color": "#ff0000"}):
        state = fast_png.legend_state(legend, figure.canvas.get_renderer())
    assert state != fast_png.legend_state(legend, figure.canvas.get_renderer())


def test_a_legend_placed_best_always_has_its_dry_run():
    # "best" reads the data in the axes, which are not the legend's state.
    figure, ax, legend, line, _ = legend_figure(loc="best")
    renderer = fast_png.IncrementalPng(figure, [legend])
    for y in ([0, 1], [1, 0], [0, 1], [1, 0]):
        line.set_ydata(y)
        assert renderer.render() == full_render(figure)
    assert renderer.dry_runs_skipped == 0


@pytest.mark.parametrize("kind, changes", [
    ("will_it_fit", [("unit", "GiB"), ("device", "a100-40gb"), ("unit", "GB"),
                     ("model", "gpt2"), ("recompute", "full"), ("model", "llama-2-7b"),
                     ("device", "h100-80gb"), ("unit", "GiB"), ("capacity", "GiB")]),
    ("planner", [("unit", "GiB"), ("gpus", 128), ("unit", "GB"), ("model", "llama-2-13b"),
                 ("device", "h100-80gb"), ("unit", "GiB"), ("gpus", 64)]),
])
def test_legend_changing_controls_give_a_full_render(kind, changes):
    explorer = {"will_it_fit": explorers.WillItFitExplorer,
                "planner": explorers.PlannerExplorer}[kind]()
    explorer._renderer.shown_kept = 0    # every change draws (none is given back by its key)
    for name, value in changes * 2:
        control = explorer.controls[name]
        options = [o[1] if isinstance(o, tuple) else o for o in getattr(control, "options", ())]
        if options and value not in options:
            value = options[-1]
        control.value = value
        assert bytes(explorer.image.value) == full_render(explorer.figure), name
    assert explorer._renderer.dry_runs_skipped > 0
