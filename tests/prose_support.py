"""What the notebooks' prose tests share: a notebook's markdown cells by id with their whitespace
normalised (a sentence reads the same however the cell wraps it), and a phrase check that shows
where it looked."""
from __future__ import annotations

from pathlib import Path

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def read_notebook(stem: str) -> nbformat.NotebookNode:
    """The committed notebook ``notebooks/STEM.ipynb``."""
    return nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)


def markdown_cells(stem: str) -> dict[str, str]:
    """The markdown cells of ``notebooks/STEM.ipynb`` by id, each on one line."""
    return {c.id: " ".join(c.source.split()) for c in read_notebook(stem).cells
            if c.cell_type == "markdown"}


def says(text: str, *phrases: str):
    """Every phrase is in ``text``; the first missing one is named with the text's opening."""
    for phrase in phrases:
        assert phrase in text, f"expected {phrase!r} in: {text[:400]}..."
