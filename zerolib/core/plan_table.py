"""A plan's fitting configurations as plain rows and as CSV: the one writer that ``zerolib plan
--format json|csv`` and the engineer's page's download share (the same bytes)."""
from __future__ import annotations

import csv
import io
import math

from zerolib.core.planner import FIT_COLUMNS, SEARCHED_COLUMNS, Plan


def plain(value):
    """A JSON value: numpy scalars as Python numbers, NaN (unknown) as null, a category as text."""
    if hasattr(value, "categories"):
        return str(value)
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def plan_rows(frame, top: int | None = None) -> list[dict]:
    """The first ``top`` rows of a plan's frame (None: all), each as plain values."""
    shown = frame if top is None else frame.head(top)
    return [{key: plain(value) for key, value in record.items()}
            for record in shown.to_dict("records")]


def plan_columns(result: Plan) -> list[str]:
    """The CSV's columns: the rank, the ranked frame's columns in order, and the degrees
    searched beyond them."""
    return ["rank", *FIT_COLUMNS, *(c for c in SEARCHED_COLUMNS if c in result.fits.columns)]


def plan_csv(result: Plan, top: int | None = None, run=None) -> str:
    """The fitting configurations, fastest first (the first ``top``; None: all); with ``run``
    (a :class:`~zerolib.core.step.run_cost.RunCost` over ``result.fits``) each row's
    ``run_seconds`` and ``gpu_hours`` after the rest."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = plan_columns(result)
    writer.writerow(columns + ([] if run is None else ["run_seconds", "gpu_hours"]))
    for i, row in enumerate(plan_rows(result.fits, top)):
        cost = [] if run is None else [float(run.seconds[i]), float(run.gpu_hours[i])]
        writer.writerow(["" if row[c] is None else row[c] for c in columns] + cost)
    return out.getvalue().rstrip("\n")
