"""The price of ZeRO as tables: traffic per stage and collective, the step's timeline,
per-GPU memory against step time, and traffic and step time per shard-group size; plus the
per-stage ``communication`` object of ``zerolib estimate``. Every number comes from the one
schedule (:mod:`zerolib.core.step.traffic`) timed by :mod:`zerolib.core.step.time`.

Each frame carries what a chart's title needs in ``attrs``: ``model`` (a TransformerConfig, or
the parameter count of a bare model), ``gpus``, ``layout``, and for the timed frames
``interconnect``, ``device`` and ``compute`` (a :class:`~zerolib.core.step.time.ComputeSettings`).
Bytes are int64, seconds float64.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.catalogue.nodes import Interconnect, bus_bandwidth, interconnect
from zerolib.core.inputs import check_gpus, check_single, check_stage
from zerolib.core.memory.accounting import (
    CATEGORIES,
    STAGES,
    STRATEGY_NAMES,
    Layout,
    get_layout,
    model_state,
)
from zerolib.core.memory.placement import DEFAULT_PLACEMENT, Placement, check_placement, placement_on
from zerolib.core.memory.tables import MAX_SHARD_GPUS, divisors
from zerolib.core.memory.working_set import DEFAULT_SETTINGS, WorkingSetSettings, peaks
from zerolib.core.step.collectives import KINDS
from zerolib.core.step.offload_traffic import (
    DIRECTIONS,
    HOST_SLOTS,
    HostSettings,
    HostTraffic,
    check_host_settings,
    host_traffic,
    node_host_settings,
)
from zerolib.core.step.time import DEFAULT_COMPUTE, ComputeSettings, StepTime, check_mfu, step_time
from zerolib.core.step.traffic import (
    GROUP_KINDS,
    GROUP_SLOTS,
    SLOTS,
    STEP_PHASES,
    Traffic,
    check_aligned,
    layer_units,
)
from zerolib.core.step.traffic import traffic as count_traffic

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

TRAFFIC_COLUMNS = ("stage", "strategy", "kind", "calls", "handed_bytes", "sent_bytes",
                   "received_bytes")
TIMELINE_COLUMNS = ("stage", "strategy", "lane", "block", "label", "start_seconds",
                    "end_seconds", "sent_bytes", "calls")
TRADEOFF_COLUMNS = ("stage", "strategy", "memory_bytes", "compute_seconds",
                    "communication_seconds", "exposed_seconds", "step_seconds",
                    "network_wait_fraction", "sent_bytes")
OVERLAP_COLUMNS = ("engine", "overlap", "stage", "strategy", "compute_seconds",
                   "communication_seconds", "exposed_seconds", "step_seconds",
                   "network_wait_fraction")
GROUP_TRAFFIC_COLUMNS = ("gpus", "shard_group", "replicas", "stage", "strategy", "sent_bytes",
                         "inside_node_bytes", "across_nodes_bytes", "cross_node_bytes",
                         "communication_seconds", "compute_seconds", "exposed_seconds",
                         "step_seconds", "network_wait_fraction")
COMPUTE_BLOCKS = {"forward": "forward", "backward": "backward"}


def _stages(stages) -> tuple[int, ...]:
    return tuple(sorted(set(check_stage(stages, "stages").ravel().tolist())))


def _traffic(model, gpus: int, stages, layout: Layout, engine="paper", micro_batches: int = 1,
             placement: Placement | None = None) -> tuple[Traffic, object]:
    if isinstance(model, (str, TransformerConfig)):
        config = get_model(model)
        return count_traffic(config, gpus, list(stages), layout, placement=placement, engine=engine,
                          micro_batches=micro_batches), config
    result = count_traffic(model, gpus, list(stages), layout, placement=placement, engine=engine,
                        micro_batches=micro_batches)
    return result, int(result.params[0])


def traffic_frame(model, gpus, stages=STAGES, layout: str | Layout = "mixed-adam",
                  engine="paper", micro_batches: int = 1) -> pd.DataFrame:
    """One row per stage and collective kind: calls, bytes handed over, sent and received per GPU
    in one step as ``engine`` runs it over ``micro_batches`` (the chapter's figures: the
    paper's schedule). ``model`` is a preset, a TransformerConfig or a bare parameter count."""
    import pandas as pd
    gpus = check_single(gpus, check_gpus, "gpus")
    stages, layout = _stages(stages), get_layout(layout)
    result, what = _traffic(model, gpus, stages, layout, engine, micro_batches)
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


def _timed(model, gpus, stages, layout, link, device, compute, host=None, engine="paper"):
    gpus = check_single(gpus, check_gpus, "gpus")
    stages, layout = _stages(stages), get_layout(layout)
    ic = interconnect(link)
    device = get_device(device)
    if not isinstance(compute, ComputeSettings):
        raise TypeError(f"compute must be a ComputeSettings, got {type(compute).__name__}")
    result, what = _traffic(model, gpus, stages, layout, engine)
    settings = node_host_settings(ic.name)
    traffic = None if host is None else host(result, stages, layout)
    times = step_time(result, ic, device, compute, traffic, settings)
    if host is None:
        return gpus, stages, layout, ic, device, result, what, times
    return gpus, stages, layout, ic, device, result, what, times, traffic, settings


def _attrs(frame, what, gpus, layout, ic, device, compute, result: Traffic):
    frame.attrs.update(model=what, gpus=gpus, layout=layout, interconnect=ic, device=device,
                       compute=compute, layers=result.layers, engine=result.engine,
                       bus_bandwidth=float(bus_bandwidth(ic, gpus)))
    return frame


def timeline_frame(model, gpus, link: str | Interconnect, device: str | Device,
                   compute: ComputeSettings = DEFAULT_COMPUTE, stages=STAGES,
                   layout: str | Layout = "mixed-adam",
                   placement: Placement | None = None) -> pd.DataFrame:
    """The blocks of one step per stage (the paper's schedule), placed in time as the overlap model of
    :mod:`zerolib.core.step.time` has them: lane "compute" (forward, backward, and "waiting" where
    the GPU waits for the network) and lane "network" (one block per collective slot in use).
    ``link`` is a node or link, or an :class:`~zerolib.core.catalogue.nodes.Interconnect` (its
    own GPUs per node). With an offloading ``placement`` (the collectives stay the flat
    schedule's), each phase's host transfers follow its collectives on lane "network" (block
    ``host_PHASE``) and the CPU's optimizer step opens the after-step phase on lane "host"
    (block ``cpu_optimizer_step``; on the node's own host, the roofline, over its default PCIe
    link: :func:`zerolib.core.step.offload_traffic.node_host_settings`).

    Phase by phase: the forward ends when both its compute and its gathers are done; the
    backward starts then, and its collectives start with it; the after-step all-gather starts
    when the backward's compute and collectives are both done (and the CPU's step, with one).
    """
    import pandas as pd
    placement = check_placement(placement)
    host = None
    if placement.offloads:
        def host(result, stages, layout):
            return host_traffic(int(result.params[0]), result.gpus[0], list(stages), layout,
                                placement)
    gpus, stages, layout, ic, device, result, what, times, *offload = _timed(
        model, gpus, stages, layout, link, device, compute, host)
    before = np.zeros(len(stages))   # the after-step NVMe reads, which the CPU's step waits for
    if offload:
        traffic, settings = offload
        read, _ = traffic.nvme_bandwidth(settings.host_link, settings.nvme_link, settings)
        before = traffic.phase_bytes("after_step")["nvme_read"] / read
    rows = []
    for i, stage in enumerate(stages):
        common = {"stage": stage, "strategy": STRATEGY_NAMES[stage]}

        def block(lane, name, label, start, end, sent=0, calls=0, common=common):
            rows.append({**common, "lane": lane, "block": name, "label": label,
                         "start_seconds": float(start), "end_seconds": float(end),
                         "sent_bytes": int(sent), "calls": int(calls)})

        start = 0.0
        for phase in STEP_PHASES:
            compute_time = float(times.compute[phase][i]) if phase in times.compute else 0.0
            if compute_time:
                block("compute", phase, COMPUTE_BLOCKS[phase], start, start + compute_time)
            network = start
            copies = float(times.host[phase][i])

            def host_block(name, label, seconds, lane="network"):
                nonlocal network
                if seconds:
                    block(lane, name, label, network, network + seconds)
                    network += seconds

            if phase == "after_step":
                # NVMe reads the state, the CPU steps on it, the results go back (PCIe up, NVMe
                # written), and then the stage 1-2 all-gather can spread them.
                host_block("host_nvme_read", "NVMe reads for the optimizer step", before[i])
                host_block("cpu_optimizer_step", "the CPU's optimizer step",
                           float(times.cpu_step_seconds[i]), lane="host")
                host_block("host_after_step", "host transfers after the step (PCIe, NVMe)",
                           copies - before[i])
            for slot in SLOTS:
                if slot.phase == phase and result.calls[slot.name][i]:
                    seconds = float(times.slot_seconds[slot.name][i])
                    block("network", slot.name, slot.label, network, network + seconds,
                          result.sent[slot.name][i], result.calls[slot.name][i])
                    network += seconds
            if phase != "after_step":
                host_block(f"host_{phase}", "host transfers (PCIe copies, NVMe)", copies)
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
                   mfu: float = DEFAULT_COMPUTE.mfu, layout: str | Layout = "mixed-adam",
                   engine="paper") -> pd.DataFrame:
    """Per stage ``engine`` offers, as it runs them (the chapter's figure: the paper's schedule):
    the peak memory per GPU (model state + working set, :mod:`working_set`) beside the step time
    and its parts, on ``link`` (a node or link, or an
    :class:`~zerolib.core.catalogue.nodes.Interconnect`: its own GPUs per node). The tokens per
    GPU and the recomputation come from ``settings`` (sequence length x micro-batch; its
    recompute setting chooses the FLOPs, :meth:`~zerolib.core.step.time.ComputeSettings.for_run`),
    so memory and time describe the same run. Each stage's row is its own: fewer stages are a
    selection of the rows."""
    import pandas as pd

    from zerolib.core.step.engines import get_engine
    config = get_model(model)
    if settings.tensor_parallel != 1:
        raise ValueError("tensor_parallel must be 1 here: the step model times data-parallel "
                         "collectives only (tensor-parallel traffic is not modelled)")
    compute = ComputeSettings.for_run(config, settings, check_mfu(mfu))
    gpus, stages, layout, ic, device, result, what, times = _timed(
        config, gpus, get_engine(engine).stages, layout, link, device, compute, engine=engine)
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


