"""Tidy DataFrames: where the arithmetic leaves the library for tables and figures."""
from __future__ import annotations

import numpy as np
import pandas as pd

from zerolib.core.accounting import (
    CATEGORIES,
    STAGES,
    STRATEGY_NAMES,
    Layout,
    get_layout,
    model_state,
)
from zerolib.core.devices import Device, get_device
from zerolib.core.feasibility import fewest_gpus
from zerolib.core.inputs import check_gpus, check_params, check_stage

COLUMNS = ("params", "gpus", "stage", "strategy", *CATEGORIES, "total", "cluster_total")
_STRATEGY_NAMES = np.array([STRATEGY_NAMES[s] for s in STAGES])   # indexed by stage


def memory_table(params, gpus, stages=STAGES, layout: "str | Layout" = "mixed-adam") -> pd.DataFrame:
    """One row per model size x worker count x stage; bytes per worker per category.

    Rows are ordered by params, then gpus, then stage. ``cluster_total`` sums all workers.
    """
    params = np.unique(check_params(params).ravel())
    gpus = np.unique(check_gpus(gpus).ravel())
    stages = np.unique(check_stage(stages, "stages").ravel())
    grid_params, grid_gpus, grid_stage = (a.ravel() for a in np.meshgrid(params, gpus, stages,
                                                                         indexing="ij"))
    state = model_state(grid_params, grid_gpus, grid_stage, get_layout(layout))
    table = pd.DataFrame({"params": grid_params, "gpus": grid_gpus, "stage": grid_stage,
                          **state.as_dict()})
    table.insert(3, "strategy", _STRATEGY_NAMES[grid_stage])
    return table


def fewest_gpus_table(params, layout: "str | Layout" = "mixed-adam",
                      device: "str | Device" = "a100-80gb", stages=STAGES,
                      max_gpus: int = 1024) -> pd.DataFrame:
    """Per model and stage: the fewest workers that fit ``device`` (<NA> if none up to max_gpus)."""
    params = np.unique(check_params(params).ravel())
    stages = np.unique(check_stage(stages, "stages").ravel())
    grid_params, grid_stage = (a.ravel() for a in np.meshgrid(params, stages, indexing="ij"))
    fewest = fewest_gpus(grid_params, grid_stage, layout, device, max_gpus=max_gpus)
    table = pd.DataFrame({
        "params": grid_params, "stage": grid_stage, "strategy": _STRATEGY_NAMES[grid_stage],
        "device": get_device(device).name,
        "fewest_gpus": pd.array(fewest, dtype="Int64"),
    })
    table.loc[table["fewest_gpus"] == 0, "fewest_gpus"] = pd.NA  # 0 = never fits
    return table


def stage_savings(params, gpus, layouts=("mixed-adam",)) -> pd.DataFrame:
    """Per layout and stage: bytes per worker and the bytes that stage saves over the one before.

    One row per (layout, stage); ``saved`` is 0 for stage 0. Shows where the savings move when
    one category's width changes (e.g. fp32 gradients make stage 2 save more).
    """
    if isinstance(layouts, (str, Layout)):
        layouts = (layouts,)
    frames = []
    for layout in layouts:
        name = get_layout(layout).name
        table = memory_table(params, gpus, STAGES, layout)
        if table["params"].nunique() != 1 or table["gpus"].nunique() != 1:
            raise ValueError("stage_savings takes a single params and a single gpus value")
        table = table[["stage", "strategy", "total"]].assign(layout=name)
        table["saved"] = (-table["total"].diff()).fillna(0).astype(np.int64)
        frames.append(table)
    return pd.concat(frames, ignore_index=True)[["layout", "stage", "strategy", "total", "saved"]]
