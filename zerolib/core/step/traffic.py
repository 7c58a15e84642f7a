"""What each GPU communicates in one training step, per stage and per collective, in bytes.

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
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.models import TransformerConfig, get_model, modules
from zerolib.core.inputs import MAX_PARAMS, broadcast, check_gpus, check_params, check_stage
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import Layout, get_layout
from zerolib.core.step.collectives import CHUNKS_SENT, KINDS, to_bytes

MAX_UNITS = 2**20   # layers of one model (far beyond any real one)


@dataclass(frozen=True)
class Slot:
    """One collective of a step's schedule."""

    name: str          # key, e.g. "forward_all_gather"
    label: str         # for tables and figures
    phase: str         # "forward", "backward" or "after_step" (after the optimizer step)
    kind: str          # all_reduce | reduce_scatter | all_gather
    category: str      # the layout category whose width it moves
    stages: tuple[int, ...]


SLOTS: tuple[Slot, ...] = (
    Slot("forward_all_gather", "parameter all-gather, per layer before its forward",
         "forward", "all_gather", "parameters", (3,)),
    Slot("backward_all_gather", "parameter all-gather, per layer before its backward",
         "backward", "all_gather", "parameters", (3,)),
    Slot("gradient_all_reduce", "gradient all-reduce, bucket by bucket during backward",
         "backward", "all_reduce", "gradients", (0,)),
    Slot("gradient_reduce_scatter", "gradient reduce-scatter during backward",
         "backward", "reduce_scatter", "gradients", (1, 2, 3)),
    Slot("parameter_all_gather", "parameter all-gather after the optimizer step",
         "after_step", "all_gather", "parameters", (1, 2)),
)
SLOT_NAMES = tuple(slot.name for slot in SLOTS)
PHASES = ("forward", "backward", "after_step")


@dataclass(frozen=True)
class Traffic:
    """One step's collectives per GPU, per slot of :data:`SLOTS` (int64 arrays, broadcast over
    the inputs; 0 where a stage does not use a slot). Computed when first asked for.

    ``calls`` counts the collective calls; ``handed`` is what the GPU passes to them (the buffer
    of an all-reduce or a reduce-scatter, its own chunk of an all-gather); ``sent`` what it sends
    over the ring, which equals what it receives.
    """

    params: np.ndarray = field(repr=False)
    gpus: np.ndarray = field(repr=False)
    stage: np.ndarray = field(repr=False)
    layout: Layout
    layers: int                         # buffers stage 3 gathers one by one (1: a flat count)
    layer_chunks: np.ndarray | None = field(default=None, repr=False)
    # ^ chunks of one stage-3 pass summed over the layers; None: one flat buffer

    @cached_property
    def _chunk(self) -> np.ndarray:
        return ceil_div(self.params, self.gpus)     # one flat buffer (stages 0-2)

    @cached_property
    def _layered(self) -> np.ndarray:
        return self._chunk if self.layer_chunks is None else self.layer_chunks

    def _bits(self, slot: Slot) -> int:
        return self.layout.bits_per_param(slot.category)

    def _mask(self, slot: Slot) -> np.ndarray:
        low, high = slot.stages[0], slot.stages[-1]     # each slot's stages are a range
        return (self.stage >= low) & (self.stage <= high) & (self.gpus > 1)

    def _per_slot(self, elements) -> Mapping[str, np.ndarray]:
        return MappingProxyType({slot.name: to_bytes(elements(slot), self._bits(slot))
                                 * self._mask(slot) for slot in SLOTS})

    @cached_property
    def calls(self) -> Mapping[str, np.ndarray]:
        def count(slot):
            if slot.stages == (3,) or (slot.name == "gradient_reduce_scatter"):
                return np.where(self.stage == 3, self.layers, 1)
            return np.ones(self.gpus.shape, dtype=np.int64)
        return MappingProxyType({slot.name: count(slot) * self._mask(slot) for slot in SLOTS})

    @cached_property
    def handed(self) -> Mapping[str, np.ndarray]:
        chunks = np.where(self.stage == 3, self._layered, self._chunk)

        def elements(slot):
            if slot.kind == "all_reduce":
                return self.params
            return self.gpus * chunks if slot.kind == "reduce_scatter" else chunks
        return self._per_slot(elements)

    @cached_property
    def sent(self) -> Mapping[str, np.ndarray]:
        chunks = np.where(self.stage == 3, self._layered, self._chunk)
        one_pass = (self.gpus - 1) * chunks
        return self._per_slot(lambda slot: CHUNKS_SENT[slot.kind] * one_pass)

    def by_kind(self, what: str = "sent") -> dict[str, np.ndarray]:
        """``calls``, ``handed`` or ``sent`` summed per collective kind."""
        if what == "sent" and self.layer_chunks is None and self._whole_bytes:
            return self._flat_sent_by_kind()
        values = {"calls": self.calls, "handed": self.handed, "sent": self.sent}[what]
        out = {kind: np.zeros(self.gpus.shape, dtype=np.int64) for kind in KINDS}
        for slot in SLOTS:
            out[slot.kind] = out[slot.kind] + values[slot.name]
        return out

    @property
    def _whole_bytes(self) -> bool:
        return all(self.layout.bits_per_param(c) % 8 == 0 for c in ("parameters", "gradients"))

    def _flat_sent_by_kind(self) -> dict[str, np.ndarray]:
        """The same sums for one flat buffer in whole bytes, in a few array operations (the
        sweeps): one ring pass of elements times a per-stage factor of bytes."""
        grad = self.layout.bits_per_param("gradients") // 8
        param = self.layout.bits_per_param("parameters") // 8
        one_pass = (self.gpus - 1) * self._chunk
        factors = {"all_reduce": (2 * grad, 0, 0, 0), "reduce_scatter": (0, grad, grad, grad),
                   "all_gather": (0, param, param, 2 * param)}
        return {kind: one_pass * np.asarray(factor, dtype=np.int64)[self.stage]
                for kind, factor in factors.items()}

    @property
    def total_sent(self) -> np.ndarray:
        """Bytes one GPU sends in the step (and receives: a ring is symmetric)."""
        return sum(self.by_kind("sent").values())


