"""What each GPU communicates in one step when the state is sharded over a group, and which
collectives cross the nodes: shard groups (HSDP, MiCS) and ZeRO++ (hpZ, qwZ, qgZ).

A **shard group** of G of the N data-parallel GPUs (G divides N; R = N / G replicas, see
:mod:`zerolib.core.memory.accounting`) changes the schedule of :mod:`zerolib.core.step.traffic`
as PyTorch FSDP's hybrid sharding does it (FSDP2 ``fully_shard`` on a 2-D mesh: "for HSDP",
``set_requires_gradient_sync`` "controls both reduce-scatter and all-reduce together") and
DeepSpeed's MiCS (``mics.py``: the stage-3 reduce-scatter within the shard group, then
``all_reduce_coalesced`` across the replication group):

- the all-gathers (stage 3 per layer, forward and backward; stages 1-2 after the optimizer
  step) and the gradient reduce-scatter run **inside the group**, over G GPUs: each moves
  (G - 1) chunks of ceil(E / G) elements;
- then each GPU **all-reduces its gradient shard across the R replicas** (the GPUs at the same
  place in the other groups; per layer under stage 3, as FSDP2 does right after each
  reduce-scatter): a ring over R GPUs of the ceil(E / G)-element shard, 2 (R - 1) chunks of
  ceil(ceil(E / G) / R) = ceil(E / N) elements;
- stage 0 keeps its all-reduce over all N (it shards nothing). G = N is exactly the schedule
  of :mod:`zerolib.core.step.traffic`; G = 1 all-reduces every gradient over all N GPUs:
  plain data parallelism's traffic, per layer under stage 3.

Per GPU the bytes hardly change with G (about 2 Psi for stages 0-2, 3 Psi for stage 3, as in
the ZeRO paper); what changes is **where they go**. Ranks fill nodes in order and groups are
consecutive ranks (``init_device_mesh`` on a (R, G) mesh; MiCS ``np.arange(world_size).reshape(-1,
shard_size)``), so a group of G <= K GPUs per node sits inside one node, on the node's fast
link, and the replicas' all-reduce crosses the nodes. The model needs every group inside a node
or spanning whole nodes: G divides K or K divides G (likewise hpZ's group).

**ZeRO++** (Wang et al., arXiv 2306.10209; DeepSpeed 0.19.8, stage 3 over all N GPUs):

- **hpZ** (``zero_hpz_partition_size`` H): the backward all-gather gathers each layer from the
  secondary copy sharded over H GPUs (ideally a node's), a ring over H instead of N;
- **qwZ** (``zero_quantized_weights``): the parameter all-gathers (forward and backward, the
  hpZ one too: ``partitioned_param_coordinator.py`` fetches every parameter with ``quantize=
  self.zero_quantized_weights``) move 8-bit weights. DeepSpeed also all-gathers one fp32 scale
  per quantisation group of at most 16,000 elements (``CUDAQuantizer``, target 8,000: 4 bytes
  per 8,000 elements, 0.05 % more): **left out here, as in the ZeRO++ blog's table**;
- **qgZ** (``zero_quantized_gradients``): the gradient reduce-scatter becomes a hierarchical
  all-to-all of 4-bit gradients (``coalesced_collectives.all_to_all_quant_reduce``): an
  all-to-all inside the node over its k = min(N, K) GPUs (each hands the whole layer, padded to
  k chunks, and sends k - 1 of them), a reduction, then an all-to-all across the N / k nodes
  among the GPUs at the same place in each node (each hands its ceil(E / k) partial sums,
  sends all but one of N / k chunks); scales (one fp32 per quantisation group) again left out.
  DeepSpeed falls back to the reduce-scatter for 1-D tensors and sizes not divisible by 2N;
  zerolib applies qgZ to each layer's whole buffer.

**Crossing the nodes.** ``cross_node`` counts the bytes that leave one node in a step (per
node; what enters it is the same), the measure of the ZeRO++ blog's "cross-node communication
volume" (3M -> 0.75M): a ring that spans nodes carries each GPU's whole send across each node
boundary once (NCCL splits it over one ring per network port, each crossing once), so a
spanning ring moves, out of each node, the bytes one of its GPUs sends; the replicas'
all-reduce runs min(G, K) rings out of each node at once (one per shard index there), and
qgZ's all-to-all across nodes K at once, each GPU's send crossing whole. A ring inside a node
crosses nothing.

All byte counts are int64 and broadcast over (params, gpus, stage, shard_group): per slot at
most a few times params x 8 bytes, under 2**63 for every accepted input (params <= 10**15).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.inputs import (
    MAX_GPUS,
    broadcast,
    check_flag,
    check_gpus,
    check_params,
    check_positive_int,
    check_stage,
)
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import Layout, check_shard_group, get_layout
from zerolib.core.memory.placement import DEFAULT_GPUS_PER_NODE
from zerolib.core.step.collectives import KINDS, to_bytes
from zerolib.core.step.traffic import _check_units, layer_units

GROUP_KINDS = (*KINDS, "all_to_all")
# What each kind of ring runs over: every GPU, the shard group, the replicas of one shard,
# hpZ's group, the GPUs of one node (qgZ's first all-to-all), the nodes (its second).
RINGS = ("all", "group", "replicas", "hpz", "node", "nodes")
QWZ_BITS = 8    # qwZ: int8 weights ("from FP16 to INT8", DeepSpeed's ZeRO++ tutorial)
QGZ_BITS = 4    # qgZ: int4 gradients (all_to_all_quant_reduce: swizzle_quant(..., 4, ...))


@dataclass(frozen=True)
class GroupSlot:
    """One collective of a step with a shard group (or ZeRO++)."""

    name: str
    label: str
    phase: str         # forward | backward | after_step
    kind: str          # all_reduce | reduce_scatter | all_gather | all_to_all
    category: str      # the layout category whose width it moves
    stages: tuple[int, ...]
    ring: str          # one of RINGS (the backward all-gather runs over "hpz" with hpZ)


# In the order of zerolib.core.step.traffic.SLOTS, the new slots after the ones they join,
# so that a phase's or a kind's sum adds the same terms in the same order (G = N is exact).
GROUP_SLOTS: tuple[GroupSlot, ...] = (
    GroupSlot("forward_all_gather", "parameter all-gather in the shard group, per layer before "
              "its forward", "forward", "all_gather", "parameters", (3,), "group"),
    GroupSlot("backward_all_gather", "parameter all-gather in the shard group (hpZ: from the "
              "secondary copy in its group), per layer before its backward", "backward",
              "all_gather", "parameters", (3,), "group"),
    GroupSlot("gradient_all_reduce", "gradient all-reduce over every GPU, bucket by bucket "
              "during backward", "backward", "all_reduce", "gradients", (0,), "all"),
    GroupSlot("gradient_reduce_scatter", "gradient reduce-scatter in the shard group during "
              "backward", "backward", "reduce_scatter", "gradients", (1, 2, 3), "group"),
    GroupSlot("gradient_all_to_all_node", "qgZ: 4-bit gradient all-to-all inside the node, per "
              "layer", "backward", "all_to_all", "gradients", (3,), "node"),
    GroupSlot("gradient_all_to_all_nodes", "qgZ: 4-bit all-to-all of the node's partial sums "
              "across nodes, per layer", "backward", "all_to_all", "gradients", (3,), "nodes"),
    GroupSlot("replica_all_reduce", "all-reduce of each gradient shard across the replicas of "
              "the shard group", "backward", "all_reduce", "gradients", (1, 2, 3), "replicas"),
    GroupSlot("parameter_all_gather", "parameter all-gather in the shard group after the "
              "optimizer step", "after_step", "all_gather", "parameters", (1, 2), "group"),
)
GROUP_SLOT_NAMES = tuple(slot.name for slot in GROUP_SLOTS)
_BY_NAME = {slot.name: slot for slot in GROUP_SLOTS}


def check_aligned(size: np.ndarray, gpus: np.ndarray, per_node: int, name: str) -> None:
    """Every group of ``size`` consecutive ranks sits inside one node or spans whole nodes of
    ``per_node``: ``size`` divides ``per_node`` or ``per_node`` divides it (1 and ``gpus``
    always qualify: one GPU, or the ring over every GPU)."""
    size, gpus = np.broadcast_arrays(size, gpus)
    bad = (size > 1) & (size < gpus) & (per_node % size != 0) & (size % per_node != 0)
    if np.any(bad):
        first = int(size.ravel()[np.flatnonzero(bad.ravel())[0]])
        raise ValueError(f"{name} ({first}) and the GPUs per node ({per_node}) must divide one "
                         "another, so that every group sits inside a node or spans whole nodes "
                         "(a group straddling two nodes is not modelled)")


@dataclass(frozen=True)
class GroupTraffic:
    """One step's collectives per GPU, per slot of :data:`GROUP_SLOTS` (int64 arrays broadcast
    over the inputs; 0 where a setting does not use a slot). ``calls``, ``handed`` and ``sent``
    mean what they mean in :class:`zerolib.core.step.traffic.Traffic`; ``cross_node`` is the
    bytes leaving one node (see the module doc); ``ring_gpus`` and ``ring_nodes`` say how many
    GPUs and nodes each slot's ring spans, ``sharing`` how many such rings leave a node at once.
    """

    params: np.ndarray = field(repr=False)
    gpus: np.ndarray = field(repr=False)
    stage: np.ndarray = field(repr=False)
    shard_group: np.ndarray = field(repr=False)
    layout: Layout
    gpus_per_node: int                   # K: the node size the rings are placed on
    hpz_partition: int = 1               # H; 1: no hpZ
    qwz: bool = False
    qgz: bool = False
    units: tuple[int, ...] | None = None  # stage 3's layers; None: one flat buffer per pass

    @property
    def layers(self) -> int:
        return 1 if self.units is None else len(self.units)

    @property
    def replicas(self) -> np.ndarray:
        return self.gpus // self.shard_group

    def _layer_sum(self, elements) -> np.ndarray:
        """``elements(u)`` summed over stage 3's layers (each padded on its own)."""
        if self.units is None:
            return elements(self.params)
        total = np.zeros(self.gpus.shape, dtype=np.int64)
        for size in self.units:
            total = total + elements(size)
        return total

    # --- ring sizes ---------------------------------------------------------------------------

    @cached_property
    def _qgz_node(self) -> np.ndarray:
        """qgZ's local group: the GPUs of one node (all of them when fewer)."""
        return np.minimum(self.gpus, self.gpus_per_node)

    @cached_property
    def ring_gpus(self) -> Mapping[str, np.ndarray]:
        hpz = np.full(self.gpus.shape, self.hpz_partition, dtype=np.int64)
        sizes = {"all": self.gpus, "group": self.shard_group, "replicas": self.replicas,
                 "hpz": hpz, "node": self._qgz_node, "nodes": self.gpus // self._qgz_node}
        return MappingProxyType({slot.name: sizes[self._ring(slot)] for slot in GROUP_SLOTS})

    def _ring(self, slot: GroupSlot) -> str:
        if slot.name == "backward_all_gather" and self.hpz_partition > 1:
            return "hpz"
        return slot.ring

    @cached_property
    def ring_nodes(self) -> Mapping[str, np.ndarray]:
        """Nodes each slot's ring spans (1: inside a node)."""
        k = self.gpus_per_node
        spans = {"all": ceil_div(self.gpus, k), "group": ceil_div(self.shard_group, k),
                 "hpz": np.full(self.gpus.shape, ceil_div(self.hpz_partition, k)),
                 "replicas": ceil_div(self.gpus, np.maximum(self.shard_group, k)),
                 "node": np.ones_like(self.gpus), "nodes": self.gpus // self._qgz_node}
        return MappingProxyType({slot.name: spans[self._ring(slot)] for slot in GROUP_SLOTS})

    @cached_property
    def sharing(self) -> Mapping[str, np.ndarray]:
        """Rings of the slot that leave one node at once (they share its network ports)."""
        k = self.gpus_per_node
        ones = np.ones_like(self.gpus)
        shares = {"replicas": np.minimum(self.shard_group, k), "nodes": self._qgz_node}
        return MappingProxyType({slot.name: shares.get(self._ring(slot), ones)
                                 for slot in GROUP_SLOTS})

    # --- which slots run ----------------------------------------------------------------------

    def _bits(self, slot: GroupSlot) -> int:
        if self.qwz and slot.name in ("forward_all_gather", "backward_all_gather"):
            return QWZ_BITS
        if slot.kind == "all_to_all":
            return QGZ_BITS
        return self.layout.bits_per_param(slot.category)

    @cached_property
    def _active(self) -> Mapping[str, np.ndarray]:
        out = {}
        for slot in GROUP_SLOTS:
            low, high = slot.stages[0], slot.stages[-1]   # each slot's stages are a range
            on = (self.stage >= low) & (self.stage <= high) & (self.ring_gpus[slot.name] > 1)
            if slot.kind == "all_to_all":
                on = on & self.qgz
            elif slot.name == "gradient_reduce_scatter" and self.qgz:
                on = on & (self.stage != 3)
            out[slot.name] = on
        return out

    @cached_property
    def calls(self) -> Mapping[str, np.ndarray]:
        layered = np.where(self.stage == 3, self.layers, 1)
        return MappingProxyType({slot.name: layered * self._active[slot.name]
                                 for slot in GROUP_SLOTS})

    # --- elements per slot --------------------------------------------------------------------

    @cached_property
    def _elements(self) -> Mapping[str, tuple[np.ndarray, np.ndarray]]:
        """(handed, sent) elements per slot, before masking."""
        n, g, r = self.gpus, self.shard_group, self.replicas
        three = self.stage == 3
        flat_shard = ceil_div(self.params, g)                  # stages 1-2: one flat buffer
        layer_shards = self._layer_sum(lambda u: ceil_div(u, g))
        shard = np.where(three, layer_shards, flat_shard)
        replica_chunks = np.where(three, self._layer_sum(lambda u: ceil_div(ceil_div(u, g), r)),
                                  ceil_div(flat_shard, r))
        out = {
            "forward_all_gather": (layer_shards, (g - 1) * layer_shards),
            "gradient_all_reduce": (self.params, 2 * (n - 1) * ceil_div(self.params, n)),
            "gradient_reduce_scatter": (g * shard, (g - 1) * shard),
            "replica_all_reduce": (shard, 2 * (r - 1) * replica_chunks),
            "parameter_all_gather": (flat_shard, (g - 1) * flat_shard),
        }
        if self.hpz_partition > 1:
            h = self.hpz_partition
            secondary = self._layer_sum(lambda u: ceil_div(u, h))
            out["backward_all_gather"] = (secondary, (h - 1) * secondary)
        else:
            out["backward_all_gather"] = out["forward_all_gather"]
        k = self._qgz_node
        nodes = n // k
        if self.qgz:
            local = self._layer_sum(lambda u: ceil_div(u, k))
            across = self._layer_sum(lambda u: ceil_div(ceil_div(u, k), nodes))
        else:
            local = across = np.zeros(n.shape, dtype=np.int64)
        out["gradient_all_to_all_node"] = (k * local, (k - 1) * local)
        out["gradient_all_to_all_nodes"] = (nodes * across, (nodes - 1) * across)
        return out

    def _per_slot(self, which: int) -> Mapping[str, np.ndarray]:
        return MappingProxyType({
            slot.name: to_bytes(self._elements[slot.name][which], self._bits(slot))
            * self._active[slot.name] for slot in GROUP_SLOTS})

    @cached_property
    def handed(self) -> Mapping[str, np.ndarray]:
        return self._per_slot(0)

    @cached_property
    def sent(self) -> Mapping[str, np.ndarray]:
        return self._per_slot(1)

    @cached_property
    def cross_node(self) -> Mapping[str, np.ndarray]:
        """Bytes each slot moves out of one node per step (see the module doc)."""
        return MappingProxyType({
            name: np.where(self.ring_nodes[name] > 1, self.sharing[name] * self.sent[name], 0)
            for name in GROUP_SLOT_NAMES})

    # --- sums ---------------------------------------------------------------------------------

    def by_kind(self, what: str = "sent") -> dict[str, np.ndarray]:
        """``calls``, ``handed``, ``sent`` or ``cross_node`` summed per kind of
        :data:`GROUP_KINDS` (in slot order)."""
        if what == "sent" and self._plain_flat:
            return dict(self._flat_sent)
        values = {"calls": self.calls, "handed": self.handed, "sent": self.sent,
                  "cross_node": self.cross_node}[what]
        out = {kind: np.zeros(self.gpus.shape, dtype=np.int64) for kind in GROUP_KINDS}
        for slot in GROUP_SLOTS:
            out[slot.kind] = out[slot.kind] + values[slot.name]
        return out

    def inside_node(self, what: str = "sent") -> np.ndarray:
        """``sent`` or ``calls`` of the slots whose ring stays inside one node."""
        values = {"calls": self.calls, "sent": self.sent}[what]
        return sum(np.where(self.ring_nodes[n] <= 1, values[n], 0) for n in GROUP_SLOT_NAMES)

    @property
    def total_sent(self) -> np.ndarray:
        """Bytes one GPU sends in the step (and receives)."""
        return sum(self.sent.values())

    @property
    def total_cross_node(self) -> np.ndarray:
        """Bytes that leave one node in the step."""
        if self._plain_flat:
            return self._flat_cross_node
        return sum(self.cross_node.values())

    # --- the sweeps' path: one flat buffer in whole bytes, no ZeRO++ ----------------------------

    @property
    def _plain_flat(self) -> bool:
        whole = all(self.layout.bits_per_param(c) % 8 == 0 for c in ("parameters", "gradients"))
        return (self.units is None and whole and not (self.qwz or self.qgz)
                and self.hpz_partition == 1)

    @cached_property
    def _flat_sent(self) -> Mapping[str, np.ndarray]:
        """``by_kind("sent")`` in a few array operations: the all-reduce's chunks are
        ceil(ceil(P / G) / R) = ceil(P / N) elements whichever ring it is (all N GPUs under
        stage 0, the R replicas above), the group's collectives (G - 1) chunks of ceil(P / G)."""
        grad = self.layout.bits_per_param("gradients") // 8
        param = self.layout.bits_per_param("parameters") // 8
        n, g, stage = self.gpus, self.shard_group, self.stage
        in_group = (g - 1) * ceil_div(self.params, g)
        ring = np.where(stage == 0, n, self.replicas)
        gathers = np.array([0, param, param, 2 * param], dtype=np.int64)[stage]
        return MappingProxyType({
            "all_reduce": (2 * grad) * (ring - 1) * ceil_div(self.params, n),
            "reduce_scatter": (stage > 0) * (grad * in_group),
            "all_gather": gathers * in_group,
            "all_to_all": np.zeros(n.shape, dtype=np.int64)})

    @cached_property
    def _flat_cross_node(self) -> np.ndarray:
        # Stage 0's ring over all N leaves each node once when N spans nodes; above it the
        # replicas' min(G, K) rings leave each node when they span nodes, N > max(G, K), and a
        # group's own rings when G > K.
        k = self.gpus_per_node
        sent = self._flat_sent
        g = self.shard_group
        plain = self.stage == 0
        share = np.where(plain, 1, np.minimum(g, k))
        limit = np.where(plain, k, np.maximum(g, k))
        group = (g > k) * (sent["reduce_scatter"] + sent["all_gather"])
        return group + (self.gpus > limit) * share * sent["all_reduce"]


def _check_zeropp(stage, gpus, group, hpz: int, qwz: bool, qgz: bool) -> None:
    used = [name for name, on in (("hpz_partition > 1 (ZeRO++ hpZ)", hpz > 1),
                                  ("qwz (ZeRO++ quantised weights)", qwz),
                                  ("qgz (ZeRO++ quantised gradients)", qgz)) if on]
    if not used:
        return
    if np.any(stage != 3):
        raise ValueError(f"{used[0]} needs ZeRO stage 3, got stage "
                         f"{int(stage.ravel()[np.flatnonzero((stage != 3).ravel())[0]])}")
    if np.any(group != gpus):
        raise ValueError(f"{used[0]} needs the shard group to be every GPU (ZeRO++ shards over "
                         "all of them; MiCS and HSDP are the shard-group variant)")
    if hpz > 1 and np.any(gpus % hpz):
        raise ValueError(f"hpz_partition ({hpz}) must divide gpus")


def group_traffic(model, gpus, stage, layout: str | Layout = "mixed-adam", shard_group=None,
                  hpz_partition: int = 1, qwz: bool = False, qgz: bool = False,
                  gpus_per_node: int | None = None) -> GroupTraffic:
    """One step's traffic per GPU with the state sharded over ``shard_group`` of ``gpus``
    (None: all of them) and ZeRO++'s ``hpz_partition``, ``qwz`` and ``qgz``; the collectives
    placed on nodes of ``gpus_per_node`` GPUs (None: 8, or every GPU when there are fewer, as
    :mod:`zerolib.core.memory.placement` counts nodes).

    ``model`` is a preset name or TransformerConfig (stage 3 per layer, :func:`layer_units`), a
    list of layer sizes, or a bare parameter count (:func:`flat_group_traffic`). ``gpus``,
    ``stage`` and ``shard_group`` broadcast together. ``shard_group`` = ``gpus`` gives exactly
    :func:`zerolib.core.step.traffic.traffic`'s bytes and calls.
    """
    if isinstance(model, (str, TransformerConfig)):
        units = _check_units(layer_units(model))
    elif isinstance(model, (list, tuple)) or (isinstance(model, np.ndarray) and model.ndim == 1):
        units = _check_units(model)
    else:
        return flat_group_traffic(model, gpus, stage, layout, shard_group, hpz_partition, qwz,
                                  qgz, gpus_per_node)
    return _group_traffic(np.asarray(int(units.sum()), dtype=np.int64), units, gpus, stage,
                          layout, shard_group, hpz_partition, qwz, qgz, gpus_per_node)


def flat_group_traffic(params, gpus, stage, layout: str | Layout = "mixed-adam",
                       shard_group=None, hpz_partition: int = 1, qwz: bool = False,
                       qgz: bool = False, gpus_per_node: int | None = None) -> GroupTraffic:
    """:func:`group_traffic` for a bare parameter count (one flat buffer per pass); ``params``
    broadcasts with ``gpus``, ``stage`` and ``shard_group``, so a sweep is one call."""
    return _group_traffic(check_params(params), None, gpus, stage, layout, shard_group,
                          hpz_partition, qwz, qgz, gpus_per_node)


def _group_traffic(params, units, gpus, stage, layout, shard_group, hpz_partition, qwz, qgz,
                   gpus_per_node) -> GroupTraffic:
    layout = get_layout(layout)
    gpus, stage = check_gpus(gpus), check_stage(stage)
    group = gpus if shard_group is None else check_gpus(shard_group, "shard_group")
    params, gpus, stage, group = broadcast(params=params, gpus=gpus, stage=stage,
                                           shard_group=group)
    if shard_group is not None:
        group = check_shard_group(group, gpus)
    hpz = check_positive_int(hpz_partition, "hpz_partition", MAX_GPUS)
    qwz, qgz = check_flag(qwz, "qwz"), check_flag(qgz, "qgz")
    _check_zeropp(stage, gpus, group, hpz, qwz, qgz)
    per_node = (DEFAULT_GPUS_PER_NODE if gpus_per_node is None
                else check_positive_int(gpus_per_node, "gpus_per_node", MAX_GPUS))
    grouped = hpz > 1 or qgz or bool(np.any(group != gpus))
    if grouped and np.any((gpus > per_node) & (gpus % per_node != 0)):
        raise ValueError(f"gpus must fill whole nodes of gpus_per_node ({per_node}) for a shard "
                         "group or ZeRO++ to be placed on them")
    check_aligned(group, gpus, per_node, "shard_group")
    if hpz > 1:
        check_aligned(np.asarray(hpz), gpus, per_node, "hpz_partition")
    unit_sizes = None if units is None else tuple(int(u) for u in units)
    return GroupTraffic(params, gpus, stage, group, layout, per_node, hpz, qwz, qgz, unit_sizes)


def group_slot(name: str) -> GroupSlot:
    """The slot of :data:`GROUP_SLOTS` called ``name``."""
    if name not in _BY_NAME:
        raise ValueError(f"slot must be one of {', '.join(GROUP_SLOT_NAMES)}, got {name!r}")
    return _BY_NAME[name]

