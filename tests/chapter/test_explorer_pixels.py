"""Every explorer image is the figure's full render, byte for byte, whatever the controls did.

The explorers render through :class:`zerolib.chapter.fast_png.IncrementalPng`, which re-uses
the pixels of texts drawn before. A full render here is a plain ``canvas.draw()`` through the
same PNG encoder (``IncrementalPng(figure)`` with no blocks), so the two must be equal bytes.
Random control sequences in every explorer, plus the sequences that once left stale text.
Explorers keep images under their control values and draw neighbouring settings ahead of the
reader (``Explorer.prefetch``); random sequences with such steps in between must show what a
twin explorer that never drew ahead shows, image and texts, and the full render of its figure.
"""
import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import zerolib as zl
from zerolib.chapter import explorers, fast_png

EXPLORERS = {
    "gpu_count": explorers.GpuCountExplorer,
    "model_size": explorers.ModelSizeExplorer,
    "will_it_fit": explorers.WillItFitExplorer,
    "placement": explorers.PlacementExplorer,
    "step_time": explorers.StepTimeExplorer,
    "planner": explorers.PlannerExplorer,
    "shards": explorers.ShardExplorer,
}


def full_render(explorer) -> bytes:
    return fast_png.IncrementalPng(explorer.figure).render()


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def values(control):
    """A strategy over the values a reader could give ``control`` now, ends half the time (where
    labels grow longest or move farthest)."""
    w = explorers.base.widgets()
    if isinstance(control, w.Checkbox):
        return st.booleans()
    if isinstance(control, w.SelectionRangeSlider):
        options = [value for _, value in control.options]
        ends = [(options[0], options[0]), (options[-1], options[-1]), (options[0], options[-1])]
        pairs = st.tuples(st.sampled_from(options), st.sampled_from(options)).map(sorted).map(tuple)
        return st.one_of(st.sampled_from(ends), pairs)
    if isinstance(control, w.SelectMultiple):
        options = [value for _, value in control.options]
        return st.lists(st.sampled_from(options), min_size=1, max_size=5, unique=True).map(tuple)
    if isinstance(control, (w.Dropdown, w.ToggleButtons, w.SelectionSlider)):
        options = [o[1] if isinstance(o, tuple) else o for o in control.options]
        return st.one_of(st.sampled_from([options[0], options[-1]]), st.sampled_from(options))
    if isinstance(control, w.IntSlider):
        return st.one_of(st.sampled_from([control.min, control.max]),
                         st.integers(control.min, control.max))
    if isinstance(control, w.FloatSlider):
        steps = round((control.max - control.min) / control.step)
        return st.one_of(st.sampled_from([0, steps]), st.integers(0, steps)).map(
            lambda k: round(control.min + k * control.step, 6))
    raise AssertionError(f"no strategy for {type(control).__name__}")


@pytest.mark.parametrize("kind", EXPLORERS)
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_control_changes_give_the_pixels_of_a_full_render(kind, data):
    explorer = EXPLORERS[kind]()
    assert bytes(explorer.image.value) == full_render(explorer)
    names = sorted(explorer.controls)
    for _ in range(data.draw(st.integers(1, 6), label="changes")):
        name = data.draw(st.sampled_from(names), label="control")
        explorer.controls[name].value = data.draw(values(explorer.controls[name]), label=name)
        assert bytes(explorer.image.value) == full_render(explorer), name


def sliders(explorer) -> list[str]:
    w = explorers.base.widgets()
    return sorted(name for name, control in explorer.controls.items()
                  if isinstance(control, (w.SelectionSlider, w.IntSlider)))


def shown(explorer) -> tuple:
    return (bytes(explorer.image.value), explorer.summary.value, explorer.table.value,
            explorer.status.value)


@pytest.mark.parametrize("kind", EXPLORERS)
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_drawing_ahead_changes_nothing_shown_and_every_move_shows_a_fresh_render(kind, data):
    explorer, twin = EXPLORERS[kind](), EXPLORERS[kind]()
    names = sorted(explorer.controls)
    for _ in range(data.draw(st.integers(1, 6), label="steps")):
        if data.draw(st.booleans(), label="ahead"):
            # A setting drawn ahead: one slider's value, or its neighbour (what the kernel's
            # idle callback draws), the other controls as they are.
            name = data.draw(st.sampled_from(sliders(explorer)), label="slider")
            before = shown(explorer)
            value = data.draw(values(explorer.controls[name]), label=name)
            explorer.prefetch(name, value)
            assert shown(explorer) == before, name
            assert bytes(explorer.image.value) == full_render(explorer), name
            if data.draw(st.booleans(), label="then moved there"):
                explorer.controls[name].value = value
                twin.controls[name].value = value
        else:
            name = data.draw(st.sampled_from(names), label="control")
            value = data.draw(values(explorer.controls[name]), label=name)
            explorer.controls[name].value = value
            twin.controls[name].value = value
        assert shown(explorer) == shown(twin), name
        assert bytes(explorer.image.value) == full_render(explorer), name


