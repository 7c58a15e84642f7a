"""Why a real sharded run holds more or less than zerolib predicts, worked out from shapes alone.

``zerolib.accounting.model_state`` is the chapter's idealisation: a partitioned category holds
ceil(N / W) elements per worker, nothing else exists, and "at rest" equals "peak". Each real
difference has a mechanism whose size follows from the model's tensor shapes, the worker count
and the rank, without looking at the run:

- AdamW's step counters: one 0-dim fp32 tensor per parameter tensor (PyTorch ``torch.optim.AdamW``).
- ZeroRedundancyOptimizer partitions whole tensors, greedily, so ranks are uneven.
- FSDP2 shards every tensor's dim 0 in torch.chunk-sized pieces and pads parameter and gradient
  shards to equal size; the optimizer state follows the unpadded local shard.
- FSDP2 reshards after backward, so its "stage 2" analogue holds only shards at rest.
- FSDP2 gathers full parameters for compute (all of them with reshard_after_forward=False, one
  layer at a time with True), in bf16 under the bf16 policy, while still holding its shards.

``compare_sharded`` sets measured, predicted and these effects side by side; whatever the
effects do not account for is reported as ``unexplained_bytes`` (a test requires it to be 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np
import pandas as pd

from ..accounting import CATEGORIES, model_state
from .setups import (ADAMW_STATE_TENSORS, LAYOUT, MODELS, STEP_COUNTER_BYTES, STRATEGIES,
                     ModelSpec, Strategy, _ceil_div, fsdp_shard_elements, zero1_partition)

PHASES = ("rest", "peak")
FP32 = 4
ADAM_BYTES = FP32 * len(ADAMW_STATE_TENSORS)  # 8 bytes per element owned


@dataclass(frozen=True)
class Effect:
    """One mechanism and the bytes it adds (negative: removes) relative to zerolib's number."""

    reason: str
    bytes: int


def _fsdp_elements(spec: ModelSpec, workers: int, rank: int) -> tuple[int, int]:
    """(held, padded) elements of all of this rank's FSDP2 shards."""
    pairs = [fsdp_shard_elements(shape, workers, rank) for shape in spec.shapes]
    return sum(h for h, _ in pairs), sum(p for _, p in pairs)


def _largest_gathered_layer(spec: ModelSpec, workers: int) -> tuple[int, int]:
    """(layer index, gathered elements) of the layer whose padded all-gather is largest."""
    gathered = [workers * sum(fsdp_shard_elements(shape, workers, 0)[1] for shape in layer)
                for layer in spec.layers]
    index = int(np.argmax(gathered))  # first on ties, like the run's peak sample
    return index, gathered[index]


def _step_counters(count: int) -> Effect:
    return Effect(f"AdamW keeps a 0-dim fp32 step counter per parameter tensor: "
                  f"{count} x {STEP_COUNTER_BYTES} B", count * STEP_COUNTER_BYTES)


def _fsdp_padding(what: str, padded: int, share: int, workers: int) -> Effect:
    return Effect(f"FSDP2 cuts each tensor's rows into {workers} chunks of ceil(rows/{workers}) and "
                  f"pads every {what} shard to that size: {padded:,} elements on this rank "
                  f"instead of ceil(N/W) = {share:,}", FP32 * (padded - share))


