"""Plain-text tables for the terminal."""
from __future__ import annotations

import json
import math


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-align the first column, right-align the rest."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


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
