"""Why a real sharded run holds more or less than zerolib predicts, worked out from shapes alone.

``zerolib.core.memory.accounting.model_state`` is the chapter's idealisation: a partitioned category holds
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
- HSDP (FSDP2 on a 2-D mesh) does all of this within its shard group of G ranks: zerolib's
  prediction is ``model_state(..., shard_group=G)``, and each mechanism is FSDP2's with G ranks
  and the rank's place in its group.

``compare_sharded`` sets measured, predicted and these effects side by side; whatever the
effects do not account for is reported as ``unexplained_bytes`` (a test requires it to be 0).
"""
from __future__ import annotations

from math import prod

import numpy as np
import pandas as pd

from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import CATEGORIES, model_state
from zerolib.crosscheck.validation.effects import Effect, describe
from zerolib.crosscheck.validation.effects import keys as effect_keys
from zerolib.crosscheck.validation.setups import (
    ADAMW_STATE_TENSORS,
    LAYOUT,
    STEP_COUNTER_BYTES,
    STRATEGIES,
    TINY_MODELS,
    ModelSpec,
    Strategy,
    fsdp_shard_elements,
    zero1_partition,
)

SHARDED_PHASES = ("rest", "peak")
FP32 = 4
ADAM_BYTES = FP32 * len(ADAMW_STATE_TENSORS)  # 8 bytes per element owned


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
    return Effect("step-counters", f"AdamW keeps a 0-dim fp32 step counter per parameter "
                  f"tensor: {count} x {STEP_COUNTER_BYTES} B", count * STEP_COUNTER_BYTES)


def _fsdp_padding(what: str, padded: int, share: int, workers: int, divisor: str = "W") -> Effect:
    return Effect("shard-padding",
                  f"FSDP2 cuts each tensor's rows into {workers} chunks of ceil(rows/{workers}) "
                  f"and pads every {what} shard to that size: {padded:,} elements on this rank "
                  f"instead of ceil(N/{divisor}) = {share:,}", FP32 * (padded - share))


def _zero1(spec: ModelSpec, workers: int, rank: int, share: int) -> tuple[Effect, ...]:
    owned = zero1_partition(spec.shapes, workers)[rank]
    elements = sum(prod(spec.shapes[i]) for i in owned)
    return (Effect("whole-tensor-partition",
                   f"ZeroRedundancyOptimizer gives each rank whole tensors (largest first, to the "
                   f"least-loaded rank): this rank owns {len(owned)} tensors with {elements:,} of "
                   f"{spec.numel:,} elements instead of ceil(N/W) = {share:,}",
                   ADAM_BYTES * (elements - share)),
            _step_counters(len(owned)))


def _gathered(strategy: Strategy, elements: int, what: str) -> tuple[Effect, ...]:
    """Under the bf16 policy the gathered copy is 2 bytes wide, not the 4 zerolib assumes."""
    width = strategy.gathered_bytes_per_element
    if width == FP32:
        return ()
    return (Effect("bf16-gathered", f"{what} are gathered in bf16 ({width} B per element)",
                   (width - FP32) * elements),)


def _fsdp_parameters(strategy: Strategy, spec: ModelSpec, workers: int, phase: str,
                     padded: int, share: int, divisor: str = "W") -> list[Effect]:
    total = spec.numel
    if phase == "peak" and not strategy.reshard_after_forward:
        gathered = workers * padded
        return [Effect("shards-beside-gathered",
                       f"reshard_after_forward=False keeps every layer gathered after forward, "
                       f"and FSDP2 keeps its {padded:,}-element shards beside them", FP32 * padded),
                Effect("gathered-padding",
                       f"the gathered buffers are padded: {workers} x {padded:,} = {gathered:,} "
                       f"elements instead of N = {total:,}", FP32 * (gathered - total)),
                *_gathered(strategy, gathered, "all layers")]
    effects = []
    if not strategy.reshard_after_forward:  # at rest
        effects.append(Effect("resharded-after-backward",
                              "FSDP2 reshards parameters after backward, so at rest a rank holds "
                              "only its shard, where ZeRO-2 keeps a full replica",
                              FP32 * (share - total)))
    effects.append(_fsdp_padding("parameter", padded, share, workers, divisor))
    if phase == "peak":
        index, gathered = _largest_gathered_layer(spec, workers)
        effects.append(Effect("gathered-layer",
                              f"FSDP2 gathers one layer at a time for its forward: layer {index} "
                              f"holds {gathered:,} gathered elements until it reshards",
                              FP32 * gathered))
        effects += _gathered(strategy, gathered, f"layer {index}'s parameters")
    return effects


