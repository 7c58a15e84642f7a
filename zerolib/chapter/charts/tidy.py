"""Reading the tidy tables of :mod:`zerolib.core.memory.tables` for a chart: checks and reshaping.

A chart draws what a table holds and what its ``attrs`` say about it (the layout, the model,
the settings); it never recomputes the numbers.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from zerolib.core.units import check_unit


def check_tidy(table, columns, attrs, made_by: str) -> pd.DataFrame:
    """``table`` as a non-empty DataFrame with ``columns`` and the ``attrs`` a title needs."""
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a DataFrame from {made_by}, got {type(table).__name__}")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"table lacks the columns {', '.join(missing)} (use {made_by})")
    missing = [key for key in attrs if key not in table.attrs]
    if missing:
        raise ValueError(f"table lacks attrs {', '.join(missing)} naming what it was computed "
                         f"with (use {made_by})")
    if table.empty:
        raise ValueError("table must have at least one row")
    return table


def single_value(table: pd.DataFrame, column: str, figure: str) -> int:
    """The one value ``column`` holds (a figure of one model, or one GPU count)."""
    values = table[column].unique()
    if len(values) != 1:
        raise ValueError(f"table must hold one {column} value for the {figure} figure, "
                         f"got {len(values)}")
    return int(values[0])


def stages_of(table: pd.DataFrame) -> tuple[int, ...]:
    return tuple(int(s) for s in np.unique(table["stage"].to_numpy()))


def totals_by_stage(table: pd.DataFrame, index_column: str, unit: str):
    """(sorted index values, {stage: per-GPU totals in ``unit``}) from a tidy table."""
    scale = check_unit(unit)
    index, at_index = np.unique(table[index_column].to_numpy(), return_inverse=True)
    stages, at_stage = np.unique(table["stage"].to_numpy(), return_inverse=True)
    cells = at_stage * len(index) + at_index
    if len(table) != len(index) * len(stages) or len(np.unique(cells)) != len(table):
        raise ValueError(f"table must hold every stage exactly once at every {index_column} value")
    grid = np.empty(len(index) * len(stages))
    grid[cells] = table["total"].to_numpy(dtype=float) / scale
    grid = grid.reshape(len(stages), len(index))
    return index, {int(stage): grid[row] for row, stage in enumerate(stages)}
