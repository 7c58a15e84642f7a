"""The per-stage breakdown for one setting: the object behind ``zerolib estimate``.

Its ``as_dict()`` is the JSON contract (all values in bytes):
{"params", "gpus", "layout": {...}, "device": {...} | null,
 "stages": [{"stage", "parameters", "gradients", "optimizer", "total", "cluster_total", "fits"}]}
"""
from __future__ import annotations

from dataclasses import dataclass

from zerolib.core.accounting import STAGES, Layout, get_layout, model_state
from zerolib.core.devices import Device, get_device
from zerolib.core.inputs import check_gpus, check_params, check_single, check_stage


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


def estimate(params, gpus, layout: "str | Layout" = "mixed-adam",
             device: "str | Device | None" = None, stages=STAGES) -> Estimate:
    """Bytes per worker for each requested stage of one (params, gpus) setting."""
    params = check_single(params, check_params, "params")
    gpus = check_single(gpus, check_gpus, "gpus")
    layout = get_layout(layout)
    device = get_device(device) if device is not None else None
    stages = tuple(check_stage(stages, "stages").ravel().tolist())
    # parameters, gradients, optimizer, total, cluster_total: one value per stage
    columns = model_state(params, gpus, stages, layout).as_dict()
    rows = []
    for index, stage in enumerate(stages):
        row = {"stage": stage, **{name: int(values[index]) for name, values in columns.items()}}
        row["fits"] = None if device is None else row["total"] <= device.capacity
        rows.append(row)
    return Estimate(params, gpus, layout, device, tuple(rows))
