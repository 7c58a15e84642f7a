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
