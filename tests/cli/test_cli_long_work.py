"""Issue 24, item 11: long work shows a progress bar on a terminal (stderr only, never in a pipe),
memory follows the points asked for, and documented limits finish in seconds."""
from __future__ import annotations

import io
import time
import tracemalloc

from cli_support import run

from zerolib.chapter import figures
from zerolib.cli._output import ProgressBar, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_draws_in_place_and_clears_itself():
    screen = Terminal()
    bar = ProgressBar(screen, "drawing")
    bar(0, 4, "memory-vs-gpu-count")
    bar(2, 4, "step-timeline")
    bar(4, 4, "done")
    frames = screen.getvalue().split("\r")
    assert frames[1] == "drawing [........................] 0/4 memory-vs-gpu-count"
    assert frames[2].startswith("drawing [############............] 2/4 step-timeline")
    assert frames[-2].strip() == "" and frames[-1] == ""      # cleared: stdout follows cleanly


def test_no_bar_unless_stderr_is_a_terminal():
    assert progress_bar(io.StringIO(), "drawing") is None
    assert isinstance(progress_bar(Terminal(), "drawing"), ProgressBar)


def test_build_reports_each_figure_then_the_end():
    seen = []
    figures.build(figures.DEFAULTS, png=False, progress=lambda *step: seen.append(step))
    names = list(figures.PUBLISHED)
    assert seen == [(i, len(names), name) for i, name in enumerate(names)] + [
        (len(names), len(names), "done")]


def test_figures_in_a_pipe_print_no_bar(capsys, tmp_path):
    status, out, err = run(capsys, "figures", "--out", str(tmp_path), "--gpus", "1,2")
    assert status == 0 and err == "" and "\r" not in out


def test_two_gpu_counts_far_apart_cost_two_points_of_memory():
    tracemalloc.start()
    started = time.perf_counter()
    text = figures.data_readme(figures.FigureOptions(gpus=(1, 2**24)))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert "1, 16777216" in text
    # Before, the README's span built a list of all 16,777,216 counts (hundreds of MB).
    assert peak < 10 * 2**20 and time.perf_counter() - started < 5


def test_model_sizes_are_limited_to_what_draws_in_seconds(capsys, tmp_path):
    sizes = ",".join(f"{i}B" for i in range(1, 66))
    status, out, err = run(capsys, "figures", "--out", str(tmp_path), "--sizes", sizes)
    assert (status, out) == (2, "")
    assert err.startswith("zerolib figures: error: --sizes must be up to 64 model sizes")