_OUTSIDE_BLOCKS = ("embedding", "position_embedding", "final_norm", "output_projection")


def layer_units(model: str | TransformerConfig) -> tuple[int, ...]:
    """Elements of each layer stage 3 gathers on its own, in model order: the embeddings, one
    unit per transformer block, the final norm and the output projection (not when tied: it is
    the embedding's matrix)."""
    config = get_model(model)
    parts = modules(config)
    block = sum(m.elements for m in parts if m.name not in _OUTSIDE_BLOCKS)
    before = [m.elements for m in parts if m.name in _OUTSIDE_BLOCKS[:2]]
    after = [m.elements for m in parts if m.name in _OUTSIDE_BLOCKS[2:] and not m.shared]
    return (*before, *([block] * config.layers), *after)


def _check_units(units) -> np.ndarray:
    array = check_params(units, "units")
    if array.ndim != 1 or array.size > MAX_UNITS:
        raise ValueError(f"units must be a list of at most {MAX_UNITS:,} layer sizes")
    if int(array.sum(dtype=object)) > MAX_PARAMS:
        raise ValueError(f"units must add up to at most {MAX_PARAMS:,} parameters")
    return array


def flat_traffic(params, gpus, stage, layout: str | Layout = "mixed-adam") -> Traffic:
    """One step's traffic for a bare parameter count (no layers: stage 3 gathers one flat
    buffer per pass). ``params``, ``gpus`` and ``stage`` broadcast together, so a sweep of a
    million settings is one call."""
    layout = get_layout(layout)
    params, gpus, stage = broadcast(params=check_params(params), gpus=check_gpus(gpus),
                                    stage=check_stage(stage))
    return Traffic(params, gpus, stage, layout, 1)


def traffic(model, gpus, stage, layout: str | Layout = "mixed-adam") -> Traffic:
    """One step's traffic for ``model``: a preset name or TransformerConfig (stage 3 gathers its
    :func:`layer_units` one by one), a list of layer sizes, or a bare parameter count
    (:func:`flat_traffic`). ``gpus`` and ``stage`` broadcast together."""
    if isinstance(model, (str, TransformerConfig)):
        units = _check_units(layer_units(model))
    elif isinstance(model, (list, tuple)) or (isinstance(model, np.ndarray) and model.ndim == 1):
        units = _check_units(model)
    else:
        return flat_traffic(model, gpus, stage, layout)
    layout = get_layout(layout)
    gpus, stage = broadcast(gpus=check_gpus(gpus), stage=check_stage(stage))
    params = np.full(gpus.shape, int(units.sum()), dtype=np.int64)
    # Each layer is padded on its own: the chunks of one pass, summed over the layers.
    flat_gpus = gpus.reshape(-1)
    layer_chunks = np.zeros(flat_gpus.shape, dtype=np.int64)
    for size in units:
        layer_chunks += ceil_div(int(size), flat_gpus)
    return Traffic(params, gpus, stage, layout, int(units.size), layer_chunks.reshape(gpus.shape))


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