# --- the estimate's communication object -------------------------------------------------------

def _node_size(ic: Interconnect | None, placement: Placement, gpus: int) -> int:
    """The node size the rings are placed on: the interconnect's; without nodes (a single link
    joins every GPU alike, or no link) the placement's, else all GPUs as one node."""
    if ic is not None and ic.gpus_per_node is not None:
        if placement.gpus_per_node not in (None, ic.gpus_per_node):
            raise ValueError(f"placement.gpus_per_node ({placement.gpus_per_node}) differs from "
                             f"the GPUs per node of {ic.name} ({ic.gpus_per_node})")
        return ic.gpus_per_node
    return gpus if placement.gpus_per_node is None else placement.gpus_per_node


def _link_name(ic: Interconnect, spans_nodes: bool) -> str:
    return ic.network.name if spans_nodes and ic.network is not None else ic.intra.name


def _float(value) -> float | None:
    return None if value is None else float(value)


def step_traffic(model, gpus, stages=STAGES, layout: str | Layout = "mixed-adam",
                 link: str | Interconnect | None = None, placement: Placement | None = None,
                 engine="paper", micro_batches: int = 1) -> Traffic:
    """The step's collectives per stage that ``zerolib estimate`` reports
    (:func:`zerolib.core.step.traffic.traffic` under ``placement``: its shard group and ZeRO++),
    their rings placed on the nodes of ``link`` (without nodes: the placement's, else every GPU
    as one node), as ``engine`` runs them over ``micro_batches`` micro-batches."""
    gpus = check_single(gpus, check_gpus, "gpus")
    placement = check_placement(placement)
    ic = None if link is None else interconnect(link)
    per_node = _node_size(ic, placement, gpus)
    return count_traffic(model, gpus, list(_stages(stages)), layout,
                      placement=replace(placement, gpus_per_node=per_node), engine=engine,
                      micro_batches=micro_batches)


