"""Tidy DataFrames: where the arithmetic leaves the library for tables and figures."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .accounting import CATEGORIES, STAGES, STRATEGY_NAMES, Layout, get_layout, model_state
from .devices import Device, get_device
from .feasibility import fewest_gpus
from .inputs import check_gpus, check_params, check_stage

COLUMNS = ("params", "gpus", "stage", "strategy", *CATEGORIES, "total", "cluster_total")


def memory_table(params, gpus, stages=STAGES, layout: "str | Layout" = "mixed-adam") -> pd.DataFrame:
    """One row per model size x worker count x stage; bytes per worker per category.

    Rows are ordered by params, then gpus, then stage. ``cluster_total`` sums all workers.
    """
    params = np.unique(check_params(params).ravel())
    gpus = np.unique(check_gpus(gpus).ravel())
    stages = np.unique(check_stage(stages).ravel())
    grid_params, grid_gpus, grid_stage = (a.ravel() for a in np.meshgrid(params, gpus, stages,
                                                                         indexing="ij"))
    state = model_state(grid_params, grid_gpus, grid_stage, get_layout(layout))
    table = pd.DataFrame({"params": grid_params, "gpus": grid_gpus, "stage": grid_stage,
                          **state.as_dict()})
    names = np.array([STRATEGY_NAMES[s] for s in STAGES])
    table.insert(3, "strategy", names[grid_stage])
    return table


def fewest_gpus_table(params, layout: "str | Layout" = "mixed-adam",
                      device: "str | Device" = "a100-80gb", stages=STAGES,
                      max_gpus: int = 1024) -> pd.DataFrame:
    """Per model and stage: the fewest workers that fit ``device`` (<NA> if none up to max_gpus)."""
    params = np.unique(check_params(params).ravel())
    stages = np.unique(check_stage(stages).ravel())
    grid_params, grid_stage = (a.ravel() for a in np.meshgrid(params, stages, indexing="ij"))
    fewest = fewest_gpus(grid_params, grid_stage, layout, device, max_gpus=max_gpus)
    names = np.array([STRATEGY_NAMES[s] for s in STAGES])
    table = pd.DataFrame({
        "params": grid_params, "stage": grid_stage, "strategy": names[grid_stage],
        "device": get_device(device).name,
        "fewest_gpus": pd.array(fewest, dtype="Int64"),
    })
    table.loc[table["fewest_gpus"] == 0, "fewest_gpus"] = pd.NA  # 0 = never fits
    return table
