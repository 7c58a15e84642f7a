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
pass and twice that per all-reduce (:mod:`zerolib.core.collectives`), in the width the layout
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
from types import MappingProxyType

import numpy as np

from zerolib.core.accounting import Layout, get_layout
from zerolib.core.collectives import CHUNKS_SENT, KINDS, to_bytes
from zerolib.core.inputs import MAX_PARAMS, broadcast, check_gpus, check_params, check_stage
from zerolib.core.intmath import ceil_div
from zerolib.core.models import TransformerConfig, get_model, modules

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
    the inputs; 0 where a stage does not use a slot).

    ``handed`` is what the GPU passes to the collective calls (the buffer of an all-reduce or a
    reduce-scatter, its own chunk of an all-gather); ``sent`` what it sends over the ring, which
    equals what it receives.
    """

    params: np.ndarray
    gpus: np.ndarray
    stage: np.ndarray
    layout: Layout
    layers: int                     # the buffers stage 3 gathers one by one (1: a flat count)
    calls: Mapping[str, np.ndarray] = field(repr=False)
    handed: Mapping[str, np.ndarray] = field(repr=False)
    sent: Mapping[str, np.ndarray] = field(repr=False)

    def by_kind(self, what: str = "sent") -> dict[str, np.ndarray]:
        """``calls``, ``handed`` or ``sent`` summed per collective kind."""
        values = {"calls": self.calls, "handed": self.handed, "sent": self.sent}[what]
        out = {kind: np.zeros(self.gpus.shape, dtype=np.int64) for kind in KINDS}
        for slot in SLOTS:
            out[slot.kind] = out[slot.kind] + values[slot.name]
        return out

    @property
    def total_sent(self) -> np.ndarray:
        """Bytes one GPU sends in the step (and receives: a ring is symmetric)."""
        return sum(self.sent.values())


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


def _schedule(params, gpus, stage, layout: Layout, layer_chunks, layers: int) -> Traffic:
    """Every slot of :data:`SLOTS` per setting. ``layer_chunks``: the chunks of one stage-3 pass
    summed over its ``layers`` (ceil(P / n) for one flat buffer)."""
    bits = {"gradients": layout.bits_per_param("gradients"),
            "parameters": layout.bits_per_param("parameters")}
    chunk = ceil_div(params, gpus)                 # one flat buffer (stages 0-2)
    # Per slot: (stages mask, calls, elements handed over, elements sent).
    s3 = stage == 3
    layered = (layers, layer_chunks, (gpus - 1) * layer_chunks)
    plan = {
        "forward_all_gather": (s3, *layered),
        "backward_all_gather": (s3, *layered),
        "gradient_all_reduce": (stage == 0, 1, params,
                                CHUNKS_SENT["all_reduce"] * (gpus - 1) * chunk),
        "gradient_reduce_scatter": (stage >= 1, np.where(s3, layers, 1),
                                    gpus * np.where(s3, layer_chunks, chunk),
                                    (gpus - 1) * np.where(s3, layer_chunks, chunk)),
        "parameter_all_gather": ((stage == 1) | (stage == 2), 1, chunk, (gpus - 1) * chunk),
    }
    calls, handed, sent = {}, {}, {}
    talking = gpus > 1                              # one GPU alone communicates nothing
    for slot in SLOTS:
        mask, n_calls, handed_elements, sent_elements = plan[slot.name]
        width = bits[slot.category]
        active = mask & talking
        calls[slot.name] = np.where(active, n_calls, 0).astype(np.int64, copy=False)
        handed[slot.name] = np.where(active, to_bytes(handed_elements, width), 0)
        sent[slot.name] = np.where(active, to_bytes(sent_elements, width), 0)
    return Traffic(params, gpus, stage, layout, layers, MappingProxyType(calls),
                   MappingProxyType(handed), MappingProxyType(sent))


def flat_traffic(params, gpus, stage, layout: str | Layout = "mixed-adam") -> Traffic:
    """One step's traffic for a bare parameter count (no layers: stage 3 gathers one flat
    buffer per pass). ``params``, ``gpus`` and ``stage`` broadcast together, so a sweep of a
    million settings is one call."""
    layout = get_layout(layout)
    params, gpus, stage = broadcast(params=check_params(params), gpus=check_gpus(gpus),
                                    stage=check_stage(stage))
    return _schedule(params, gpus, stage, layout, ceil_div(params, gpus), 1)


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
    return _schedule(params, gpus, stage, layout, layer_chunks.reshape(gpus.shape),
                     int(units.size))


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
