"""Tables that fit the terminal: on a terminal ``zerolib estimate`` and ``zerolib plan`` lay a
table wider than it out in blocks of columns (the first repeated, as pandas wraps a wide frame)
and wrap their lines; ``--wide``, a pipe or a file get each row whole."""
from __future__ import annotations

import io
import re
import sys

import pytest
from cli_support import run

from zerolib.cli import main

ESTIMATE = ("estimate", "--model", "llama-2-13b", "--gpus", "8", "--device", "a100-80gb",
            "--link", "dgx-a100")
PLAN = ("plan", "--model", "llama-2-70b", "--gpus", "64", "--gpus-per-node", "8", "--device",
        "a100-80gb", "--seq", "4096", "--global-batch", "1024", "--top", "5")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def on_terminal(monkeypatch, columns: int, *argv) -> str:
    """``zerolib ARGV`` printed to a terminal ``columns`` characters wide."""
    monkeypatch.setenv("COLUMNS", str(columns))
    screen = Terminal()
    monkeypatch.setattr(sys, "stdout", screen)
    assert main(list(argv)) == 0
    monkeypatch.undo()
    return screen.getvalue()


def tables(text: str, first: str) -> dict:
    """Every table in ``text`` whose first header is ``first``, merged: row name -> {header: cell}
    (columns are two or more spaces apart; no cell holds two spaces)."""
    merged: dict = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(first + "  ") and i + 1 < len(lines) and lines[i + 1].startswith("----"):
            headers = re.split(r"\s{2,}", line.strip())
            for row in lines[i + 2:]:
                if not row.strip() or row.startswith(("(", "...")):
                    break
                cells = re.split(r"\s{2,}", row.strip())
                merged.setdefault(cells[0], {}).update(zip(headers[1:], cells[1:]))
    return merged


def test_the_estimate_table_is_about_265_characters_wide_in_a_pipe(capsys):
    _, out, _ = run(capsys, *ESTIMATE)
    assert max(map(len, out.splitlines())) > 250          # what wrapped in an 80- or 120-column terminal


@pytest.mark.parametrize("columns", [80, 120])
def test_the_estimate_fits_a_terminal_and_says_everything_the_wide_table_does(monkeypatch, capsys,
                                                                              columns):
    _, wide, _ = run(capsys, *ESTIMATE)
    shown = on_terminal(monkeypatch, columns, *ESTIMATE)
    assert max(map(len, shown.splitlines())) <= columns
    whole = tables(wide, "strategy")
    assert len(whole) == 4 and len(whole["ZeRO stage 1 (optimizer)"]) == 19   # peak and peak reserved
    assert tables(shown, "strategy") == whole
    assert "--wide prints each row whole" in shown
    # The lines above the table say the same words, wrapped.
    assert " ".join(shown.split("strategy  ")[0].split()) == " ".join(wide.split("strategy  ")[0].split())


def test_wide_prints_each_row_whole_on_a_terminal(monkeypatch, capsys):
    _, piped, _ = run(capsys, *ESTIMATE)
    assert on_terminal(monkeypatch, 80, *ESTIMATE, "--wide") == piped


def test_a_table_that_fits_is_left_as_it_is(monkeypatch, capsys):
    argv = ("estimate", "--params", "7B", "--gpus", "64")
    _, piped, _ = run(capsys, *argv)
    shown = on_terminal(monkeypatch, 120, *argv)
    table = piped[piped.index("strategy  "):]
    assert max(map(len, table.splitlines())) <= 120
    assert shown.endswith(table) and "--wide" not in shown


def test_the_plan_fits_a_terminal(monkeypatch, capsys):
    _, wide, _ = run(capsys, *PLAN)
    shown = on_terminal(monkeypatch, 80, *PLAN)
    assert max(map(len, shown.splitlines())) <= 80
    assert tables(shown, "rank") == tables(wide, "rank") and len(tables(wide, "rank")) == 5
    assert on_terminal(monkeypatch, 80, *PLAN, "--wide") == wide


@pytest.mark.parametrize("command", [ESTIMATE, PLAN])
def test_wide_with_json_or_csv_is_one_line_and_exit_2(capsys, command):
    status, out, err = run(capsys, *command, "--wide", "--format", "json")
    assert status == 2 and out == "" and err.count("\n") == 1
    assert "--wide changes only the table; JSON has one record per row already" in err
