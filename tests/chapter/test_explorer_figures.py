"""The explorers' figures as a reader sees them at 100 % zoom: text at least 10 pixels, labels
off the capacity line, the image shown at its own size and no wider than JupyterLab shows it.
"""
from __future__ import annotations

import pytest
from matplotlib.text import Text

import zerolib.chapter.explorers as explorers

EXPLORERS = [getattr(explorers, name) for name in explorers.__all__]
MIN_TEXT_PX = 10
# JupyterLab's output area beside its file browser in a 1,280-pixel window, as measured by
# tests/browser/test_explorer_layout.py: 844 pixels.
OUTPUT_AREA_PX = 844


@pytest.fixture(scope="module", params=EXPLORERS, ids=lambda cls: cls.__name__)
def explorer(request):
    return request.param()


def test_every_text_is_at_least_10_pixels(explorer):
    figure = explorer.figure
    small = sorted({(t.get_text(), t.get_fontsize()) for t in figure.findobj(Text)
                    if t.get_visible() and t.get_text().strip()
                    and t.get_fontsize() * figure.dpi / 72 < MIN_TEXT_PX - 1e-9})
    assert not small, f"texts under {MIN_TEXT_PX} px at {figure.dpi} dpi: {small[:8]}"


def test_the_image_is_shown_at_its_own_size_and_fits_the_output_area(explorer):
    width = round(explorer.figure.get_size_inches()[0] * explorer.figure.dpi)
    assert explorer.image.layout.width == f"{width}px"
    assert width <= OUTPUT_AREA_PX


def label_problems(ax, labels, capacity_line) -> list[str]:
    """Labels whose drawn box the capacity line runs through (or touches)."""
    figure = ax.figure
    renderer = figure.canvas.get_renderer()
    line_y = ax.transData.transform((0, capacity_line.get_ydata()[0]))[1]
    half = capacity_line.get_linewidth() * figure.dpi / 72 / 2
    problems = []
    for text in labels:
        if not (text.get_visible() and text.get_text()):
            continue
        box = text.get_window_extent(renderer)
        if box.y0 - half <= line_y <= box.y1 + half:
            problems.append(text.get_text())
    return problems


def test_will_it_fit_labels_sit_off_the_capacity_line():
    # Llama-2-7B on 8 H100s, micro-batch 2: stage 2's peak, 70.4 GB, is under the 85.9 GB line by
    # less than its two labels are tall, so the line would run through them where they sit.
    e = explorers.WillItFitExplorer(micro_batch=2)
    a = e.artists
    labels = [*a.peak_labels.values(), *a.verdict_labels.values()]
    assert label_problems(a.ax, labels, a.device_line) == []
    for micro_batch in (1, 3):
        e.controls["micro_batch"].value = micro_batch
        assert label_problems(a.ax, labels, a.device_line) == []


def test_placement_labels_sit_off_the_capacity_line():
    # 70B on 16 A100s: ZeRO-3 holds 16 x 70e9 / 16 = 70.0 GB per GPU, 15.9 GB under the line.
    e = explorers.PlacementExplorer(gpus=16)
    a = e.artists
    labels = [*a.gpu_labels, *a.verdict_labels]
    assert label_problems(a.ax, labels, a.device_line) == []
    e.controls["gpus"].value = 32
    assert label_problems(a.ax, labels, a.device_line) == []