def expected_effects(strategy: Strategy, spec: ModelSpec, workers: int, rank: int,
                     phase: str, category: str) -> tuple[Effect, ...]:
    """The mechanisms that make this rank's measured bytes differ from zerolib's prediction."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    if category not in CATEGORIES:
        raise ValueError(f"category must be one of {CATEGORIES}, got {category!r}")
    total, share = spec.numel, _ceil_div(spec.numel, workers)
    if strategy.kind == "ddp":
        return (_step_counters(spec.tensor_count),) if category == "optimizer" else ()
    if strategy.kind == "zero1":
        if category != "optimizer":
            return ()
        owned = zero1_partition(spec.shapes, workers)[rank]
        elements = sum(prod(spec.shapes[i]) for i in owned)
        return (Effect(f"ZeroRedundancyOptimizer gives each rank whole tensors (largest first, to "
                       f"the least-loaded rank): this rank owns {len(owned)} tensors with "
                       f"{elements:,} of {total:,} elements instead of ceil(N/W) = {share:,}",
                       ADAM_BYTES * (elements - share)),
                _step_counters(len(owned)))
    held, padded = _fsdp_elements(spec, workers, rank)
    if category == "optimizer":
        return (Effect(f"AdamW state follows FSDP2's unpadded local shards (torch.chunk rows): "
                       f"{held:,} elements on this rank instead of ceil(N/W) = {share:,}",
                       ADAM_BYTES * (held - share)),
                _step_counters(spec.tensor_count))
    if category == "gradients":
        return (_fsdp_padding("gradient", padded, share, workers),)
    # parameters
    if phase == "peak" and not strategy.reshard_after_forward:
        width = strategy.gathered_bytes_per_element
        return (Effect(f"reshard_after_forward=False keeps every layer gathered after forward, "
                       f"and FSDP2 keeps its {padded:,}-element shards beside them",
                       FP32 * padded),
                Effect(f"the gathered buffers are padded: {workers} x {padded:,} = "
                       f"{workers * padded:,} elements instead of N = {total:,}",
                       width * workers * padded - FP32 * total))
    effects = []
    if strategy.stage == 2:
        effects.append(Effect("FSDP2 reshards parameters after backward, so at rest a rank holds "
                              "only its shard, where ZeRO-2 keeps a full replica",
                              FP32 * (share - total)))
    effects.append(_fsdp_padding("parameter", padded, share, workers))
    if phase == "peak":
        index, gathered = _largest_gathered_layer(spec, workers)
        width = strategy.gathered_bytes_per_element
        dtype = "bf16" if strategy.bf16_compute else "fp32"
        effects.append(Effect(f"FSDP2 gathers one layer at a time for its forward: layer {index} "
                              f"holds {gathered:,} gathered {dtype} elements until it reshards",
                              width * gathered))
    return tuple(e for e in effects if e.bytes != 0)


def _explain(effects: tuple[Effect, ...], unexplained: int) -> str:
    parts = [f"{e.reason} ({e.bytes:+,} B)" for e in effects if e.bytes != 0]
    if unexplained:
        parts.append(f"UNEXPLAINED ({unexplained:+,} B)")
    return "; ".join(parts) if parts else "matches"


def compare_sharded(measured: pd.DataFrame) -> pd.DataFrame:
    """Measured rows side by side with zerolib's prediction and the explained difference.

    ``measured`` has the columns of ``sharded_run.measure_sharded``: strategy, model, workers,
    rank, phase, category, measured_bytes, storages, sampled_at. Returns a tidy frame in a fixed
    row order with, in addition, stage, layout, predicted_bytes, difference_bytes,
    relative_difference, explained_bytes, unexplained_bytes and explanation (all bytes int64).
    """
    rows = []
    for record in measured.to_dict("records"):
        strategy, spec = STRATEGIES[record["strategy"]], MODELS[record["model"]]
        workers, rank = int(record["workers"]), int(record["rank"])
        predicted = int(getattr(model_state(spec.numel, workers, strategy.stage, LAYOUT),
                                record["category"]))
        effects = expected_effects(strategy, spec, workers, rank, record["phase"],
                                   record["category"])
        measured_bytes = int(record["measured_bytes"])
        explained = sum(e.bytes for e in effects)
        unexplained = measured_bytes - predicted - explained
        rows.append({
            "strategy": strategy.name, "stage": strategy.stage, "model": spec.name,
            "workers": workers, "rank": rank, "phase": record["phase"],
            "category": record["category"], "layout": LAYOUT,
            "measured_bytes": measured_bytes, "predicted_bytes": predicted,
            "difference_bytes": measured_bytes - predicted,
            "relative_difference": (measured_bytes - predicted) / predicted,
            "explained_bytes": explained, "unexplained_bytes": unexplained,
            "storages": int(record["storages"]), "sampled_at": record["sampled_at"],
            "explanation": _explain(effects, unexplained),
        })
    frame = pd.DataFrame(rows)
    order = {"strategy": list(STRATEGIES), "model": list(MODELS), "phase": list(PHASES),
             "category": list(CATEGORIES)}
    keys = ["strategy", "model", "workers", "rank", "phase", "category"]
    frame = frame.sort_values(keys, key=lambda col: col.map(order[col.name].index)
                              if col.name in order else col, kind="stable")
    return frame.reset_index(drop=True)
