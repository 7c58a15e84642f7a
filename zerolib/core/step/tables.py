"""The price of ZeRO as tables: traffic per stage and collective, the step's timeline, and
per-GPU memory against step time; plus the per-stage ``communication`` object of
``zerolib estimate``.

Each frame carries what a chart's title needs in ``attrs``: ``model`` (a TransformerConfig, or
the parameter count of a bare model), ``gpus``, ``layout``, and for the timed frames
``interconnect``, ``device`` and ``compute`` (a :class:`~zerolib.core.step.time.ComputeSettings`).
Bytes are int64, seconds float64.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.catalogue.nodes import Interconnect, bus_bandwidth, interconnect
from zerolib.core.inputs import check_gpus, check_single, check_stage
from zerolib.core.memory.accounting import STAGES, STRATEGY_NAMES, Layout, get_layout
from zerolib.core.memory.working_set import DEFAULT_SETTINGS, WorkingSetSettings, peaks
from zerolib.core.step.collectives import KINDS, collective_seconds
from zerolib.core.step.time import DEFAULT_COMPUTE, ComputeSettings, StepTime, check_mfu, step_time
from zerolib.core.step.traffic import PHASES, SLOTS, Traffic, traffic

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

TRAFFIC_COLUMNS = ("stage", "strategy", "kind", "calls", "handed_bytes", "sent_bytes",
                   "received_bytes")
TIMELINE_COLUMNS = ("stage", "strategy", "lane", "block", "label", "start_seconds",
                    "end_seconds", "sent_bytes", "calls")
TRADEOFF_COLUMNS = ("stage", "strategy", "memory_bytes", "compute_seconds",
                    "communication_seconds", "exposed_seconds", "step_seconds",
                    "network_wait_fraction", "sent_bytes")
COMPUTE_BLOCKS = {"forward": "forward", "backward": "backward"}


def _stages(stages) -> tuple[int, ...]:
    return tuple(sorted(set(check_stage(stages, "stages").ravel().tolist())))


def _traffic(model, gpus: int, stages, layout: Layout) -> tuple[Traffic, object]:
    if isinstance(model, (str, TransformerConfig)):
        config = get_model(model)
        return traffic(config, gpus, list(stages), layout), config
    result = traffic(model, gpus, list(stages), layout)
    return result, int(result.params[0])


def traffic_frame(model, gpus, stages=STAGES, layout: str | Layout = "mixed-adam") -> pd.DataFrame:
    """One row per stage and collective kind: calls, bytes handed over, sent and received per GPU
    in one step. ``model`` is a preset, a TransformerConfig or a bare parameter count."""
    import pandas as pd
    gpus = check_single(gpus, check_gpus, "gpus")
    stages, layout = _stages(stages), get_layout(layout)
    result, what = _traffic(model, gpus, stages, layout)
    calls, handed, sent = (result.by_kind(w) for w in ("calls", "handed", "sent"))
    rows = [{"stage": stage, "strategy": STRATEGY_NAMES[stage], "kind": kind,
             "calls": int(calls[kind][i]), "handed_bytes": int(handed[kind][i]),
             "sent_bytes": int(sent[kind][i]), "received_bytes": int(sent[kind][i])}
            for i, stage in enumerate(stages) for kind in KINDS]
    frame = pd.DataFrame(rows, columns=list(TRAFFIC_COLUMNS))
    for column in ("calls", "handed_bytes", "sent_bytes", "received_bytes"):
        frame[column] = frame[column].astype(np.int64)
    frame.attrs.update(model=what, gpus=gpus, layout=layout, layers=result.layers)
    return frame


def _timed(model, gpus, stages, layout, link, device, compute, gpus_per_node):
    gpus = check_single(gpus, check_gpus, "gpus")
    stages, layout = _stages(stages), get_layout(layout)
    ic = interconnect(link, gpus_per_node)
    device = get_device(device)
    if not isinstance(compute, ComputeSettings):
        raise TypeError(f"compute must be a ComputeSettings, got {type(compute).__name__}")
    result, what = _traffic(model, gpus, stages, layout)
    return gpus, stages, layout, ic, device, result, what, step_time(result, ic, device, compute)


def _attrs(frame, what, gpus, layout, ic, device, compute, result: Traffic):
    frame.attrs.update(model=what, gpus=gpus, layout=layout, interconnect=ic, device=device,
                       compute=compute, layers=result.layers,
                       bus_bandwidth=float(bus_bandwidth(ic, gpus)))
    return frame


def timeline_frame(model, gpus, link: str | Interconnect, device: str | Device,
                   compute: ComputeSettings = DEFAULT_COMPUTE, stages=STAGES,
                   layout: str | Layout = "mixed-adam",
                   gpus_per_node: int | None = None) -> pd.DataFrame:
    """The blocks of one step per stage, placed in time as the overlap model of
    :mod:`zerolib.core.step.time` has them: lane "compute" (forward, backward, and "waiting" where
    the GPU waits for the network) and lane "network" (one block per collective slot in use).

    Phase by phase: the forward ends when both its compute and its gathers are done; the
    backward starts then, and its collectives start with it; the after-step all-gather starts
    when the backward's compute and collectives are both done.
    """
    import pandas as pd
    gpus, stages, layout, ic, device, result, what, times = _timed(
        model, gpus, stages, layout, link, device, compute, gpus_per_node)
    rows = []
    for i, stage in enumerate(stages):
        common = {"stage": stage, "strategy": STRATEGY_NAMES[stage]}

        def block(lane, name, label, start, end, sent=0, calls=0, common=common):
            rows.append({**common, "lane": lane, "block": name, "label": label,
                         "start_seconds": float(start), "end_seconds": float(end),
                         "sent_bytes": int(sent), "calls": int(calls)})

        start = 0.0
        for phase in PHASES:
            compute_time = float(times.compute[phase][i]) if phase in times.compute else 0.0
            if compute_time:
                block("compute", phase, COMPUTE_BLOCKS[phase], start, start + compute_time)
            network = start
            for slot in SLOTS:
                if slot.phase == phase and result.calls[slot.name][i]:
                    seconds = float(times.slot_seconds[slot.name][i])
                    block("network", slot.name, slot.label, network, network + seconds,
                          result.sent[slot.name][i], result.calls[slot.name][i])
                    network += seconds
            end = max(start + compute_time, network)
            if end > start + compute_time:
                block("compute", f"waiting_{phase}", "waiting for the network",
                      start + compute_time, end)
            start = end
    frame = pd.DataFrame(rows, columns=list(TIMELINE_COLUMNS))
    frame.attrs["step_seconds"] = {stage: float(times.step_seconds[i])
                                   for i, stage in enumerate(stages)}
    return _attrs(frame, what, gpus, layout, ic, device, compute, result)


def tradeoff_frame(model: str | TransformerConfig, gpus, link: str | Interconnect,
                   device: str | Device, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                   mfu: float = DEFAULT_COMPUTE.mfu, stages=STAGES,
                   layout: str | Layout = "mixed-adam",
                   gpus_per_node: int | None = None) -> pd.DataFrame:
    """Per stage: the peak memory per GPU (model state + working set, :mod:`working_set`)
    beside the step time and its parts. The tokens per GPU and the recomputation come from
    ``settings`` (sequence length x micro-batch; 8 FLOPs per parameter and token under full
    recomputation), so memory and time describe the same run."""
    import pandas as pd
    config = get_model(model)
    if settings.tensor_parallel != 1:
        raise ValueError("tensor_parallel must be 1 here: the step model times data-parallel "
                         "collectives only (tensor-parallel traffic is not modelled)")
    compute = ComputeSettings(settings.seq_len * settings.micro_batch, check_mfu(mfu),
                              settings.recompute == "full")
    gpus, stages, layout, ic, device, result, what, times = _timed(
        config, gpus, stages, layout, link, device, compute, gpus_per_node)
    memory = [p.total for p in peaks(config, gpus, stages, settings, layout)]
    frame = pd.DataFrame({
        "stage": list(stages), "strategy": [STRATEGY_NAMES[s] for s in stages],
        "memory_bytes": np.array(memory, dtype=np.int64),
        "compute_seconds": times.compute_seconds,
        "communication_seconds": times.communication_seconds,
        "exposed_seconds": times.exposed_seconds, "step_seconds": times.step_seconds,
        "network_wait_fraction": times.network_wait_fraction,
        "sent_bytes": result.total_sent.astype(np.int64),
    }, columns=list(TRADEOFF_COLUMNS))
    frame.attrs["settings"] = settings
    return _attrs(frame, what, gpus, layout, ic, device, compute, result)


def communication_rows(model, gpus, stages=STAGES, layout: str | Layout = "mixed-adam",
                       link: str | Interconnect | None = None, device: str | Device | None = None,
                       compute: ComputeSettings = DEFAULT_COMPUTE,
                       gpus_per_node: int | None = None) -> list[dict]:
    """Per stage, the ``communication`` object of ``zerolib estimate``'s JSON: per collective
    kind the calls and bytes handed, sent and received per GPU (and seconds with a link); the
    totals; with a link and a device with a peak, compute, exposed and step seconds and the
    network-wait fraction (None where they cannot be computed)."""
    gpus = check_single(gpus, check_gpus, "gpus")
    stages, layout = _stages(stages), get_layout(layout)
    result, _ = _traffic(model, gpus, stages, layout)
    ic = None if link is None else interconnect(link, gpus_per_node)
    times: StepTime | None = None
    if ic is not None and device is not None:
        times = step_time(result, ic, get_device(device), compute)
    kind_seconds = None
    if ic is not None:
        kind_seconds = {kind: sum(collective_seconds(kind, result.sent[s.name], result.calls[s.name],
                                                     result.gpus, ic)
                                  for s in SLOTS if s.kind == kind) for kind in KINDS}
    calls, handed, sent = (result.by_kind(w) for w in ("calls", "handed", "sent"))
    rows = []
    for i in range(len(stages)):
        collectives = {kind: {"calls": int(calls[kind][i]), "handed_bytes": int(handed[kind][i]),
                              "sent_bytes": int(sent[kind][i]),
                              "received_bytes": int(sent[kind][i]),
                              "seconds": None if kind_seconds is None
                              else float(kind_seconds[kind][i])}
                       for kind in KINDS}
        row = {"collectives": collectives, "sent_bytes": int(result.total_sent[i]),
               "received_bytes": int(result.total_sent[i]),
               "communication_seconds": None if kind_seconds is None
               else float(sum(kind_seconds[k][i] for k in KINDS))}
        for key in ("compute_seconds", "exposed_seconds", "step_seconds", "network_wait_fraction"):
            row[key] = None if times is None else float(getattr(times, key)[i])
        rows.append(row)
    return rows
