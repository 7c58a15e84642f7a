"""How long a step's collectives take when each runs on the link it uses: shard groups, ZeRO++
and offload, timed with the ring model of :mod:`zerolib.core.catalogue.nodes`; the ``communication``
object of ``zerolib estimate`` and the table behind the group-size traffic figure.

**Which link.** Each slot of :data:`zerolib.core.step.group_traffic.GROUP_SLOTS` runs over the GPUs
of its ring (:class:`~zerolib.core.step.group_traffic.GroupTraffic`'s ``ring_gpus``), placed on the
interconnect's nodes: a ring inside one node runs at the intra-node link's rate (a shard group
of G <= GPUs per node: NVLink on an NVLink server); a ring spanning nodes at ``min(intra-node
rate, ports x port rate / sharing)``, where ``sharing`` rings leave each node at once through
its ports (1 for a group's own ring, which has the node's ports to itself as the full ring
does; min(G, K) for the all-reduces across the replicas, one ring per shard index on the node;
K for qgZ's all-to-all across nodes). Latency: NCCL's base plus a hop per step, the network's
for the steps that cross nodes (:func:`zerolib.core.catalogue.nodes.spanning_latency`). With a single
link (no nodes) every ring runs on it alike.

**The step** is :mod:`zerolib.core.step.time`'s: collectives one after another, the forward ones
overlapping the forward compute, the backward ones (now with the replicas' all-reduce and qgZ's
all-to-alls) the backward compute, the after-step all-gather nothing. Offload adds each phase's
host transfers (:mod:`zerolib.core.step.offload_traffic`) to that phase's communication, after its
collectives (the GPU's PCIe path also carries the network's traffic on most servers): the
gradient copies hide behind the backward pass, the parameter fetches behind the pass that needs
them, the after-step copies and NVMe reads and writes hide behind nothing. With the default
placement and G = N the numbers are exactly :func:`zerolib.core.step.time.step_time`'s.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.links import Link, get_link
from zerolib.core.catalogue.models import TransformerConfig, get_model, parameter_count
from zerolib.core.catalogue.nodes import Interconnect, interconnect, spanning_bandwidth, spanning_latency
from zerolib.core.inputs import check_flag, check_gpus, check_single, check_stage
from zerolib.core.memory.accounting import STAGES, STRATEGY_NAMES, Layout, get_layout
from zerolib.core.memory.placement import (
    DEFAULT_PLACEMENT,
    Placement,
    check_placement,
)
from zerolib.core.memory.tables import divisors
from zerolib.core.step.group_traffic import (
    GROUP_KINDS,
    GROUP_SLOTS,
    GroupTraffic,
    check_aligned,
    group_traffic,
)
from zerolib.core.step.offload_traffic import (
    DEFAULT_HOST_LINK,
    DIRECTIONS,
    HOST_SLOTS,
    HostTraffic,
    host_traffic,
)
from zerolib.core.step.time import DEFAULT_COMPUTE, ComputeSettings, compute_seconds
from zerolib.core.step.traffic import PHASES

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

GROUP_TRAFFIC_COLUMNS = ("gpus", "shard_group", "replicas", "stage", "strategy", "sent_bytes",
                         "inside_node_bytes", "across_nodes_bytes", "cross_node_bytes",
                         "communication_seconds", "compute_seconds", "exposed_seconds",
                         "step_seconds", "network_wait_fraction")


@dataclass(frozen=True)
class GroupStepTime:
    """Seconds of one step per setting (float64 arrays broadcast like the traffic).

    ``compute`` and ``exposed`` are None when no device was given (no compute time).
    """

    slot_seconds: Mapping[str, np.ndarray] = field(repr=False)
    slot_bandwidth: Mapping[str, np.ndarray] = field(repr=False)
    host: Mapping[str, np.ndarray] = field(repr=False)         # per phase
    compute: Mapping[str, np.ndarray] | None = field(repr=False)
    exposed: Mapping[str, np.ndarray] | None = field(repr=False)

    @property
    def communication_seconds(self) -> np.ndarray:
        """All collectives back to back (host transfers not included)."""
        return sum(self.slot_seconds.values())

    @property
    def host_seconds(self) -> np.ndarray:
        """All host transfers of the step (PCIe copies and NVMe)."""
        return sum(self.host.values())

    def kind_seconds(self, kind: str) -> np.ndarray:
        return sum(self.slot_seconds[s.name] for s in GROUP_SLOTS if s.kind == kind)

    @property
    def compute_seconds(self) -> np.ndarray | None:
        return None if self.compute is None else self.compute["forward"] + self.compute["backward"]

    @property
    def exposed_seconds(self) -> np.ndarray | None:
        return None if self.exposed is None else sum(self.exposed.values())

    @property
    def step_seconds(self) -> np.ndarray | None:
        return None if self.compute is None else self.compute_seconds + self.exposed_seconds

    @property
    def network_wait_fraction(self) -> np.ndarray | None:
        return None if self.compute is None else self.exposed_seconds / self.step_seconds


def _check_node(traffic: GroupTraffic, ic: Interconnect) -> None:
    if ic.gpus_per_node is not None and ic.gpus_per_node != traffic.gpus_per_node:
        raise ValueError(f"the traffic was placed on nodes of {traffic.gpus_per_node} GPUs, the "
                         f"interconnect {ic.name} has {ic.gpus_per_node} per node: give "
                         "group_traffic the interconnect's gpus_per_node")


def group_step_time(traffic: GroupTraffic, link: str | Interconnect,
                    device: str | Device | None = None,
                    compute: ComputeSettings = DEFAULT_COMPUTE, host: HostTraffic | None = None,
                    host_link: str | Link = DEFAULT_HOST_LINK,
                    nvme_link: str | Link | None = None) -> GroupStepTime:
    """Seconds of each collective on its link, the host transfers, the compute (with a device)
    and what is exposed (see the module doc)."""
    if not isinstance(traffic, GroupTraffic):
        raise TypeError(f"traffic must be a GroupTraffic, got {type(traffic).__name__}")
    ic = interconnect(link)
    _check_node(traffic, ic)
    seconds, bandwidth = {}, {}
    for slot in GROUP_SLOTS:
        name = slot.name
        # No nodes: one link joins every GPU alike, every ring on it.
        nodes = traffic.ring_nodes[name] if ic.network is not None else np.ones_like(traffic.gpus)
        bandwidth[name] = spanning_bandwidth(ic, nodes, traffic.sharing[name])
        latency = spanning_latency(ic, slot.kind, traffic.ring_gpus[name], nodes)
        seconds[name] = (np.asarray(traffic.calls[name], dtype=np.float64) * latency
                         + np.asarray(traffic.sent[name], dtype=np.float64) / bandwidth[name])
    zero = np.zeros(traffic.gpus.shape)
    host_time = (dict.fromkeys(PHASES, zero) if host is None
                 else dict(host.seconds(host_link, nvme_link)))
    compute_by_phase = exposed = None
    if device is not None:
        if not isinstance(compute, ComputeSettings):
            raise TypeError(f"compute must be a ComputeSettings, got {type(compute).__name__}")
        forward, backward = compute_seconds(traffic.params, get_device(device), compute)
        compute_by_phase = MappingProxyType({"forward": forward, "backward": backward})
        phase = {p: sum(seconds[s.name] for s in GROUP_SLOTS if s.phase == p) + host_time[p]
                 for p in PHASES}
        exposed = MappingProxyType({"forward": np.maximum(phase["forward"] - forward, 0.0),
                                    "backward": np.maximum(phase["backward"] - backward, 0.0),
                                    "after_step": phase["after_step"]})
    return GroupStepTime(MappingProxyType(seconds), MappingProxyType(bandwidth),
                         MappingProxyType(host_time), compute_by_phase, exposed)


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


def group_communication_rows(model, gpus, stages=STAGES, layout: str | Layout = "mixed-adam",
                             link: str | Interconnect | None = None,
                             device: str | Device | None = None,
                             compute: ComputeSettings = DEFAULT_COMPUTE,
                             placement: Placement | None = None, qwz: bool = False,
                             qgz: bool = False, gpus_per_node: int | None = None,
                             host_link: str | Link = DEFAULT_HOST_LINK,
                             nvme_link: str | Link | None = None) -> list[dict]:
    """Per stage, the ``communication`` object of ``zerolib estimate``: the keys of
    :func:`zerolib.core.step.tables.communication_rows` (``collectives`` gains ``all_to_all``;
    with the default placement every shared value is identical) plus ``shard_group``,
    ``replicas``, ``cross_node_bytes`` (bytes leaving a node per step; None without nodes),
    ``host_seconds``, ``schedule`` (one entry per collective in use: its ring, link, bus
    bandwidth, calls, bytes and seconds) and ``host`` (None without offload: the bytes per
    direction, their seconds and each transfer)."""
    gpus = check_single(gpus, check_gpus, "gpus")
    stages = tuple(sorted(set(check_stage(stages, "stages").ravel().tolist())))
    layout = get_layout(layout)
    placement = check_placement(placement)
    ic = None if link is None else interconnect(link, gpus_per_node)
    per_node = _node_size(ic, placement, gpus)
    traffic = group_traffic(model, gpus, list(stages), layout, placement.shard_group,
                            placement.hpz_partition, check_flag(qwz, "qwz"),
                            check_flag(qgz, "qgz"), per_node)
    params = (parameter_count(get_model(model)) if isinstance(model, (str, TransformerConfig))
              else int(traffic.params[0]))
    host = host_traffic(params, gpus, list(stages), layout, placement) if placement.offloads else None
    times = None
    if ic is not None:
        times = group_step_time(traffic, ic, device, compute, host, host_link, nvme_link)
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
                   schedule=_schedule(traffic, times, ic, i),
                   host=None if host is None else _host(host, times, host_link, nvme_link, i))
        rows.append(row)
    return rows


def _schedule(traffic: GroupTraffic, times: GroupStepTime | None, ic, i: int) -> list[dict]:
    entries = []
    for slot in GROUP_SLOTS:
        name = slot.name
        if not traffic.calls[name][i]:
            continue
        spans = bool(traffic.ring_nodes[name][i] > 1) and ic is not None and ic.network is not None
        entries.append({
            "name": name, "label": slot.label, "phase": slot.phase, "kind": slot.kind,
            "ring": traffic._ring(slot), "ring_gpus": int(traffic.ring_gpus[name][i]),
            "link": None if ic is None else _link_name(ic, spans),
            "bus_bandwidth": None if times is None else float(times.slot_bandwidth[name][i]),
            "calls": int(traffic.calls[name][i]), "handed_bytes": int(traffic.handed[name][i]),
            "sent_bytes": int(traffic.sent[name][i]),
            "received_bytes": int(traffic.sent[name][i]),
            "cross_node_bytes": (int(traffic.cross_node[name][i])
                                 if ic is not None and ic.network is not None else None),
            "seconds": None if times is None else float(times.slot_seconds[name][i])})
    return entries


def _host(host: HostTraffic, times: GroupStepTime | None, host_link, nvme_link, i: int) -> dict:
    link = get_link(host_link)
    nvme = link if nvme_link is None else get_link(nvme_link)
    directions = host.by_direction()
    return {"link": link.name, "bandwidth": link.bandwidth, "nvme_link": nvme.name,
            "nvme_bandwidth": nvme.bandwidth,
            **{f"{d}_bytes": int(directions[d][i]) for d in DIRECTIONS},
            "seconds": None if times is None else float(times.host_seconds[i]),
            "transfers": [{"name": s.name, "label": s.label, "phase": s.phase,
                           "direction": s.direction, "bytes": int(host.bytes[s.name][i])}
                          for s in HOST_SLOTS if host.bytes[s.name][i]]}


# --- the group-size sweep ----------------------------------------------------------------------

def group_traffic_table(model: str | TransformerConfig, gpus, link: str | Interconnect,
                        device: str | Device, compute: ComputeSettings = DEFAULT_COMPUTE,
                        stages=STAGES, layout: str | Layout = "mixed-adam", shard_groups=None,
                        gpus_per_node: int | None = None) -> pd.DataFrame:
    """Per shard-group size G and stage: the bytes each GPU sends in one step, split into rings
    inside a node and rings across nodes, the bytes leaving each node, and the step's times on
    ``link`` (a node: groups placed on its nodes) with ``device``'s compute. G runs over every
    divisor of ``gpus`` that sits inside a node or spans whole nodes (or ``shard_groups``).

    ``attrs``: model, gpus, layout, interconnect, device, compute, gpus_per_node.
    """
    import pandas as pd
    config, layout = get_model(model), get_layout(layout)
    gpus = check_single(gpus, check_gpus, "gpus")
    ic = interconnect(link, gpus_per_node)
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
    traffic = group_traffic(config, gpus, stage_grid, layout, group_grid,
                            gpus_per_node=per_node)
    times = group_step_time(traffic, ic, device, compute)
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