def communication_rows(traffic: Traffic, link: str | Interconnect | None = None,
                       device: str | Device | None = None,
                       compute: ComputeSettings = DEFAULT_COMPUTE,
                       placement: Placement | None = None,
                       host_settings: HostSettings | None = None, overlap=None) -> list[dict]:
    """Per stage of ``traffic`` (:func:`step_traffic`), the ``communication`` object of ``zerolib
    estimate``'s JSON: per collective kind (:data:`zerolib.core.step.traffic.GROUP_KINDS`) the
    calls and bytes handed, sent and received per GPU (and seconds with a link); the totals;
    with a link and a device with a peak, compute, exposed and step seconds and the
    network-wait fraction (None where they cannot be computed); ``shard_group``, ``replicas``,
    ``cross_node_bytes`` (bytes leaving a node per step; None without nodes), ``host_seconds``,
    ``schedule`` (one entry per collective in use: its ring, link, bus bandwidth, calls, bytes
    and seconds), ``host`` (None unless ``placement`` offloads: the bytes per direction, their
    seconds and each transfer, the host assumed and the CPU's optimizer step) and
    ``cpu_step_seconds`` (the CPU's optimizer step, 0 without an offloaded optimizer; None
    without a link). ``host_settings`` None: the host of the node ``link`` names
    (:func:`zerolib.core.step.offload_traffic.node_host_settings`), the roofline alone, over its
    default PCIe link. The step's time under ``overlap`` (None: the traffic's engine's rule)."""
    if not isinstance(traffic, Traffic):
        raise TypeError(f"traffic must be a Traffic, got {type(traffic).__name__}")
    placement = check_placement(placement)
    ic = None if link is None else interconnect(link)
    stages, gpus = traffic.stage.tolist(), int(traffic.gpus[0])
    # The host's CPUs and drives are shared by the GPUs of the interconnect's node.
    on_node = (replace(placement, gpus_per_node=traffic.gpus_per_node)
               if ic is not None and ic.gpus_per_node is not None else placement)
    host = (host_traffic(int(traffic.params[0]), gpus, stages, traffic.layout, on_node)
            if placement.offloads else None)
    settings = (node_host_settings(None if ic is None else ic.name)
                if host_settings is None else check_host_settings(host_settings))
    times = None
    if ic is not None:
        times = step_time(traffic, ic, device, compute, host, settings, overlap)
    calls, handed, sent = (traffic.by_kind(w) for w in ("calls", "handed", "sent"))
    rows = []
    for i in range(len(stages)):
        collectives = {kind: {"calls": int(calls[kind][i]), "handed_bytes": int(handed[kind][i]),
                              "sent_bytes": int(sent[kind][i]),
                              "received_bytes": int(sent[kind][i]),
                              "seconds": None if times is None
                              else float(times.kind_seconds(kind)[i])}
                       for kind in GROUP_KINDS}
        row = {"collectives": collectives, "sent_bytes": int(traffic.total_sent[i]),
               "received_bytes": int(traffic.total_sent[i]),
               "communication_seconds": None if times is None
               else float(times.communication_seconds[i])}
        for key in ("compute_seconds", "exposed_seconds", "step_seconds", "network_wait_fraction"):
            value = None if times is None else getattr(times, key)
            row[key] = None if value is None else float(value[i])
        row.update(shard_group=int(traffic.shard_group[i]), replicas=int(traffic.replicas[i]),
                   cross_node_bytes=(int(traffic.total_cross_node[i])
                                     if ic is not None and ic.network is not None else None),
                   host_seconds=None if times is None else float(times.host_seconds[i]),
                   cpu_step_seconds=None if times is None else float(times.cpu_step_seconds[i]),
                   schedule=_schedule(traffic, times, ic, i),
                   host=None if host is None else _host(host, times, settings, i))
        rows.append(row)
    return rows


