"""Plain-text tables for the terminal."""
from __future__ import annotations


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """Left-align the first column, right-align the rest."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
