"""The GPU-count figure's end labels (the value of each line at its right end) stay clear of the
x axis and of the last tick's label, and the titles read "an 8B-parameter model".

Measured from the drawn figure (the renderer's text boxes), as the explorer of notebook 02 draws
it over 1 to 1,024 GPUs. By hand, mixed-precision Adam (16 bytes per parameter): at 1T on 1,024
GPUs stage 3 holds 16e12 / 1024 = 15.6 GB, under the A100's 85.9 GB line in a y range of
16,000 x 1.1 = 17,600 GB, where the line is 0.5 % of the height up: there is no room for a label
between the axis and the line. At 8B stage 3 holds 128e9 / 1024 = 0.125 GB: on the axis line.
"""
from __future__ import annotations

import pytest

from zerolib.chapter.explorers import GpuCountExplorer
from zerolib.chapter.style import a_or_an


@pytest.fixture(scope="module")
def explorer():
    return GpuCountExplorer(params=70_000_000_000, gpus=(1, 1024))


def _boxes(explorer):
    figure, ax = explorer.figure, explorer.artists.ax
    renderer = figure.canvas.get_renderer()
    figure.draw_without_rendering()
    labels = {stage: text.get_window_extent(renderer) for stage, text in explorer.artists.end_labels.items()}
    ticks = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    return labels, ticks, ax.get_window_extent(renderer)


@pytest.mark.parametrize("params, texts", [
    (1_000_000_000_000, {3: "15.6 GB"}),
    (8_000_000_000, {3: "0.12 GB"}),
    (70_000_000_000, {3: "1.09 GB"}),
])
def test_end_labels_sit_above_the_x_axis_clear_of_the_ticks(explorer, params, texts):
    explorer.controls["params"].value = params
    for stage, text in texts.items():
        assert explorer.artists.end_labels[stage].get_text() == text
    labels, ticks, axes = _boxes(explorer)
    for stage, box in labels.items():
        # Above the axis line (which would read as a minus sign before "0.12 GB") ...
        assert box.y0 > axes.y0 + 1, f"stage {stage}'s label reaches the x axis: {box} vs {axes}"
        # ... and never on the last tick's label ("1,024" running into "15.6 GB").
        assert not any(box.overlaps(tick) for tick in ticks), f"stage {stage}'s label meets a tick"
    # Labels do not overlap each other.
    boxes = list(labels.values())
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


@pytest.mark.parametrize("word, said", [("8B", "an 8B"), ("80B", "an 80B"), ("800M", "an 800M"),
                                        ("11B", "an 11B"), ("18B", "an 18B"), ("8.5B", "an 8.5B"),
                                        ("7B", "a 7B"), ("1.8T", "a 1.8T"), ("110B", "a 110B"),
                                        ("180B", "a 180B"), ("1T", "a 1T"), ("125M", "a 125M"),
                                        ("11,000", "an 11,000"), ("1,024", "a 1,024")])
def test_the_article_is_the_one_read_aloud(word, said):
    assert a_or_an(word) == said


def test_the_titles_say_an_8b_parameter_model(explorer):
    explorer.controls["params"].value = 8_000_000_000
    assert explorer.artists.title.get_text().startswith("Per-GPU model state of an 8B-parameter model")