def _schedule(traffic: Traffic, times: StepTime | None, ic, i: int) -> list[dict]:
    entries = []
    for slot in GROUP_SLOTS:
        name = slot.name
        if not traffic.calls[name][i]:
            continue
        spans = bool(traffic.ring_nodes[name][i] > 1) and ic is not None and ic.network is not None
        entries.append({
            "name": name, "label": slot.ring_label, "phase": slot.phase, "kind": slot.kind,
            "ring": traffic.ring(slot), "ring_gpus": int(traffic.ring_gpus[name][i]),
            "link": None if ic is None else _link_name(ic, spans),
            "bus_bandwidth": None if times is None else float(times.slot_bandwidth[name][i]),
            "calls": int(traffic.calls[name][i]), "handed_bytes": int(traffic.handed[name][i]),
            "sent_bytes": int(traffic.sent[name][i]),
            "received_bytes": int(traffic.sent[name][i]),
            "cross_node_bytes": (int(traffic.cross_node[name][i])
                                 if ic is not None and ic.network is not None else None),
            "seconds": None if times is None else float(times.slot_seconds[name][i])})
    return entries


def _host(host: HostTraffic, times: StepTime | None, settings: HostSettings, i: int) -> dict:
    link, nvme_link = settings.host_link, settings.nvme_link
    nvme = link if nvme_link is None else nvme_link
    directions = host.by_direction()
    read, write = host.nvme_bandwidth(link, nvme_link, settings)
    return {"link": link.name, "bandwidth": link.bandwidth,
            # NVMe: the GPU's share of the host's drives capped at the link (nvme_link: null),
            # or an explicit link's rate.
            "nvme_link": None if nvme_link is None else nvme.name,
            "nvme_bandwidth": None if nvme_link is None else nvme.bandwidth,
            "nvme_read_bandwidth": float(read[i]), "nvme_write_bandwidth": float(write[i]),
            **{f"{d}_bytes": int(directions[d][i]) for d in DIRECTIONS},
            "seconds": None if times is None else float(times.host_seconds[i]),
            "host_settings": settings.as_dict(),
            "cpu_step": {"elements": int(host.cpu_step_elements[i]),
                         "bytes": int(host.cpu_step_bytes[i]),
                         "gpus_on_node": int(host.tiers.gpus_on_node[i]),
                         "roofline_seconds": float(host.cpu_roofline_seconds(settings)[i]),
                         "seconds": float(host.cpu_seconds(settings)[i])},
            "transfers": [{"name": s.name, "label": s.label, "phase": s.phase,
                           "direction": s.direction, "bytes": int(host.bytes[s.name][i])}
                          for s in HOST_SLOTS if host.bytes[s.name][i]]}


