"""Memory against step time draws what differs: the x axis fits compute time to step time.

The chapter's setting (Llama-2-7B on 64 H100 in DGX H100 nodes, 4,096 tokens per GPU, 40 % of
peak; worked out in test_step_charts.py): compute 0.418401 s, the slowest stage (1 or 2) about
0.45 s. On an axis from 0 to 0.49 s those 0.03 s were 7 % of the width. Here the points and
segments must span at least half of the axis, the axis must say where it starts, and every frame
the explorer can draw must get the limits a fresh draw of that frame gets.
"""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerolib.chapter import explorers
from zerolib.chapter.charts.tradeoff import memory_vs_step_time_figure, update_memory_vs_step_time
from zerolib.chapter.figures import MEMORY_VS_STEP_TIME, published_data, published_figure
from zerolib.core.catalogue.links import LINKS
from zerolib.core.catalogue.nodes import NODES
from zerolib.core.memory.working_set import WorkingSetSettings
from zerolib.core.step.engines import ENGINES
from zerolib.core.step.tables import tradeoff_frame

# (6 M + 3 A) x 4,096 / (0.4 x 989.5e12), by hand: M = 6,607,343,616 multiplied parameters
# (the 32,000 x 4,096 input embedding is looked up), A = 1,073,741,824 causal core FLOPs.
COMPUTE_SECONDS = 0.443598


def data_extent(frame):
    """Where the drawn data lies along x: from the earliest compute time to the slowest step."""
    return (float(min(frame["compute_seconds"].min(), frame["step_seconds"].min())),
            float(frame["step_seconds"].max()))


def share_of_axis(ax, frame) -> float:
    low, high = data_extent(frame)
    left, right = ax.get_xlim()
    return (high - low) / (right - left)


def assert_fitted(ax, frame):
    low, high = data_extent(frame)
    left, right = ax.get_xlim()
    assert left <= low and high <= right, (left, right, low, high)
    # The axis label names its start, in seconds, whenever it does not start at 0.
    match = re.search(r"axis starts at ([0-9.,]+) s", ax.get_xlabel())
    assert match, ax.get_xlabel()
    assert float(match.group(1).replace(",", "")) == pytest.approx(left, rel=1e-9, abs=1e-12)
    if high - low >= 0.005 * high:   # half a per cent of the step: a difference at all
        assert share_of_axis(ax, frame) >= 0.5, (left, right, low, high)


def test_the_published_figure_spends_most_of_its_axis_on_the_difference():
    figure = published_figure(MEMORY_VS_STEP_TIME)
    ax = figure.axes[0]
    frame = published_data(MEMORY_VS_STEP_TIME)
    left, _ = ax.get_xlim()
    assert float(frame["compute_seconds"].iloc[0]) == pytest.approx(COMPUTE_SECONDS, rel=1e-5)
    assert 0.3 < left <= COMPUTE_SECONDS      # not from 0, and the compute line in view
    assert_fitted(ax, frame)
    assert share_of_axis(ax, frame) >= 0.5


def test_an_axis_from_zero_would_have_squeezed_the_difference():
    # What the figure looked like before: 0 to 1.08 x the slowest step.
    frame = published_data(MEMORY_VS_STEP_TIME)
    low, high = data_extent(frame)
    assert (high - low) / (1.08 * high) < 0.1


def test_equal_step_times_sit_inside_a_window_named_by_the_label():
    # One GPU: nothing to communicate, every stage's step is the compute alone.
    frame = tradeoff_frame("llama-2-7b", 1, "dgx-h100", "h100-80gb")
    assert frame["step_seconds"].nunique() == 1
    figure, artists = memory_vs_step_time_figure(frame)
    left, right = artists.ax.get_xlim()
    step = float(frame["step_seconds"].iloc[0])
    assert left < step < right
    assert_fitted(artists.ax, frame)


frames = st.fixed_dictionaries({
    "model": st.sampled_from(["gpt2", "llama-2-7b", "llama-2-13b", "llama-2-70b"]),
    "gpus": st.sampled_from([1, 2, 8, 16, 64, 256, 1024]),
    "link": st.sampled_from([*NODES, *LINKS]),
    "micro_batch": st.integers(1, 8),
    "mfu": st.sampled_from([0.1, 0.25, 0.4, 0.6, 0.8]),
    "engine": st.sampled_from(list(ENGINES)),
})


def frame_of(case):
    seq = 1024 if case["model"] == "gpt2" else 4096
    return tradeoff_frame(case["model"], case["gpus"], case["link"], "h100-80gb",
                          WorkingSetSettings(seq_len=seq, micro_batch=case["micro_batch"]),
                          case["mfu"], engine=case["engine"])


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(first=frames, second=frames)
def test_random_frames_fill_the_axis_and_an_update_sets_a_fresh_draws_limits(first, second):
    a, b = frame_of(first), frame_of(second)
    figure, artists = memory_vs_step_time_figure(a)
    assert_fitted(artists.ax, a)
    fresh, fresh_artists = memory_vs_step_time_figure(b)
    if set(b["stage"]) <= set(artists.stages):
        update_memory_vs_step_time(artists, b)
        assert artists.ax.get_xlim() == fresh_artists.ax.get_xlim()
        assert artists.ax.get_ylim() == fresh_artists.ax.get_ylim()
        assert artists.ax.get_xlabel() == fresh_artists.ax.get_xlabel()
    assert_fitted(fresh_artists.ax, b)


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_explorer_frame_gets_the_limits_of_a_fresh_draw(data):
    explorer = explorers.StepTimeExplorer()
    for _ in range(data.draw(st.integers(1, 4), label="changes")):
        name = data.draw(st.sampled_from(["model", "gpus", "link", "gpus_per_node",
                                          "tokens_per_gpu", "mfu", "engine"]), label="control")
        control = explorer.controls[name]
        options = [o[1] if isinstance(o, tuple) else o for o in getattr(control, "options", ())]
        if options:
            value = data.draw(st.sampled_from(options), label=name)
        else:
            steps = round((control.max - control.min) / control.step)
            value = round(control.min + data.draw(st.integers(0, steps)) * control.step, 6)
        control.value = value
    ax = explorer.artists.ax
    _, fresh = memory_vs_step_time_figure(explorer.data, explorer.device, explorer.unit)
    assert ax.get_xlim() == fresh.ax.get_xlim()
    assert ax.get_xlabel() == fresh.ax.get_xlabel()
    assert_fitted(ax, explorer.data)
    assert np.isfinite(ax.get_xlim()).all()