def expected_effects(strategy: Strategy, spec: ModelSpec, workers: int, rank: int,
                     phase: str, category: str) -> tuple[Effect, ...]:
    """The mechanisms that make this rank's measured bytes differ from zerolib's prediction."""
    if phase not in SHARDED_PHASES:
        raise ValueError(f"phase must be one of {SHARDED_PHASES}, got {phase!r}")
    if category not in CATEGORIES:
        raise ValueError(f"category must be one of {CATEGORIES}, got {category!r}")
    if strategy.kind == "ddp":
        effects = [_step_counters(spec.tensor_count)] if category == "optimizer" else []
    elif strategy.kind == "zero1":
        share = ceil_div(spec.numel, workers)
        effects = list(_zero1(spec, workers, rank, share)) if category == "optimizer" else []
    else:
        # FSDP2 and HSDP: sharded over the shard group (every rank for FSDP2), at the rank's
        # place in it; HSDP's replicas hold what the same place in the other groups holds.
        shards, place = strategy.shards(workers), strategy.shard_rank(rank)
        divisor = "W" if strategy.shard_group is None else "G"
        share = ceil_div(spec.numel, shards)
        held, padded = _fsdp_elements(spec, shards, place)
        if category == "optimizer":
            effects = [Effect("uneven-shards",
                              f"AdamW state follows FSDP2's unpadded local shards (torch.chunk "
                              f"rows): {held:,} elements on this rank instead of ceil(N/{divisor}) "
                              f"= {share:,}", ADAM_BYTES * (held - share)),
                       _step_counters(spec.tensor_count)]
        elif category == "gradients":
            effects = [_fsdp_padding("gradient", padded, share, shards, divisor)]
        else:
            effects = _fsdp_parameters(strategy, spec, shards, phase, padded, share, divisor)
    return tuple(e for e in effects if e.bytes != 0)


def compare_sharded(measured: pd.DataFrame) -> pd.DataFrame:
    """Measured rows side by side with zerolib's prediction and the explained difference.

    ``measured`` has the columns of ``sharded_run.measure_sharded``: strategy, model, workers,
    rank, phase, category, measured_bytes, storages, sampled_at. Returns a tidy frame in a fixed
    row order with, in addition, stage, layout, predicted_bytes, difference_bytes,
    relative_difference, explained_bytes, unexplained_bytes, effects (mechanism keys, see
    ``effects.MECHANISMS``) and explanation (all bytes int64).
    """
    rows = []
    for record in measured.to_dict("records"):
        strategy, spec = STRATEGIES[record["strategy"]], TINY_MODELS[record["model"]]
        workers, rank = int(record["workers"]), int(record["rank"])
        predicted = int(getattr(model_state(spec.numel, workers, strategy.stage, LAYOUT,
                                            shard_group=strategy.shard_group),
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
            "effects": effect_keys(effects), "explanation": describe(effects, unexplained),
        })
    frame = pd.DataFrame(rows)
    order = {"strategy": list(STRATEGIES), "model": list(TINY_MODELS), "phase": list(SHARDED_PHASES),
             "category": list(CATEGORIES)}
    keys = ["strategy", "model", "workers", "rank", "phase", "category"]
    frame = frame.sort_values(keys, key=lambda col: col.map(order[col.name].index)
                              if col.name in order else col, kind="stable")
    return frame.reset_index(drop=True)
