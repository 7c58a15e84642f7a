"""The measured-peaks figure: one point and one label per row, the bad frame refused in one line."""
import pandas as pd
import pytest

from zerolib.chapter.charts.measured_peaks import measured_peaks_figure

FRAME = pd.DataFrame({"id": ["a", "b", "c"], "measured": ["reserved", "allocated", "active"],
                      "measured_bytes": [80 * 2**30, 40 * 2**30, 20 * 2**30],
                      "predicted_bytes": [78 * 2**30, 50 * 2**30, 20 * 2**30],
                      "tolerance": ["0.1", "0.25", "0.1"]})


def test_every_point_is_labelled_once():
    figure = measured_peaks_figure(FRAME)
    (ax,) = figure.axes
    labels = [t.get_text() for t in ax.texts if t.get_text() in set(FRAME["id"])]
    assert sorted(labels) == ["a", "b", "c"]
    # top to bottom in the order of the predictions
    by_height = sorted((t for t in ax.texts if t.get_text() in set(FRAME["id"])),
                       key=lambda t: -t.xyann[1])
    assert [t.get_text() for t in by_height] == ["a", "b", "c"]
    markers = [line.get_marker() for line in ax.lines if line.get_marker() in ("o", "X")]
    assert markers == ["o", "X", "o"]


def test_a_frame_without_its_columns_is_refused():
    with pytest.raises(ValueError, match="missing tolerance"):
        measured_peaks_figure(FRAME.drop(columns="tolerance"))
    with pytest.raises(TypeError, match="frame must be a DataFrame"):
        measured_peaks_figure([1, 2])
