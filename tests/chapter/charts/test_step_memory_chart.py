"""The step-memory figure: a panel per stage, its highest moment marked with the frame's peak."""
from __future__ import annotations

import pytest

import zerolib as zl
from zerolib.chapter.charts.step_memory import step_memory_figure
from zerolib.core.memory.step_memory import step_memory_frame

SETTINGS = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective", flash_attention=True)


@pytest.fixture(scope="module")
def drawn():
    frame = step_memory_frame("llama-2-7b", 8, [0, 1, 2, 3], SETTINGS)
    return frame, *step_memory_figure(frame, "h100-80gb")


def test_a_panel_per_stage_and_the_peak_marked(drawn):
    frame, figure, marks = drawn
    assert len(figure.axes) == 4 and sorted(marks) == [0, 1, 2, 3]
    for stage, mark in marks.items():
        assert mark["bytes"] == zl.peak("llama-2-7b", 8, stage, SETTINGS).total
        (x,), (y,) = mark["axes"].get_lines()[0].get_data()
        assert x == mark["moment"] and y == pytest.approx(mark["bytes"] / 1e9)
        label = [t.get_text() for t in mark["axes"].texts]
        assert label == [f"peak {zl.format_bytes(mark['bytes'], 'GB').replace(' GB', '')} GB"] or \
            label[0].startswith("peak ")


def test_the_stacks_are_the_components_that_hold_bytes(drawn):
    frame, figure, _ = drawn
    gids = {c.get_gid() for ax in figure.axes for c in ax.collections}
    assert "stage 0/ddp_buckets" in gids and "stage 3/gathered_parameters" in gids
    assert "stage 1/ddp_buckets" not in gids          # zero at stage 1: not drawn


def test_the_same_frame_draws_the_same_png(drawn):
    frame = drawn[0]
    assert zl.render_png(step_memory_figure(frame)[0]) == zl.render_png(step_memory_figure(frame)[0])


def test_a_bad_frame_is_one_line():
    with pytest.raises(ValueError, match="step_memory_frame"):
        step_memory_figure(zl.peak_frame("llama-2-7b", 8))
