"""The planner figure's frontier: the Pareto set of (step time, peak), checked against a
brute-force comparison of every pair; what the figure draws of it; where its labels go; and that
updating the figure gives the pixels of a fresh draw for any sequence of plans."""
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_rgba
from matplotlib.transforms import Bbox

from zerolib.chapter import fast_png
from zerolib.chapter.charts.plan_peaks import (
    BEST_LABEL,
    FAMILIES,
    FAMILY_COLORS,
    frontier,
    plan_peaks_figure,
    update_plan_peaks,
)
from zerolib.core.planner import plan


def pareto_by_pairs(step, peak) -> set:
    """Row i is on the frontier when no row j is at most as slow and at most as large, and
    better in one of the two: every pair compared."""
    step, peak = np.asarray(step)[:, None], np.asarray(peak)[:, None]
    # [i, j]: row j dominates row i.
    dominated = ((step.T <= step) & (peak.T <= peak) & ((step.T < step) | (peak.T < peak))).any(axis=1)
    return set(np.flatnonzero(~dominated).tolist())


# Few distinct values, so that ties in either coordinate and exact duplicates are common.
coordinates = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(points=coordinates)
def test_the_frontier_is_the_pareto_set(points):
    step = np.array([p[0] for p in points], dtype=float)
    peak = np.array([p[1] for p in points], dtype=float)
    got = frontier(step, peak)
    assert set(got.tolist()) == pareto_by_pairs(step, peak)
    assert len(set(got.tolist())) == len(got)
    # Fastest first; along it the peak never grows.
    assert (np.diff(step[got]) >= 0).all() and (np.diff(peak[got]) <= 0).all()


def test_the_frontier_by_hand():
    # (1, 9) fastest; (2, 5) and its twin; (3, 5) is as large as (2, 5) and slower: off;
    # (3, 4) smaller; (5, 1); (4, 6) is above (3, 4): off.
    step = [3, 1, 2, 5, 2, 3, 4]
    peak = [5, 9, 5, 1, 5, 4, 6]
    assert frontier(step, peak).tolist() == [1, 2, 4, 5, 3]
    assert frontier([], []).tolist() == []
    assert frontier([1.0, np.nan, 0.5], [1.0, 0.1, np.inf]).tolist() == [0]
    with pytest.raises(ValueError, match="step and peak must be 1-D arrays of one length"):
        frontier([1, 2], [1])


@pytest.fixture(scope="module")
def a100():
    return plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024)


def drawn(collection) -> set:
    return {tuple(row) for row in np.round(collection.get_offsets(), 9)}


def test_the_figure_draws_the_frontier_prominently_and_the_rest_faded(a100):
    valid = a100.valid
    _, artists = plan_peaks_figure(valid)
    step = valid["step_seconds"].to_numpy()
    peak = valid["peak_bytes"].to_numpy() / 1e9
    on = frontier(step, peak).tolist()           # fastest first, the order drawn
    assert set(on) == pareto_by_pairs(step, peak)
    # Every configuration drawn once: the frontier's in its family's colours, the rest in grey.
    ours = sum(len(artists.points[name].get_offsets()) for name in FAMILIES)
    assert ours == len(on) and ours + len(artists.rest.get_offsets()) == len(valid)
    assert 10 < ours < 100          # a few dozen of 4,056
    family = valid["family"].astype(str).to_numpy()
    fits = valid["fits"].to_numpy()
    for name in FAMILIES:
        mine = [i for i in on if family[i] == name]
        assert drawn(artists.points[name]) == {(round(step[i], 9), round(peak[i], 9)) for i in mine}
        # Filled in the family's colour where it fits, white where it does not.
        faces = artists.points[name].get_facecolors()
        want = [to_rgba(FAMILY_COLORS[name] if fits[i] else "white") for i in mine]
        if not mine:
            continue
        assert len(faces) == len(want) and all(np.allclose(f, w) for f, w in zip(faces, want))
    # The staircase joins them fastest first; the planner's first is on it, ringed and labelled.
    xs, ys = artists.frontier_line.get_data()
    assert list(xs) == sorted(xs) and len(xs) == len(on)
    best = a100.fits.iloc[0]
    assert (round(best["step_seconds"], 9), round(best["peak_bytes"] / 1e9, 9)) in \
        {(round(x, 9), round(y, 9)) for x, y in zip(xs, ys)}
    assert np.allclose(artists.best.get_offsets(), [[best["step_seconds"], best["peak_bytes"] / 1e9]])
    assert artists.best_label.get_text() == BEST_LABEL and artists.best_label.get_visible()
    assert artists.rest.get_alpha() < 0.5


def label_box(figure, text):
    """The label's extent with its white backing, and the axes'."""
    renderer = figure.canvas.get_renderer()
    box = Bbox.union([text.get_window_extent(renderer),
                      text.get_bbox_patch().get_window_extent(renderer)])
    return box, text.axes.get_window_extent(renderer)