# --- the group-size sweep ----------------------------------------------------------------------

def group_traffic_table(model: str | TransformerConfig, gpus, link: str | Interconnect,
                        device: str | Device, compute: ComputeSettings = DEFAULT_COMPUTE,
                        stages=STAGES, layout: str | Layout = "mixed-adam",
                        shard_groups=None) -> pd.DataFrame:
    """Per shard-group size G and stage: the bytes each GPU sends in one step, split into rings
    inside a node and rings across nodes, the bytes leaving each node, and the step's times on
    ``link`` (a node, or an :class:`~zerolib.core.catalogue.nodes.Interconnect` with its own GPUs
    per node: groups placed on its nodes) with ``device``'s compute. G runs over every divisor
    of ``gpus`` that sits inside a node or spans whole nodes (or ``shard_groups``).

    ``attrs``: model, gpus, layout, interconnect, device, compute, gpus_per_node.
    """
    import pandas as pd

    config, layout = get_model(model), get_layout(layout)
    gpus = check_single(gpus, check_gpus, "gpus")
    ic = interconnect(link)
    device = get_device(device)
    per_node = _node_size(ic, DEFAULT_PLACEMENT, gpus)
    if shard_groups is None:
        groups = np.array([g for g in divisors(gpus)
                           if g in (1, gpus) or per_node % g == 0 or g % per_node == 0])
    else:
        groups = np.unique(check_gpus(shard_groups, "shard_groups").ravel())
        check_aligned(groups, np.asarray(gpus), per_node, "shard_groups")
    stages = np.unique(check_stage(stages, "stages").ravel())
    group_grid, stage_grid = (a.ravel() for a in np.meshgrid(groups, stages, indexing="ij"))
    traffic = count_traffic(config, gpus, stage_grid, layout, group_grid,
                         placement_on(per_node))
    times = step_time(traffic, ic, device, compute)
    inside = traffic.inside_node("sent")
    spans = ic.network is not None
    table = pd.DataFrame({
        "gpus": gpus, "shard_group": group_grid, "replicas": gpus // group_grid,
        "stage": stage_grid, "strategy": [STRATEGY_NAMES[int(s)] for s in stage_grid],
        "sent_bytes": traffic.total_sent,
        "inside_node_bytes": inside if spans else traffic.total_sent,
        "across_nodes_bytes": traffic.total_sent - inside if spans else 0,
        "cross_node_bytes": traffic.total_cross_node if spans else 0,
        "communication_seconds": times.communication_seconds,
        "compute_seconds": times.compute_seconds, "exposed_seconds": times.exposed_seconds,
        "step_seconds": times.step_seconds,
        "network_wait_fraction": times.network_wait_fraction,
    }, columns=list(GROUP_TRAFFIC_COLUMNS))
    for column in ("gpus", "shard_group", "replicas", "stage", "sent_bytes", "inside_node_bytes",
                   "across_nodes_bytes", "cross_node_bytes"):
        table[column] = table[column].astype(np.int64)
    table.attrs.update(model=config, gpus=gpus, layout=layout, interconnect=ic, device=device,
                       compute=compute, gpus_per_node=per_node)
    return table


