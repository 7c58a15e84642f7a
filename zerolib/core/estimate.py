"""The per-stage breakdown for one setting: the object behind ``zerolib estimate``.

Its ``as_dict()`` is the JSON contract (all values in bytes):
{"params", "gpus", "layout": {...}, "device": {...} | null,
 "stages": [{"stage", "parameters", "gradients", "optimizer", "total", "cluster_total", "fits"}]}
With a model (:func:`estimate_model`) each stage row also carries ``working_set`` (bytes per
term), ``peak`` and ``pipeline_stage`` (the most-loaded stage's index), ``fits`` is judged
on the peak, and the object gains ``model``, ``tensor_parallel``, ``pipeline_parallel`` and
``working_set_settings``.
"""
from __future__ import annotations

from dataclasses import dataclass

from zerolib.core.accounting import STAGES, Layout, get_layout, model_state
from zerolib.core.devices import Device, get_device
from zerolib.core.inputs import check_gpus, check_params, check_single, check_stage
from zerolib.core.models import TransformerConfig, get_model, parameter_count
from zerolib.core.working_set import DEFAULT_SETTINGS, WorkingSetSettings, stage_rows


@dataclass(frozen=True)
class Estimate:
    params: int
    gpus: int
    layout: Layout
    device: Device | None
    stages: tuple[dict, ...]
    model: TransformerConfig | None = None
    settings: WorkingSetSettings | None = None

    def as_dict(self) -> dict:
        out = {"params": self.params, "gpus": self.gpus, "layout": self.layout.as_dict(),
               "device": self.device.as_dict() if self.device else None,
               "stages": [dict(row) for row in self.stages]}
        if self.model is not None:
            out.update(model=self.model.name, tensor_parallel=self.settings.tensor_parallel,
                       pipeline_parallel=self.settings.pipeline_parallel,
                       working_set_settings=self.settings.as_dict())
        return out


def _stages(stages) -> tuple[int, ...]:
    return tuple(check_stage(stages, "stages").ravel().tolist())


def estimate(params, gpus, layout: str | Layout = "mixed-adam",
             device: str | Device | None = None, stages=STAGES) -> Estimate:
    """Bytes per worker for each requested stage of one (params, gpus) setting; ``fits`` judges
    the model state against ``device`` (None without one)."""
    params = check_single(params, check_params, "params")
    gpus = check_single(gpus, check_gpus, "gpus")
    layout = get_layout(layout)
    device = get_device(device) if device is not None else None
    stages = _stages(stages)
    # parameters, gradients, optimizer, total, cluster_total: one value per stage
    columns = model_state(params, gpus, stages, layout).as_dict()
    rows = []
    for index, stage in enumerate(stages):
        row = {"stage": stage, **{name: int(values[index]) for name, values in columns.items()}}
        row["fits"] = None if device is None else row["total"] <= device.capacity
        rows.append(row)
    return Estimate(params, gpus, layout, device, tuple(rows))


def estimate_model(model: str | TransformerConfig, gpus,
                   settings: WorkingSetSettings = DEFAULT_SETTINGS,
                   layout: str | Layout = "mixed-adam", device: str | Device | None = None,
                   stages=STAGES) -> Estimate:
    """The breakdown of a model preset: persistent state and working set per stage, ``fits``
    judged on the peak (see :func:`zerolib.core.working_set.stage_rows`)."""
    config, layout = get_model(model), get_layout(layout)
    gpus = check_single(gpus, check_gpus, "gpus")
    device = get_device(device) if device is not None else None
    rows = stage_rows(config, gpus, _stages(stages), settings, layout, device)
    return Estimate(parameter_count(config), gpus, layout, device, tuple(rows), config, settings)