def line_y(figure, artists):
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    return artists.ax.transData.transform([[1, artists.device_line.get_ydata()[0]]])[0, 1]


@pytest.mark.parametrize("device, gpus", [("a100-80gb", 64), ("h100-80gb", 64), ("a100-80gb", 8),
                                          ("h100-80gb", 256)])
def test_labels_stay_in_the_axes_on_their_side_of_the_capacity_line(device, gpus):
    result = plan("llama-2-70b", gpus, 8, device, 4096, 1024)
    valid = result.valid
    rows = np.random.default_rng(gpus).choice(len(valid), 4, replace=False)
    named = {f"config {k}": int(valid.index[r]) for k, r in enumerate(rows)}
    figure, artists = plan_peaks_figure(valid, named=named, dpi=80)
    line = line_y(figure, artists)
    for text, row in [(artists.best_label, None), *zip([t for t, _ in artists.named], rows)]:
        if not text.get_visible():
            continue
        box, axes = label_box(figure, text)
        assert axes.x0 - 1 <= box.x0 and box.x1 <= axes.x1 + 1, text.get_text()
        assert axes.y0 - 1 <= box.y0 and box.y1 <= axes.y1 + 1, text.get_text()
        peak = (valid["peak_bytes"].iloc[row] if row is not None
                else result.fits["peak_bytes"].iloc[0]) / 1e9
        below = peak <= artists.device_line.get_ydata()[0]
        assert (box.y1 <= line) if below else (box.y0 >= line), text.get_text()


def test_named_configurations_are_labelled_and_checked(a100):
    valid = a100.valid
    figure, artists = plan_peaks_figure(valid, named={"ZeRO-3, t 1": 5})
    assert [t.get_text() for t, _ in artists.named] == ["ZeRO-3, t 1"]
    assert artists.named[0][0].xy == (valid["step_seconds"].iloc[5], valid["peak_bytes"].iloc[5] / 1e9)
    with pytest.raises(ValueError, match=r"named\['x'\] must be an index label of the frame, got 10000000"):
        plan_peaks_figure(valid, named={"x": 10**7})
    with pytest.raises(TypeError, match="named must map label strings to index labels"):
        plan_peaks_figure(valid, named=[5])


def perturbed(frame: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The same plan with its steps and peaks shuffled and scaled: a random frame."""
    rng = np.random.default_rng(seed)
    out = frame.copy()
    n = len(out)
    out["step_seconds"] = rng.permutation(out["step_seconds"].to_numpy()) * rng.uniform(0.5, 2)
    out["peak_bytes"] = (rng.permutation(out["peak_bytes"].to_numpy())
                         * rng.uniform(0.3, 3)).astype(np.int64)
    out["fits"] = rng.random(n) < 0.3
    rank = np.zeros(n, dtype=np.int64)
    fitting = np.flatnonzero(out["fits"].to_numpy())
    order = fitting[np.argsort(out["step_seconds"].to_numpy()[fitting], kind="stable")]
    rank[order] = np.arange(1, len(order) + 1)
    out["rank"] = rank
    out.attrs.update(frame.attrs)
    return out


@pytest.fixture(scope="module")
def plans():
    return [plan("llama-2-70b", 64, 8, "a100-80gb", 4096, 1024).valid,
            plan("llama-2-13b", 64, 8, "h100-80gb", 2048, 512, shard_groups="whole").valid,
            plan("llama-3.1-405b", 64, 8, "a100-80gb", 4096, 1024, shard_groups="whole").valid,
            plan("llama-2-7b", 8, 8, "h100-80gb", 4096, 64).valid]


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_sequence_of_updates_gives_the_pixels_of_a_fresh_draw(plans, data):
    def frame():
        pick = data.draw(st.integers(0, len(plans) + 1), label="plan")
        if pick < len(plans):
            return plans[pick]
        return perturbed(plans[0], data.draw(st.integers(0, 10**6), label="seed"))

    def names(f):
        k = data.draw(st.integers(0, 2), label="named")
        rows = data.draw(st.lists(st.integers(0, len(f) - 1), min_size=k, max_size=k), label="rows")
        return {f"named {i}": int(f.index[r]) for i, r in enumerate(rows)} or None

    first = frame()
    figure, artists = plan_peaks_figure(first, dpi=50, named=names(first))
    for _ in range(data.draw(st.integers(1, 4), label="updates")):
        f, unit = frame(), data.draw(st.sampled_from(["GB", "GiB"]), label="unit")
        named = names(f)
        update_plan_peaks(artists, f, unit, named=named)
        fresh, _ = plan_peaks_figure(f, unit, dpi=50, named=named)
        assert fast_png.IncrementalPng(figure).render() == fast_png.IncrementalPng(fresh).render()
