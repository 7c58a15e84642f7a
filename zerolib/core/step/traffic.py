"""What each GPU communicates in one training step, per stage and per collective, in bytes: the
one schedule of a step's collectives, for any shard group (G = N included) and ZeRO++, as an
engine runs it (:mod:`zerolib.core.step.engines`: "paper", the schedule below, is this module's
default; "deepspeed" all-reduces stages 1-2's gradients in buckets, "fsdp2" gathers its stage 2
layer by layer before each forward, "megatron" is stage 1) over m micro-batches per step (what
runs every micro-batch counted m times). A shard group of one GPU is plain data parallelism at
every stage: one all-reduce of every gradient, in buckets, never per layer.

The schedule of one step (forward, backward, optimizer step) under each strategy, after the
ZeRO paper (Rajbhandari et al., SC20, Sec. VII) and the engines that implement it:

- **stage 0**, plain data parallelism: the gradients are **all-reduced** during the backward
  pass, bucket by bucket as they are produced (PyTorch DDP's 25 MiB buckets);
- **stages 1 and 2**: the gradients are **reduce-scattered** during the backward pass (each GPU
  keeps the sum for the slice of parameters it updates), and after the optimizer step the
  updated parameters are **all-gathered**. A reduce-scatter plus an all-gather moves exactly
  what an all-reduce moves, so stages 1 and 2 cost the traffic of plain data parallelism
  (Sec. VII-B1); DeepSpeed does both over one flat buffer padded to whole chunks;
- **stage 3**: no GPU keeps all parameters, so each layer's parameters are all-gathered just
  before its forward, **again** before its backward (they were freed in between), and its
  gradients reduce-scattered after its backward: 3 passes over the parameters instead of 2,
  1.5x the traffic (Sec. VII-B2).

Per GPU, a ring moves (n - 1) chunks of ceil(E / n) elements per reduce-scatter or all-gather
pass and twice that per all-reduce (:mod:`zerolib.core.step.collectives`), in the width the layout
gives the communicated category: gradients at the gradient width, parameters at the parameter
width. For large n this is 2 Psi elements per step for stages 0-2 and 3 Psi for stage 3, the
paper's totals.

Conventions: stages 0-2 communicate one flat buffer of all parameters (padded once to a
multiple of n), counted as one call per collective. Engines cut it into **buckets** (PyTorch
DDP's 25 MiB, DeepSpeed's ``reduce_bucket_size`` of 5 x 10^8 elements) so that reduction starts
while the backward pass still runs: that changes the number of calls, not the bytes, and the
model leaves the extra calls' small-message latency out. Stage 3 gathers and reduces per
**layer**, each layer a flat buffer padded to a multiple of n on its own (FSDP's flat parameter
per wrapped block), one call per layer and pass: with a model preset the layers are its
transformer blocks plus each module outside them (the embedding, the final norm, the output
projection; a tied output projection is the embedding's matrix, gathered with it once per
pass); a bare parameter count has no layers and is taken as one flat buffer, so its stage-3
padding is that of one buffer (at most n - 1 elements per pass).

**Shard groups** (HSDP, MiCS). A shard group of G of the N data-parallel GPUs (G divides N;
R = N / G replicas, see :mod:`zerolib.core.memory.accounting`) changes that schedule as PyTorch
FSDP's hybrid sharding does it (FSDP2 ``fully_shard`` on a 2-D mesh: "for HSDP",
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
  above (:data:`SLOTS`, the slots of :data:`GROUP_SLOTS` on the whole group's rings); G = 1
  all-reduces every gradient over all N GPUs in one bucketed call, at every stage: plain data
  parallelism's schedule and traffic.

Per GPU the bytes hardly change with G (about 2 Psi for stages 0-2, 3 Psi for stage 3, as in
the ZeRO paper); what changes is **where they go**. Ranks fill nodes in order and groups are
consecutive ranks (``init_device_mesh`` on a (R, G) mesh; MiCS ``np.arange(world_size).reshape(-1,
shard_size)``), so a group of G <= K GPUs per node sits inside one node, on the node's fast
link, and the replicas' all-reduce crosses the nodes. The model needs every group inside a node
or spanning whole nodes: G divides K or K divides G (likewise hpZ's group). Each slot's ring is
``ring_gpus`` GPUs ``ring_stride`` ranks apart (the replicas: G apart), placed on the nodes by
:func:`zerolib.core.step.collectives.ring_placement`, the rule :mod:`zerolib.core.step.time`
times every ring with.

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
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.models import TransformerConfig, get_model, modules
from zerolib.core.inputs import (
    MAX_PARAMS,
    broadcast,
    check_gpus,
    check_params,
    check_positive_int,
    check_stage,
)
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import Layout, check_shard_group, get_layout
from zerolib.core.memory.model_parallel import layer_place
from zerolib.core.memory.placement import DEFAULT_GPUS_PER_NODE, Placement, check_placement
from zerolib.core.step.collectives import KINDS, ring_placement, to_bytes
from zerolib.core.step.engines import EVERY_MICRO_BATCH, PAPER, Engine, get_engine, when

MAX_UNITS = 2**20   # layers of one model (far beyond any real one)
MAX_MICRO_BATCHES = 2**20   # micro-batches of one step

GROUP_KINDS = (*KINDS, "all_to_all")
# What each kind of ring runs over: every GPU, the shard group, the replicas of one shard,
# hpZ's group, the GPUs of one node (qgZ's first all-to-all), the nodes (its second).
RINGS = ("all", "group", "replicas", "hpz", "node", "nodes")
QWZ_BITS = 8    # qwZ: int8 weights ("from FP16 to INT8", DeepSpeed's ZeRO++ tutorial)
QGZ_BITS = 4    # qgZ: int4 gradients (all_to_all_quant_reduce: swizzle_quant(..., 4, ...))


STEP_PHASES = ("forward", "backward", "after_step")   # when in a step a collective runs


@dataclass(frozen=True)
class Slot:
    """One collective of a step's schedule."""

    name: str          # key, e.g. "forward_all_gather"
    label: str         # for the step's tables and figures (data parallelism over every GPU)
    ring_label: str    # for a schedule that names its ring (``zerolib estimate``'s JSON)
    phase: str         # one of STEP_PHASES
    kind: str          # all_reduce | reduce_scatter | all_gather | all_to_all
    category: str      # the layout category whose width it moves
    stages: tuple[int, ...]
    ring: str          # one of RINGS (the backward all-gather runs over "hpz" with hpZ)