def test_a_data_label_drawn_over_the_subtitle_does_not_stay_there():
    # At one GPU the "112 GB" label of plain data parallelism sits on the subtitle; at 64 GPUs
    # it has moved away, and the subtitle must show again without it.
    explorer = zl.GpuCountExplorer()
    explorer.controls["gpus"].value = (1, 1)
    explorer.controls["gpus"].value = (1, 64)
    image = bytes(explorer.image.value)
    assert image == full_render(explorer)
    assert np.array_equal(pixels(image), pixels(zl.render_png(explorer.figure, dpi=explorer.dpi)))


def test_tick_labels_that_change_show_whole():
    # 405B at 131,072 tokens: the y ticks run to millions of GB; after two changes they must
    # not keep pixels of the earlier labels (once shown as ",000,000").
    explorer = zl.WillItFitExplorer(model="llama-3.1-405b", seq_len=131072, micro_batch=24)
    explorer.controls["recompute"].value = "none"
    explorer.controls["flash_attention"].value = False
    image = bytes(explorer.image.value)
    assert image == full_render(explorer)
    assert np.array_equal(pixels(image), pixels(zl.render_png(explorer.figure, dpi=explorer.dpi)))


def test_the_step_time_subtitle_keeps_no_fragment_of_a_label():
    # Found by random control sequences against the earlier cache (which pasted a label's
    # fragment back into the subtitle); four changes suffice.
    explorer = zl.StepTimeExplorer()
    for name, value in [("tokens_per_gpu", 65536), ("device", "t4-16gb"), ("model", "gpt2"),
                        ("model", "llama-2-7b")]:
        explorer.controls[name].value = value
        assert bytes(explorer.image.value) == full_render(explorer), (name, value)


def test_a_block_that_cannot_be_compared_is_drawn_afresh():
    # A text drawn through a filter is not recorded; it must still appear as in a full draw.
    explorer = zl.GpuCountExplorer()
    explorer.artists.subtitle.set_agg_filter(lambda image, dpi: (image, 0, 0))
    assert explorer._renderer.render() == full_render(explorer)


def test_settings_the_recorder_cannot_compare_draw_everything_afresh():
    # Path effects set in rcParams are objects the cache key cannot hold: nothing is re-used.
    import matplotlib
    from matplotlib import patheffects

    explorer = zl.GpuCountExplorer()
    renderer = explorer._renderer
    with matplotlib.rc_context({"path.effects": [patheffects.Normal()]}):
        before = renderer.full_draws
        assert renderer.render() == full_render(explorer)
        assert renderer.full_draws == before + 1


# The planner explorer remembers plans, texts and encoded images; moves among a few values
# return to settings often, and every image must be that of a figure drawn afresh from a plan
# made afresh.
PLANNER_MOVES = {"gpus": [64, 128], "device": ["a100-80gb", "h100-80gb"], "unit": ["GB", "GiB"],
                 "seq_len": [4096, 8192], "shard_groups": ["all", "whole"]}


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(moves=st.lists(st.sampled_from([(name, value) for name, values in PLANNER_MOVES.items()
                                       for value in values]), min_size=2, max_size=7))
def test_the_planner_explorer_shows_a_fresh_plan_drawn_afresh_whatever_it_remembers(moves):
    from zerolib.chapter.charts.plan_peaks import plan_peaks_figure

    explorer = explorers.PlannerExplorer()
    for name, value in moves:
        explorer.controls[name].value = value
        fresh_plan = explorer._plan()                     # made again, not remembered
        figure, _ = plan_peaks_figure(fresh_plan.valid, explorer.unit, dpi=explorer.dpi)
        image = bytes(explorer.image.value)
        assert image == full_render(explorer), (name, value)
        assert image == fast_png.IncrementalPng(figure).render(), (name, value)
        assert explorer.summary.value == explorers.planner.summary_html(fresh_plan, explorer.unit)
        assert explorer.table.value == explorers.planner.ranking_html(fresh_plan, explorer.unit)
