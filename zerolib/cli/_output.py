"""Plain-text tables for the terminal."""
from __future__ import annotations

import json
import math
import shutil
import sys
import textwrap


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-align the first column, right-align the rest."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def output_width(wide: bool = False, stream=None) -> int | None:
    """The width a table must fit: the terminal's (``COLUMNS`` when set, as the shell and
    ``shutil`` read it) when ``stream`` (stdout) is a terminal; None, no limit, with ``wide``
    or when the output goes to a pipe or a file (a script or ``grep`` then gets a row per line)."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if wide or isatty is None or not isatty():
        return None
    return max(shutil.get_terminal_size().columns, 40)


def fitted_table(headers: list[str], rows: list[list[str]], width: int | None) -> str:
    """:func:`text_table`, or, when it is wider than ``width``, its columns in blocks that each
    fit, the first column (the rows' names) repeated in each, as pandas wraps a wide frame."""
    whole = text_table(headers, rows)
    if width is None or max(map(len, whole.splitlines())) <= width:
        return whole
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    blocks, block, used = [], [0], widths[0]
    for index in range(1, len(headers)):
        if len(block) > 1 and used + 2 + widths[index] > width:
            blocks.append(block)
            block, used = [0], widths[0]
        block.append(index)
        used += 2 + widths[index]
    blocks.append(block)
    parts = [text_table([headers[i] for i in b], [[row[i] for i in b] for row in rows])
             for b in blocks]
    note = (f"({len(headers) - 1} columns in {len(blocks)} blocks to fit {width} characters; "
            f"--wide prints each row whole.)")
    return "\n\n".join(parts) + "\n\n" + "\n".join(wrapped([note], width))


def wrapped(lines: list[str], width: int | None, indent: str | None = None) -> list[str]:
    """Prose ``lines`` wrapped to ``width``, each continued under ``indent`` (default: its own
    leading spaces); as they are when ``width`` is None."""
    if width is None:
        return list(lines)
    out = []
    for line in lines:
        hang = line[:len(line) - len(line.lstrip(" "))] if indent is None else indent
        out += textwrap.wrap(line, width, subsequent_indent=hang, break_long_words=False,
                             break_on_hyphens=False) or [line]
    return out


def _no_nan(value):
    """``value`` with every NaN (a missing number in a frame) as None, recursively."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _no_nan(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(item) for item in value]
    return value


def json_text(value) -> str:
    """Standard JSON (RFC 8259): NaN becomes null; an infinity is refused (ValueError), never
    written as the ``Infinity`` no JSON parser has to accept."""
    return json.dumps(_no_nan(value), indent=2, allow_nan=False)


class ProgressBar:
    """A one-line progress bar on ``stream``, redrawn in place with a carriage return, and
    cleared when the work is done; for a terminal only (see :func:`progress_bar`)."""

    WIDTH = 24

    def __init__(self, stream, label: str):
        self.stream, self.label, self.longest = stream, label, 0

    def __call__(self, done: int, total: int, what: str) -> None:
        filled = self.WIDTH * done // max(total, 1)
        line = f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} {what}"
        if done >= total:   # leave the terminal as it was: the results follow on stdout
            self.stream.write("\r" + " " * self.longest + "\r")
        else:   # padded over the longer line before it
            self.stream.write("\r" + line.ljust(self.longest))
            self.longest = max(self.longest, len(line))
        self.stream.flush()


def progress_bar(stream, label: str) -> ProgressBar | None:
    """A :class:`ProgressBar` on ``stream`` when it is a terminal; None otherwise (a pipe, a
    file, a test's capture), so logs and captured output never hold the bar."""
    isatty = getattr(stream, "isatty", None)
    return ProgressBar(stream, label) if isatty is not None and isatty() else None