# The slots on the whole group's rings first in each phase's order, the others after the ones
# they join, so that a phase's or a kind's sum adds the same terms in the same order.
GROUP_SLOTS: tuple[Slot, ...] = (
    Slot("forward_all_gather", "parameter all-gather, per layer before its forward",
         "parameter all-gather in the shard group, per layer before its forward",
         "forward", "all_gather", "parameters", (3,), "group"),
    Slot("backward_all_gather", "parameter all-gather, per layer before its backward",
         "parameter all-gather in the shard group (hpZ: from the secondary copy in its group), "
         "per layer before its backward", "backward", "all_gather", "parameters", (3,), "group"),
    Slot("gradient_all_reduce", "gradient all-reduce, bucket by bucket during backward",
         "gradient all-reduce over every GPU, bucket by bucket during backward",
         "backward", "all_reduce", "gradients", (0,), "all"),
    Slot("gradient_reduce_scatter", "gradient reduce-scatter during backward",
         "gradient reduce-scatter in the shard group during backward",
         "backward", "reduce_scatter", "gradients", (1, 2, 3), "group"),
    Slot("gradient_all_to_all_node", "qgZ: 4-bit gradient all-to-all inside the node, per layer",
         "qgZ: 4-bit gradient all-to-all inside the node, per layer",
         "backward", "all_to_all", "gradients", (3,), "node"),
    Slot("gradient_all_to_all_nodes", "qgZ: 4-bit all-to-all of the node's partial sums across "
         "nodes, per layer", "qgZ: 4-bit all-to-all of the node's partial sums across nodes, "
         "per layer", "backward", "all_to_all", "gradients", (3,), "nodes"),
    Slot("replica_all_reduce", "all-reduce of each gradient shard across the replicas",
         "all-reduce of each gradient shard across the replicas of the shard group",
         "backward", "all_reduce", "gradients", (1, 2, 3), "replicas"),
    Slot("parameter_all_gather", "parameter all-gather after the optimizer step",
         "parameter all-gather in the shard group after the optimizer step",
         "after_step", "all_gather", "parameters", (1, 2), "group"),
)
GROUP_SLOT_NAMES = tuple(slot.name for slot in GROUP_SLOTS)
# The slots data parallelism over every GPU uses (G = N, no ZeRO++): the paper's schedule.
SLOTS: tuple[Slot, ...] = tuple(slot for slot in GROUP_SLOTS if slot.ring in ("all", "group"))
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
class Traffic:
    """One step's collectives per GPU, per slot of :data:`GROUP_SLOTS` (int64 arrays broadcast
    over the inputs; 0 where a setting does not use a slot). Computed when first asked for.

    ``calls`` counts the collective calls; ``handed`` is what the GPU passes to them (the buffer
    of an all-reduce or a reduce-scatter, its own chunk of an all-gather); ``sent`` what it sends
    over the ring, which equals what it receives; ``cross_node`` the bytes leaving one node (see
    the module doc). ``ring_gpus`` and ``ring_stride`` say how many GPUs each slot's ring joins
    and how many ranks apart they are, ``ring_nodes`` how many nodes it spans, ``sharing`` how
    many such rings leave a node at once.
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
    engine: Engine = PAPER               # whose schedule (:mod:`zerolib.core.step.engines`)
    micro_batches: int = 1               # m: micro-batches per step (gradient accumulation)

    @property
    def layers(self) -> int:
        return 1 if self.units is None else len(self.units)

    @property
    def replicas(self) -> np.ndarray:
        return self.gpus // self.shard_group

    @cached_property
    def grouped(self) -> bool:
        """Whether any ring is smaller than every GPU (a shard group or ZeRO++): then where the
        nodes fall decides which settings are valid."""
        if self.hpz_partition > 1 or self.qgz:
            return True
        return self.shard_group is not self.gpus and bool(np.any(self.shard_group != self.gpus))

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
        return MappingProxyType({slot.name: sizes[self.ring(slot)] for slot in GROUP_SLOTS})

    def ring(self, slot: Slot) -> str:
        """The ring ``slot`` runs over (one of :data:`RINGS`)."""
        if slot.name == "backward_all_gather" and self.hpz_partition > 1:
            return "hpz"
        return slot.ring

    @cached_property
    def ring_stride(self) -> Mapping[str, np.ndarray]:
        """Ranks between neighbours of each slot's ring (ranks fill nodes in order)."""
        ones = np.ones_like(self.gpus)
        strides = {"replicas": self.shard_group, "nodes": self._qgz_node}
        return MappingProxyType({slot.name: strides.get(self.ring(slot), ones)
                                 for slot in GROUP_SLOTS})

    @cached_property
    def _placed(self) -> Mapping[str, tuple[np.ndarray, np.ndarray]]:
        return MappingProxyType({name: ring_placement(self.ring_gpus[name], self.ring_stride[name],
                                                      self.gpus_per_node)
                                 for name in GROUP_SLOT_NAMES})

    @cached_property
    def ring_nodes(self) -> Mapping[str, np.ndarray]:
        """Nodes each slot's ring spans (1: inside a node)."""
        return MappingProxyType({name: nodes for name, (_, nodes) in self._placed.items()})

    @cached_property
    def sharing(self) -> Mapping[str, np.ndarray]:
        """Rings of the slot that leave one node at once when it spans nodes (they share its
        network ports): one per rank of the node between two of the ring's."""
        k = self.gpus_per_node
        return MappingProxyType({name: k // np.maximum(k // stride, 1)
                                 for name, stride in self.ring_stride.items()})

    # --- which slots run ----------------------------------------------------------------------

    def _bits(self, slot: Slot) -> int:
        if self.qwz and slot.name in ("forward_all_gather", "backward_all_gather"):
            return QWZ_BITS
        if slot.kind == "all_to_all":
            return QGZ_BITS
        return self.layout.bits_per_param(slot.category)

    @cached_property
    def _plain(self) -> np.ndarray:
        """Where the gradients are all-reduced over every GPU in buckets, plain data
        parallelism's schedule: stage 0, a shard group of one GPU (item: G = 1 is plain data
        parallelism whatever the stage), and the stages the engine all-reduces (DeepSpeed 1-2)."""
        return ((self.stage == 0) | (self.shard_group == 1)
                | np.isin(self.stage, self.engine.all_reduce_stages))

    @cached_property
    def _layered(self) -> np.ndarray:
        """Where the engine gathers and reduces layer by layer (stage 3; FSDP2's stage 2 too)."""
        return np.isin(self.stage, self.engine.layered_stages) & (self.shard_group > 1)

    @cached_property
    def _active(self) -> Mapping[str, np.ndarray]:
        engine, stage, plain = self.engine, self.stage, self._plain
        sharded = (stage > 0) & (self.shard_group > 1)
        forward = np.isin(stage, engine.forward_gather_stages) & sharded
        on = {
            "forward_all_gather": forward,
            "backward_all_gather": (stage == 3) & sharded,
            "gradient_all_reduce": plain,
            "gradient_reduce_scatter": sharded & ~plain & ~((stage == 3) & self.qgz),
            "gradient_all_to_all_node": (stage == 3) & self.qgz,
            "gradient_all_to_all_nodes": (stage == 3) & self.qgz,
            "replica_all_reduce": (stage > 0) & ~plain,
            "parameter_all_gather": np.isin(stage, (1, 2)) & sharded & ~forward,
        }
        return {name: on[name] & (self.ring_gpus[name] > 1) for name in GROUP_SLOT_NAMES}

    @cached_property
    def every_micro_batch(self) -> Mapping[str, np.ndarray]:
        """Whether each slot runs every micro-batch (else once per step:
        :func:`zerolib.core.step.engines.when`)."""
        out = {}
        for slot in GROUP_SLOTS:
            every = np.zeros(self.stage.shape, dtype=bool)
            for stage in (0, 1, 2, 3):
                if when(self.engine, slot.name, stage) == EVERY_MICRO_BATCH:
                    every = every | (self.stage == stage)
            if slot.name == "gradient_all_reduce":   # G = 1: plain data parallelism's no_sync
                every = every & (self.shard_group > 1)
            out[slot.name] = every
        return MappingProxyType(out)

    @cached_property
    def repeats(self) -> Mapping[str, np.ndarray]:
        """How often each slot runs in a step of m micro-batches: m or 1."""
        m = self.micro_batches
        return MappingProxyType({name: np.where(every, m, 1).astype(np.int64)
                                 for name, every in self.every_micro_batch.items()})

    def _buckets(self, bucket: int | None) -> np.ndarray:
        if bucket is None:
            return np.ones(self.params.shape, dtype=np.int64)
        return np.maximum(ceil_div(self.params, bucket), 1)

    @cached_property
    def calls(self) -> Mapping[str, np.ndarray]:
        layered = np.where(self._layered, self.layers, 1)
        engine = self.engine
        per_pass = {name: layered for name in GROUP_SLOT_NAMES}
        # Plain data parallelism's all-reduce runs in the engine's buckets, never per layer.
        per_pass["gradient_all_reduce"] = self._buckets(engine.reduce_bucket)
        if engine.gather_bucket is not None:   # DeepSpeed: the partition gathered in shards
            per_pass["parameter_all_gather"] = np.maximum(
                (ceil_div(self.params, self.shard_group) * self.shard_group)
                // engine.gather_bucket, 1)
        return MappingProxyType({name: per_pass[name] * self._active[name] * self.repeats[name]
                                 for name in GROUP_SLOT_NAMES})

    # --- elements per slot --------------------------------------------------------------------

    @cached_property
    def _elements(self) -> Mapping[str, tuple[np.ndarray, np.ndarray]]:
        """(handed, sent) elements per slot, before masking."""
        n, g, r = self.gpus, self.shard_group, self.replicas
        three = self._layered
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
            * self._active[slot.name] * self.repeats[slot.name] for slot in GROUP_SLOTS})

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
        return sum(self.by_kind("sent").values())

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
                and self.hpz_partition == 1 and self.engine is PAPER and self.micro_batches == 1)

    @cached_property
    def _flat_sent(self) -> Mapping[str, np.ndarray]:
        """``by_kind("sent")`` in a few array operations: the all-reduce's chunks are
        ceil(ceil(P / G) / R) = ceil(P / N) elements whichever ring it is (all N GPUs under
        stage 0, the R replicas above), the group's collectives (G - 1) chunks of ceil(P / G)."""
        grad = self.layout.bits_per_param("gradients") // 8
        param = self.layout.bits_per_param("parameters") // 8
        n, g, stage = self.gpus, self.shard_group, self.stage
        gathers = np.array([0, param, param, 2 * param], dtype=np.int64)[stage]
        if not self.grouped:   # G = N, the sweeps' common case: one ring pass, a factor per stage
            one_pass = (n - 1) * ceil_div(self.params, n)
            return MappingProxyType({
                "all_reduce": np.array([2 * grad, 0, 0, 0], dtype=np.int64)[stage] * one_pass,
                "reduce_scatter": np.array([0, grad, grad, grad], dtype=np.int64)[stage] * one_pass,
                "all_gather": gathers * one_pass, "all_to_all": np.zeros(n.shape, dtype=np.int64)})
        in_group = (g - 1) * ceil_div(self.params, g)
        ring = np.where(stage == 0, n, self.replicas)
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