# --- the overlap rules as a sensitivity --------------------------------------------------------

def overlap_frame(model, gpus, link: str | Interconnect, device: str | Device,
                  compute: ComputeSettings = DEFAULT_COMPUTE, engine="deepspeed",
                  layout: str | Layout = "mixed-adam", micro_batches: int = 1) -> pd.DataFrame:
    """Step time per stage under each overlap rule of
    :func:`zerolib.core.step.engines.overlap_rules` (the engine's own first), for the engine's
    schedule: one row per rule and stage the engine offers (tidy), so what "costs no time" costs
    under each assumption can be read side by side. ``link``: a node or link, or an
    :class:`~zerolib.core.catalogue.nodes.Interconnect` (its own GPUs per node)."""
    import pandas as pd

    from zerolib.core.step.engines import get_engine, overlap_rules
    engine = get_engine(engine)
    gpus = check_single(gpus, check_gpus, "gpus")
    stages = engine.stages
    layout = get_layout(layout)
    ic = interconnect(link)
    device = get_device(device)
    if not isinstance(compute, ComputeSettings):
        raise TypeError(f"compute must be a ComputeSettings, got {type(compute).__name__}")
    result = count_traffic(model, gpus, list(stages), layout, engine=engine,
                        micro_batches=micro_batches,
                        placement=None if ic.gpus_per_node is None else placement_on(ic.gpus_per_node))
    rows = []
    for name, rule in overlap_rules(engine).items():
        times = step_time(result, ic, device, compute, overlap=rule)
        for i, stage in enumerate(stages):
            rows.append({"engine": engine.name, "overlap": name, "stage": stage,
                         "strategy": STRATEGY_NAMES[stage],
                         "compute_seconds": float(times.compute_seconds[i]),
                         "communication_seconds": float(times.communication_seconds[i]),
                         "exposed_seconds": float(times.exposed_seconds[i]),
                         "step_seconds": float(times.step_seconds[i]),
                         "network_wait_fraction": float(times.network_wait_fraction[i])})
    frame = pd.DataFrame(rows, columns=list(OVERLAP_COLUMNS))
    what = get_model(model) if isinstance(model, (str, TransformerConfig)) else int(result.params[0])
    frame.attrs.update(engine=engine, micro_batches=micro_batches,
                       rules={name: rule for name, rule in overlap_rules(engine).items()})
    return _attrs(frame, what, gpus, layout, ic, device, compute, result)


