"""The per-stage breakdown for one setting: the object behind ``zerolib estimate``.

Its ``as_dict()`` is the JSON contract (all values in bytes):
{"params", "gpus", "layout": {...}, "device": {...} | null,
 "stages": [{"stage", "parameters", "gradients", "optimizer", "total", "cluster_total", "fits"}]}
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .accounting import CATEGORIES, STAGES, Layout, get_layout, model_state
from .devices import Device, get_device
from .inputs import check_gpus, check_params, check_stage


@dataclass(frozen=True)
class Estimate:
    params: int
    gpus: int
    layout: Layout
    device: "Device | None"
    stages: tuple[dict, ...]

    def as_dict(self) -> dict:
        return {"params": self.params, "gpus": self.gpus, "layout": self.layout.as_dict(),
                "device": self.device.as_dict() if self.device else None,
                "stages": [dict(row) for row in self.stages]}


def _one(value, check, name) -> int:
    array = check(value, name)
    if array.ndim != 0:
        raise TypeError(f"{name} must be a single number here, got an array")
    return int(array)


def estimate(params, gpus, layout: "str | Layout" = "mixed-adam",
             device: "str | Device | None" = None, stages=STAGES) -> Estimate:
    """Bytes per worker for each requested stage of one (params, gpus) setting."""
    params = _one(params, check_params, "params")
    gpus = _one(gpus, check_gpus, "gpus")
    layout = get_layout(layout)
    device = get_device(device) if device is not None else None
    stages = tuple(int(s) for s in np.atleast_1d(check_stage(stages)))
    state = model_state(params, gpus, np.array(stages), layout)
    rows = []
    for index, stage in enumerate(stages):
        row = {"stage": stage}
        row.update({c: int(getattr(state, c)[index]) for c in CATEGORIES})
        row["total"] = int(state.total[index])
        row["cluster_total"] = int(state.cluster_total[index])
        row["fits"] = None if device is None else bool(row["total"] <= device.capacity)
        rows.append(row)
    return Estimate(params, gpus, layout, device, tuple(rows))