_OUTSIDE_BLOCKS = ("embedding", "position_embedding", "final_norm", "output_projection")


def layer_units(model: str | TransformerConfig) -> tuple[int, ...]:
    """Elements of each layer stage 3 gathers on its own, in model order: the embeddings, one
    unit per transformer block, the final norm and the output projection (not when tied: it is
    the embedding's matrix)."""
    config = get_model(model)
    parts = modules(config)

    def block(kind: str) -> int:
        """One layer of ``kind`` ("layer", or DeepSeek's "dense_layer" / "expert_layer"): each
        module it holds, as often as it occurs in one such layer (a mixture's experts: E times)."""
        total = 0
        for m in parts:
            if m.name not in _OUTSIDE_BLOCKS:
                place, holders = layer_place(config, m.name)
                if place in ("layer", kind):
                    total += m.elements * (m.count // holders)
        return total

    if config.dense_layers:   # the first layers dense, the others with experts
        blocks = ([block("dense_layer")] * config.dense_layers
                  + [block("expert_layer")] * config.sparse_layers)
    else:
        blocks = [block("layer")] * config.layers
    before = [m.elements for m in parts if m.name in _OUTSIDE_BLOCKS[:2]]
    after = [m.elements for m in parts if m.name in _OUTSIDE_BLOCKS[2:] and not m.shared]
    return (*before, *blocks, *after)


def _check_units(units) -> np.ndarray:
    array = check_params(units, "units")
    if array.ndim != 1 or array.size > MAX_UNITS:
        raise ValueError(f"units must be a list of at most {MAX_UNITS:,} layer sizes")
    if int(array.sum(dtype=object)) > MAX_PARAMS:
        raise ValueError(f"units must add up to at most {MAX_PARAMS:,} parameters")
    return array


def traffic(model, gpus, stage, layout: str | Layout = "mixed-adam", shard_group=None,
            placement: Placement | None = None, engine: str | Engine = "paper",
            micro_batches: int = 1) -> Traffic:
    """One step's traffic per GPU with the state sharded over ``shard_group`` of ``gpus`` (None:
    the placement's; all of them) under ``placement``'s ZeRO++ (hpZ, qwZ, qgZ), its rings placed
    on nodes of its ``gpus_per_node`` (None: 8, or every GPU when there are fewer), as ``engine``
    runs them ("paper": the ZeRO paper's schedule) over ``micro_batches`` micro-batches per step.
    ``model`` is a preset name or TransformerConfig (stage 3 gathers its :func:`layer_units`
    one by one), a list of layer sizes, or a bare parameter count (:func:`flat_traffic`).
    ``gpus``, ``stage`` and ``shard_group`` broadcast together (a sweep of shard groups is one
    call; the placement's shard group is one number)."""
    if isinstance(model, (str, TransformerConfig)):
        units = _check_units(layer_units(model))
    elif isinstance(model, (list, tuple)) or (isinstance(model, np.ndarray) and model.ndim == 1):
        units = _check_units(model)
    else:
        return flat_traffic(model, gpus, stage, layout, shard_group, placement, engine, micro_batches)
    return _traffic(np.asarray(int(units.sum()), dtype=np.int64), units, gpus, stage, layout,
                    shard_group, placement, engine, micro_batches)


def flat_traffic(params, gpus, stage, layout: str | Layout = "mixed-adam", shard_group=None,
                 placement: Placement | None = None, engine: str | Engine = "paper",
                 micro_batches: int = 1) -> Traffic:
    """:func:`traffic` for a bare parameter count (no layers: stage 3 gathers one flat buffer
    per pass). ``params`` broadcasts with ``gpus``, ``stage`` and ``shard_group``, so a sweep
    of a million settings is one call."""
    return _traffic(check_params(params), None, gpus, stage, layout, shard_group, placement,
                    engine, micro_batches)


def check_engine_schedule(engine: Engine, stage: np.ndarray, gpus: np.ndarray, group: np.ndarray,
                          zeropp: bool) -> None:
    """Refuse what ``engine`` does not run: a stage it does not offer, a shard group smaller
    than every GPU at a stage it does not shard in groups, ZeRO++ outside DeepSpeed."""
    offered = np.isin(stage, engine.stages)
    if not np.all(offered):
        bad = int(stage.ravel()[np.flatnonzero(~offered.ravel())[0]])
        raise ValueError(f"engine {engine.name} offers ZeRO stages "
                         f"{', '.join(map(str, engine.stages))}, got stage {bad}")
    grouped = (group > 1) & (group < gpus) & (stage > 0) & ~np.isin(stage, engine.group_stages)
    if np.any(grouped):
        bad = int(stage.ravel()[np.flatnonzero(grouped.ravel())[0]])
        where = (f"stages {', '.join(map(str, engine.group_stages))}" if engine.group_stages
                 else "no stage")
        raise ValueError(f"engine {engine.name} shards in groups smaller than every GPU at "
                         f"{where}, got a shard group at stage {bad}")
    if zeropp and not engine.zeropp:
        raise ValueError(f"ZeRO++ (hpZ, qwZ, qgZ) is DeepSpeed's; engine {engine.name} has none")


def _traffic(params, units, gpus, stage, layout, shard_group, placement, engine,
             micro_batches) -> Traffic:
    layout = get_layout(layout)
    engine = get_engine(engine)
    placement = check_placement(placement)
    micro_batches = check_positive_int(micro_batches, "micro_batches", MAX_MICRO_BATCHES)
    gpus, stage = check_gpus(gpus), check_stage(stage)
    if shard_group is None:
        shard_group = placement.shard_group
    elif placement.shard_group is not None:
        raise ValueError("give the shard group once: as shard_group or as placement.shard_group")
    if shard_group is None:     # every GPU: the group is the GPU count itself
        params, gpus, stage = broadcast(params=params, gpus=gpus, stage=stage)
        group = gpus
    else:
        params, gpus, stage, group = broadcast(params=params, gpus=gpus, stage=stage,
                                               shard_group=check_gpus(shard_group, "shard_group"))
        group = check_shard_group(group, gpus)
    hpz, qwz, qgz = placement.hpz_partition, placement.qwz, placement.qgz
    _check_zeropp(stage, gpus, group, hpz, qwz, qgz)
    check_engine_schedule(engine, stage, gpus, group, hpz > 1 or qwz or qgz)
    per_node = (DEFAULT_GPUS_PER_NODE if placement.gpus_per_node is None
                else placement.gpus_per_node)
    size = params if units is None else tuple(int(u) for u in units)
    result = traffic_of(size, gpus, stage, layout, None if shard_group is None else group,
                        replace(placement, shard_group=None, gpus_per_node=per_node), engine,
                        micro_batches)
    if result.grouped and np.any((gpus > per_node) & (gpus % per_node != 0)):
        raise ValueError(f"gpus must fill whole nodes of gpus_per_node ({per_node}) for a shard "
                         "group or ZeRO++ to be placed on them")
    if shard_group is not None:    # the whole group always sits in a node or spans whole ones
        check_aligned(group, gpus, per_node, "shard_group")
    if hpz > 1:
        check_aligned(np.asarray(hpz), gpus, per_node, "hpz_partition")
    return result


def traffic_of(size, gpus, stage, layout: Layout, shard_group, placement: Placement,
               engine: Engine = PAPER, micro_batches: int = 1) -> Traffic:
    """:func:`traffic` of checked values (``size``: int64 parameters, one flat buffer per pass,
    or a tuple of the layer units stage 3 gathers; a shard group dividing ``gpus`` or None; a
    placement whose node every ring fits, its shard group unread): what a caller that checked
    its settings once (:func:`zerolib.core.step.parallel.parallel_step_time`) builds."""
    units, params = (size, np.asarray(sum(size), dtype=np.int64)) if isinstance(size, tuple) else (None, size)
    if shard_group is None:     # every GPU: the group is the GPU count itself
        params, gpus, stage = np.broadcast_arrays(params, gpus, stage)
        group = gpus
    else:
        params, gpus, stage, group = np.broadcast_arrays(params, gpus, stage, shard_group)
    return Traffic(params, gpus, stage, group, layout, placement.gpus_per_node,
                   placement.hpz_partition, placement.qwz, placement.qgz, units, engine,
                   micro_batches)


def group_slot(name: str) -> Slot:
    """The slot of :data:`GROUP_SLOTS` called ``name``."""
    if name not in _BY_NAME:
        raise ValueError(f"slot must be one of {', '.join(GROUP_SLOT_NAMES)}, got {name!r}")
    return _BY_NAME[name]



@dataclass(frozen=True)
class Volume:
    elements: np.ndarray  # elements sent per worker per step
    bytes: np.ndarray     # the same in bytes, at each collective's width


ONE_BYTE = Layout.custom(1, 1, 1, "one byte per element")


def volume(params, gpus, stage, layout: str | Layout = "mixed-adam") -> Volume:
    """Elements and bytes each worker sends in one step for a bare parameter count (broadcast
    over the inputs): :func:`flat_traffic` summed over the step's collectives."""
    return Volume(flat_traffic(params, gpus, stage, ONE_BYTE).total_sent,
                  flat_traffic(params, gpus, stage, layout).total_sent)
