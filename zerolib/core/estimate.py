"""The per-stage breakdown for one setting: the object behind ``zerolib estimate``.

Its ``as_dict()`` is the JSON contract (all values in bytes):
{"params", "gpus", "layout": {...}, "device": {...} | null,
 "stages": [{"stage", "parameters", "gradients", "optimizer", "total", "cluster_total", "fits"}]}
With a model (:func:`estimate_model`) each stage row also carries ``working_set`` (bytes per
term) and ``peak``, ``fits`` is judged on the peak, and the object gains ``model``,
``tensor_parallel`` and ``working_set_settings``.

With a ``link`` (a node or a link of :mod:`zerolib.core.nodes` / :mod:`zerolib.core.links`)
each stage row also carries ``communication`` (:func:`zerolib.core.step_tables.communication_rows`:
per collective kind the calls, bytes handed, sent and received per GPU and seconds; totals;
compute, exposed and step seconds and the network-wait fraction when a device is given), and
the object gains ``interconnect`` (with the ``bus_bandwidth`` at this GPU count, bytes per
second) and ``compute_settings`` (tokens per GPU, mfu, FLOPs per parameter and token).
"""
from __future__ import annotations

from dataclasses import dataclass

from zerolib.core.accounting import STAGES, Layout, get_layout, model_state
from zerolib.core.devices import Device, get_device
from zerolib.core.inputs import check_gpus, check_params, check_single, check_stage
from zerolib.core.models import TransformerConfig, get_model, parameter_count
from zerolib.core.nodes import Interconnect, bus_bandwidth, interconnect
from zerolib.core.step import DEFAULT_MFU, DEFAULT_TOKENS_PER_GPU, ComputeSettings
from zerolib.core.step_tables import communication_rows
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
    interconnect: Interconnect | None = None
    compute: ComputeSettings | None = None

    def as_dict(self) -> dict:
        out = {"params": self.params, "gpus": self.gpus, "layout": self.layout.as_dict(),
               "device": self.device.as_dict() if self.device else None,
               "stages": [dict(row) for row in self.stages]}
        if self.model is not None:
            out.update(model=self.model.name, tensor_parallel=self.settings.tensor_parallel,
                       working_set_settings=self.settings.as_dict())
        if self.interconnect is not None:
            out.update(interconnect={**self.interconnect.as_dict(), "bus_bandwidth": int(
                           bus_bandwidth(self.interconnect, self.gpus))},
                       compute_settings=self.compute.as_dict())
        return out


def _with_communication(result: Estimate, what, link, gpus_per_node, compute) -> Estimate:
    """``result`` with a ``communication`` object in every stage row (see the module doc)."""
    if link is None:
        if gpus_per_node is not None:
            raise ValueError("gpus_per_node needs a link")
        return result
    ic = interconnect(link, gpus_per_node)
    stages = [row["stage"] for row in result.stages]
    rows = communication_rows(what, result.gpus, stages, result.layout, ic, result.device,
                              compute)
    by_stage = dict(zip(sorted(stages), rows))
    with_rows = tuple({**row, "communication": by_stage[row["stage"]]} for row in result.stages)
    return Estimate(result.params, result.gpus, result.layout, result.device, with_rows,
                    result.model, result.settings, ic, compute)


def _stages(stages) -> tuple[int, ...]:
    return tuple(check_stage(stages, "stages").ravel().tolist())


def estimate(params, gpus, layout: str | Layout = "mixed-adam",
             device: str | Device | None = None, stages=STAGES,
             link: str | Interconnect | None = None, gpus_per_node: int | None = None,
             tokens_per_gpu: int = DEFAULT_TOKENS_PER_GPU, mfu: float = DEFAULT_MFU) -> Estimate:
    """Bytes per worker for each requested stage of one (params, gpus) setting; ``fits`` judges
    the model state against ``device`` (None without one). With ``link``, each stage's
    communication (a bare count: stage 3 gathers one flat buffer per pass)."""
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
    result = Estimate(params, gpus, layout, device, tuple(rows))
    return _with_communication(result, params, link, gpus_per_node,
                               ComputeSettings(tokens_per_gpu, mfu))


def estimate_model(model: str | TransformerConfig, gpus,
                   settings: WorkingSetSettings = DEFAULT_SETTINGS,
                   layout: str | Layout = "mixed-adam", device: str | Device | None = None,
                   stages=STAGES, link: str | Interconnect | None = None,
                   gpus_per_node: int | None = None, tokens_per_gpu: int | None = None,
                   mfu: float = DEFAULT_MFU) -> Estimate:
    """The breakdown of a model preset: persistent state and working set per stage, ``fits``
    judged on the peak (see :func:`zerolib.core.working_set.stage_rows`). With ``link``, each
    stage's communication, per layer for stage 3; ``tokens_per_gpu`` defaults to the working
    set's sequence length x micro-batch, and full recomputation there costs 8 FLOPs per
    parameter and token instead of 6."""
    config, layout = get_model(model), get_layout(layout)
    gpus = check_single(gpus, check_gpus, "gpus")
    device = get_device(device) if device is not None else None
    rows = stage_rows(config, gpus, _stages(stages), settings, layout, device)
    result = Estimate(parameter_count(config), gpus, layout, device, tuple(rows), config, settings)
    if link is not None and settings.tensor_parallel != 1:
        raise ValueError("a link with tensor_parallel above 1 is not modelled: the step model "
                         "times data-parallel collectives only")
    tokens = settings.seq_len * settings.micro_batch if tokens_per_gpu is None else tokens_per_gpu
    return _with_communication(result, config, link, gpus_per_node,
                               ComputeSettings(tokens, mfu, settings.recompute == "full"))