STEP_SHARD_COLUMNS = ("phase", "label", "slot", "layer", "layer_params", "gpus", "stage", "gpu",
                      "category", "partitioned", "bytes", "shard_bytes", "others", "sent_bytes",
                      "step_sent_bytes")
# Stage 3's life of one layer in a step (ZeRO paper, Sec. VII-B2): the collective slot of
# :data:`~zerolib.core.step.traffic.GROUP_SLOTS` each moment runs, and what a GPU then holds of
# the partitions it does not own.
STEP_SHARD_PHASES = (
    ("forward_all_gather", "(a) Before the layer's forward: all-gather its parameters",
     "forward_all_gather", {"parameters": "gathered"}),
    ("gradient_reduce_scatter", "(b) After its backward: reduce-scatter its gradients",
     "gradient_reduce_scatter", {"gradients": "reduced away"}),
    # No collective follows the step at stage 3 (the next forward gathers): the slot that
    # would, stages 1-2's parameter all-gather, moves 0 bytes here.
    ("optimizer_step", "(c) Optimizer step: each GPU's own partition only", "parameter_all_gather", {}),
)


def step_shard_table(model: str | TransformerConfig, gpus, layout: str | Layout = "mixed-adam",
                     layer: int | None = None) -> pd.DataFrame:
    """One layer's shards through one ZeRO stage-3 step on ``gpus`` GPUs (at most
    :data:`~zerolib.core.memory.tables.MAX_SHARD_GPUS`): one row per moment of
    :data:`STEP_SHARD_PHASES` x GPU x category, columns as
    :func:`~zerolib.core.memory.tables.shard_table`'s plus the moment (``phase``, ``label``,
    the traffic ``slot``) and what it moves per GPU: ``sent_bytes`` for this layer (one call;
    a ring GPU receives as much) and ``step_sent_bytes`` for the slot over the whole step, both
    from :func:`zerolib.core.step.traffic.traffic` (the paper's schedule). ``others`` is
    ``"gathered"`` (held for the layer's pass, then freed), ``"reduced away"`` (computed, summed
    into the owners' shards, freed) or ``"not held"``. ``layer`` indexes the units stage 3
    gathers one by one (:func:`~zerolib.core.step.traffic.layer_units`); None: the middle one,
    a transformer block.
    """
    import pandas as pd
    config = get_model(model)
    gpus = check_single(gpus, check_gpus, "gpus")
    if gpus > MAX_SHARD_GPUS:
        raise ValueError(f"gpus must be at most {MAX_SHARD_GPUS} for a picture of one column "
                         f"per GPU, got {gpus:,}")
    layout = get_layout(layout)
    units = layer_units(config)
    if layer is None:
        layer = len(units) // 2
    whole = isinstance(layer, (int, np.integer)) and not isinstance(layer, bool)
    if not (whole and 0 <= layer < len(units)):
        raise ValueError(f"layer must be a whole number from 0 to {len(units) - 1} (the units "
                         f"{config.name} gathers one by one), got {layer!r}")
    layer = int(layer)
    elements = units[layer]
    held = model_state(elements, gpus, 3, layout)            # the layer's partitions
    one_layer = count_traffic([elements], gpus, 3, layout)   # one call per slot
    whole_step = count_traffic(config, gpus, 3, layout)
    rows = []
    for phase, label, slot, others in STEP_SHARD_PHASES:
        sent = int(one_layer.sent[slot][()])
        step_sent = int(whole_step.sent[slot][()])
        for gpu in range(gpus):
            for category in CATEGORIES:
                shard = int(getattr(held, category)[()])
                rows.append((phase, label, slot, layer, elements, gpus, 3, gpu, category, True,
                             shard, shard, others.get(category, "not held"), sent, step_sent))
    frame = pd.DataFrame(rows, columns=list(STEP_SHARD_COLUMNS))
    for column in ("layer", "layer_params", "gpus", "stage", "gpu", "bytes", "shard_bytes",
                   "sent_bytes", "step_sent_bytes"):
        frame[column] = frame[column].astype(np.int64)
    frame.attrs.update(model=config, layout=layout)
    return frame
