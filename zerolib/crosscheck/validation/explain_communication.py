"""Why a real run hands its collectives more or fewer bytes than zerolib predicts, worked out
from the model's tensor shapes, the worker count and the engine's documented settings alone.

The compared quantity is what each rank **hands** to each kind of collective in one training
step (after warm-up steps), summed over its calls: the buffer of an all-reduce, a reduce-scatter
or a broadcast, the rank's own chunk of an all-gather (:mod:`zerolib.core.step.collectives`). The
ring's wire bytes follow from it by nccl-tests' factors; a gloo run cannot show them (gloo's
algorithms are not NCCL's), so they are not compared.

zerolib's prediction is :func:`zerolib.core.step.traffic.traffic` for the run's layers
(one unit per Linear layer, weight and bias) **as the run's engine runs them**
(:mod:`zerolib.core.step.engines`: ``deepspeed`` for the DeepSpeed runs, whose ZeRO-1 and -2
all-reduce each gradient bucket; ``fsdp2`` for FSDP2 and HSDP, which gather and reduce layer by
layer, stage 2 before each forward; ``fsdp2`` for DDP too, PyTorch's stage 0; the paper's
schedule for ``ZeroRedundancyOptimizer``, which is neither), layout and shard group (all ranks but for HSDP,
whose gathers and reduce-scatters run in its shard group and whose shards are all-reduced
across the replicas; with the group of all ranks it is exactly
:func:`zerolib.core.step.traffic.traffic`): the layout gives the communicated widths (fp32
runs: ``fp32-adam``, 4 + 4 bytes; FSDP2's bf16 policy: ``bf16-fp32-grads``, bf16 parameters
and fp32 gradients; DeepSpeed bf16: ``mixed-adam``, 16-bit both).

Each difference has a mechanism (:data:`zerolib.crosscheck.validation.effects.MECHANISMS`) whose
size, in bytes and in calls, follows from the shapes; ``compare_communication`` reports whatever
they leave over as ``unexplained_bytes`` and ``unexplained_calls`` (tests require 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

from zerolib.core.intmath import ceil_div
from zerolib.core.memory.placement import placement_on
from zerolib.core.memory.working_set import (
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_PARAM_PERSISTENCE_THRESHOLD,
    STAGE3_PREFETCH_BUCKET_SIZE,
)
from zerolib.core.step.collectives import KINDS
from zerolib.core.step.traffic import traffic
from zerolib.crosscheck.validation.deepspeed_run import DEEPSPEED_MODELS
from zerolib.crosscheck.validation.setups import (
    COMMUNICATION_STRATEGIES,
    TINY_MODELS,
    ModelSpec,
    fsdp_shard_elements,
)

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    import pandas as pd

COMPARED_KINDS = (*KINDS, "broadcast")   # the ZeRO schedules' three, and the broadcasts
ENGINES = ("pytorch", "deepspeed")
# Steps run before the counted one: DDP broadcasts its rebuilt bucket order in the second,
# DeepSpeed traces the module order for its stage-3 prefetcher in the first ones.
WARMUP_STEPS = 2

# The layout whose widths each run communicates.
PYTORCH_LAYOUTS = {"ddp": "fp32-adam", "zero1": "fp32-adam", "fsdp2-keep": "fp32-adam",
                   "fsdp2-reshard": "fp32-adam", "fsdp2-bf16": "bf16-fp32-grads",
                   "hsdp": "fp32-adam"}
DEEPSPEED_LAYOUTS = {"fp32": "fp32-adam", "bf16": "mixed-adam"}
ELEMENT_BYTES = {"fp32-adam": (4, 4), "bf16-fp32-grads": (2, 4), "mixed-adam": (2, 2)}


@dataclass(frozen=True)
class DeepSpeedConfig:
    """One DeepSpeed configuration of the communication run."""

    name: str
    stage: int
    zero_optimization: tuple[tuple[str, int], ...]   # besides "stage"; DeepSpeed's defaults else
    description: str

    def as_config(self) -> dict:
        return {"stage": self.stage, **dict(self.zero_optimization)}


# DeepSpeed 0.19.8 defaults (deepspeed/runtime/zero/config.py), in elements; the others are
# zerolib.core.memory.working_set's (REDUCE_BUCKET_SIZE, STAGE3_*).
STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
ALIGNMENT_FACTOR = 2   # stage_1_and_2.py: nccl_start_alignment_factor (4-byte alignment / fp16)

RELEASE = (("stage3_max_live_parameters", 0), ("stage3_max_reuse_distance", 0),
           ("stage3_prefetch_bucket_size", 0), ("stage3_param_persistence_threshold", 0))
DEEPSPEED_CONFIGS = {config.name: config for config in (
    DeepSpeedConfig("stage0", 0, (), "ZeRO disabled: DeepSpeed's data parallelism"),
    DeepSpeedConfig("stage1", 1, (), "ZeRO stage 1, defaults"),
    DeepSpeedConfig("stage2", 2, (), "ZeRO stage 2, defaults"),
    DeepSpeedConfig("stage3", 3, (), "ZeRO stage 3, defaults"),
    DeepSpeedConfig("stage3-release", 3, RELEASE,
                    "ZeRO stage 3 releasing every parameter after use and prefetching nothing "
                    "(stage3_max_live_parameters, stage3_max_reuse_distance, "
                    "stage3_prefetch_bucket_size and stage3_param_persistence_threshold 0): the "
                    "paper's schedule"),
)}


@dataclass(frozen=True)
class TrafficEffect:
    """One mechanism's change, relative to zerolib's prediction, to one kind of collective:
    bytes handed and calls (negative: fewer)."""

    key: str
    kind: str
    reason: str
    bytes: int
    calls: int = 0


def units(spec: ModelSpec) -> tuple[int, ...]:
    """Elements of each Linear layer (weight and bias): the layers zerolib's stage 3 gathers."""
    return tuple(sum(prod(shape) for shape in layer) for layer in spec.layers)


# The engine whose schedule predicts each PyTorch strategy (DeepSpeed's runs: "deepspeed").
PYTORCH_ENGINES = {"ddp": "fsdp2", "zero1": "paper", "fsdp2-keep": "fsdp2",
                   "fsdp2-reshard": "fsdp2", "fsdp2-bf16": "fsdp2", "hsdp": "fsdp2"}


def predicted(spec: ModelSpec, workers: int, stage: int, layout: str,
              shard_group: int | None = None, engine: str = "paper") -> dict[str, tuple[int, int]]:
    """zerolib's (calls, bytes handed) per kind for one rank of the run, sharded over
    ``shard_group`` of the ``workers`` (None: all), as ``engine`` runs it; broadcast is never
    part of a ZeRO schedule."""
    result = traffic(list(units(spec)), workers, stage, layout, shard_group,
                     placement_on(workers), engine)
    calls, handed = result.by_kind("calls"), result.by_kind("handed")
    out = {kind: (int(calls[kind]), int(handed[kind])) for kind in KINDS}
    out["broadcast"] = (0, 0)
    return out


def _moved(key, reason, source, target, n_bytes, n_calls) -> list[TrafficEffect]:
    """A mechanism that runs one kind of collective in place of another: bytes and calls leave
    ``source`` and arrive in ``target``."""
    return [TrafficEffect(key, source, reason, -n_bytes, -n_calls),
            TrafficEffect(key, target, reason, n_bytes, n_calls)]


def _gloo_reduce_scatter(calls: int, n_bytes: int, where: str = "") -> list[TrafficEffect]:
    return _moved("gloo-reduce-scatter",
                  f"gloo has no reduce-scatter: torch's reduce_scatter_tensor runs an all-reduce "
                  f"of the whole input there{' ' + where if where else ''} ({calls} "
                  f"call{'s' if calls != 1 else ''}, {n_bytes:,} B)", "reduce_scatter",
                  "all_reduce", n_bytes, calls)


# --- PyTorch ------------------------------------------------------------------------------------

def _fsdp_padded(spec: ModelSpec, workers: int) -> list[int]:
    """Per Linear layer, the elements of one rank's padded FSDP2 shard (every rank alike)."""
    return [sum(fsdp_shard_elements(shape, workers, 0)[1] for shape in layer)
            for layer in spec.layers]


def pytorch_effects(strategy: str, spec: ModelSpec, workers: int) -> list[TrafficEffect]:
    """The mechanisms that make a PyTorch run's collectives differ from zerolib's prediction."""
    kind = COMMUNICATION_STRATEGIES[strategy].kind
    stage = COMMUNICATION_STRATEGIES[strategy].stage
    param_bytes, grad_bytes = ELEMENT_BYTES[PYTORCH_LAYOUTS[strategy]]
    total = spec.numel
    chunk = ceil_div(total, workers)
    if kind == "ddp":
        return []
    if kind == "zero1":
        reason = ("ZeroRedundancyOptimizer leaves the gradients to DDP, which all-reduces every "
                  "gradient (each rank then updates its share), where ZeRO stage 1 "
                  "reduce-scatters them")
        effects = [TrafficEffect("ddp-all-reduce", "reduce_scatter", reason,
                                 -workers * chunk * grad_bytes, -1),
                   TrafficEffect("ddp-all-reduce", "all_reduce", reason, total * grad_bytes, 1)]
        reason = (f"ZeroRedundancyOptimizer broadcasts each updated tensor from the rank that "
                  f"owns it ({spec.tensor_count} calls, every rank handing each tensor's "
                  f"{total:,} elements in all) instead of one all-gather of {chunk:,}-element "
                  "chunks")
        effects += [TrafficEffect("owner-broadcasts", "all_gather", reason, -chunk * param_bytes,
                                  -1),
                    TrafficEffect("owner-broadcasts", "broadcast", reason, total * param_bytes,
                                  spec.tensor_count)]
        return effects
    if kind == "hsdp":
        return _hsdp_effects(spec, COMMUNICATION_STRATEGIES[strategy].shards(workers), workers,
                             param_bytes, grad_bytes)
    # FSDP2: one flat-parameter group per Linear, shards padded per tensor (dim 0). The engine
    # "fsdp2" gathers and reduces layer by layer at stage 2 too (before each forward, kept to
    # the backward), so only the padding differs.
    layers = len(spec.layers)
    padded = _fsdp_padded(spec, workers)
    zerolib_units = [ceil_div(u, workers) for u in units(spec)]
    passes = 1 if stage == 2 else 2
    effects = []
    flat_gather, flat_reduce = sum(zerolib_units), workers * sum(zerolib_units)
    gather = sum(padded)
    reason = (f"FSDP2 cuts each tensor's rows into {workers} chunks of ceil(rows/{workers}) and "
              f"pads every shard to that size: {gather:,} elements per rank and pass instead of "
              f"{flat_gather:,}")
    effects += [TrafficEffect("shard-padding", "all_gather", reason,
                              passes * (gather - flat_gather) * param_bytes),
                TrafficEffect("shard-padding", "reduce_scatter", reason,
                              (workers * gather - flat_reduce) * grad_bytes)]
    effects += _gloo_reduce_scatter(layers, workers * gather * grad_bytes)
    return effects


def _hsdp_effects(spec: ModelSpec, group: int, workers: int, param_bytes: int,
                  grad_bytes: int) -> list[TrafficEffect]:
    """HSDP (FSDP2 on a (replicas, group) mesh): FSDP2's per-tensor shard padding, now over the
    shard group, in the gathers, the reduce-scatters and the replicas' all-reduce of the padded
    shard; gloo's reduce-scatter run as an all-reduce inside the group."""
    layers = len(spec.layers)
    gather = sum(_fsdp_padded(spec, group))
    flat = sum(ceil_div(u, group) for u in units(spec))
    reason = (f"FSDP2 cuts each tensor's rows into the shard group's {group} chunks of "
              f"ceil(rows/{group}) and pads every shard to that size: {gather:,} elements per "
              f"rank and pass instead of {flat:,}; the replicas all-reduce the padded shard")
    return [TrafficEffect("shard-padding", "all_gather", reason, 2 * (gather - flat) * param_bytes),
            TrafficEffect("shard-padding", "reduce_scatter", reason,
                          group * (gather - flat) * grad_bytes),
            TrafficEffect("shard-padding", "all_reduce", reason, (gather - flat) * grad_bytes),
            *_gloo_reduce_scatter(layers, group * gather * grad_bytes, f"in the shard group of "
                                  f"{group} (of {workers} ranks)")]


# --- DeepSpeed ----------------------------------------------------------------------------------

def _partition_elements(spec: ModelSpec, workers: int, tensors) -> int:
    """One rank's partition of these tensors, each partitioned on its own (ZeRO-3)."""
    return sum(ceil_div(prod(shape), workers) for shape in tensors)


def deepspeed_effects(config_name: str, precision: str, spec: ModelSpec,
                      workers: int) -> list[TrafficEffect]:
    """The mechanisms that make a DeepSpeed run's collectives differ from zerolib's prediction."""
    config = DEEPSPEED_CONFIGS[config_name]
    param_bytes, grad_bytes = ELEMENT_BYTES[DEEPSPEED_LAYOUTS[precision]]
    total, stage = spec.numel, config.stage
    effects = []
    norm_bytes = 8 if stage == 3 else 4
    if stage > 0 or precision == "fp32":
        where = {0: "the fp32 engine's gradient clipping (clip_fp32_gradients)",
                 1: "get_grad_norm_direct", 2: "get_grad_norm_direct",
                 3: "get_grad_norm_direct, in fp64"}[stage]
        effects.append(TrafficEffect("gradient-norm", "all_reduce",
                                     f"DeepSpeed all-reduces the global gradient norm, one value "
                                     f"({where}): {norm_bytes} B", norm_bytes, 1))
    if stage in (1, 2) and precision == "bf16":
        effects.append(TrafficEffect("overflow-flag", "all_reduce",
                                     "with bf16, DeepSpeed's ZeRO-1/2 all-reduce a one-byte "
                                     "overflow flag (has_overflow)", 1, 1))
    if stage == 0:
        return effects
    if stage in (1, 2):
        chunk = ceil_div(total, workers)
        aligned = ceil_div(total, ALIGNMENT_FACTOR * workers) * ALIGNMENT_FACTOR
        effects.append(TrafficEffect(
            "alignment-padding", "all_gather",
            f"DeepSpeed pads the flat buffer to a multiple of {ALIGNMENT_FACTOR} x {workers} "
            f"elements (nccl_start_alignment_factor): {aligned:,} elements per rank instead of "
            f"ceil(N/W) = {chunk:,}", (aligned - chunk) * param_bytes))
        # The bucket all-reduce of the unpadded gradients is the engine "deepspeed"'s own
        # prediction (use_multi_rank_bucket_allreduce=True): nothing to explain there.
        return effects
    # Stage 3: each tensor partitioned on its own.
    layers = len(spec.layers)
    per_unit = sum(ceil_div(u, workers) for u in units(spec))
    per_tensor = _partition_elements(spec, workers, spec.shapes)
    released = dict(config.zero_optimization).get("stage3_max_live_parameters",
                                                  STAGE3_MAX_LIVE_PARAMETERS) == 0
    passes = 2
    if not released:
        threshold = STAGE3_PARAM_PERSISTENCE_THRESHOLD
        persistent = [s for s in spec.shapes if prod(s) < threshold]
        fetched = sum(prod(s) for s in spec.shapes if prod(s) >= threshold)
        if (total > min(STAGE3_MAX_LIVE_PARAMETERS, STAGE3_MAX_REUSE_DISTANCE)
                or fetched > STAGE3_PREFETCH_BUCKET_SIZE):
            raise ValueError(f"model {spec.name} is too large for one fetch under DeepSpeed's "
                             "stage-3 defaults; its schedule is not worked out here")
        passes = 1
        effects.append(TrafficEffect(
            "kept-gathered", "all_gather",
            f"the whole model ({total:,} elements) is under stage3_max_live_parameters and "
            "stage3_max_reuse_distance (1e9): DeepSpeed keeps it gathered from forward to "
            "backward, so there is no all-gather before the backward pass",
            -per_unit * param_bytes, -layers))
        effects.append(TrafficEffect(
            "coalesced-fetch", "all_gather",
            f"DeepSpeed fetches the partitioned tensors in one coalesced all-gather (they fit "
            f"stage3_prefetch_bucket_size, 5e7 elements) and each of the {len(persistent)} "
            f"tensors under stage3_param_persistence_threshold (1e5 elements) in its own: "
            f"{1 + len(persistent)} calls, not one per layer", 0, 1 + len(persistent) - layers))
    effects.append(TrafficEffect(
        "partition-padding", "all_gather",
        f"DeepSpeed ZeRO-3 partitions every tensor on its own, padded to ceil(numel/{workers}): "
        f"{per_tensor:,} elements per rank and pass instead of {per_unit:,} (each layer padded "
        "once)", passes * (per_tensor - per_unit) * param_bytes))
    effects.append(TrafficEffect(
        "partition-padding", "reduce_scatter", effects[-1].reason,
        workers * (per_tensor - per_unit) * grad_bytes))
    effects.append(TrafficEffect(
        "reduce-bucket", "reduce_scatter",
        f"DeepSpeed reduces all {layers} layers' gradients in one bucket (reduce_bucket_size, "
        "5e8 elements): one call, not one per layer", 0, 1 - layers))
    effects += _gloo_reduce_scatter(1, workers * per_tensor * grad_bytes)
    return effects


# --- the comparison -----------------------------------------------------------------------------

def _describe(effects: list[TrafficEffect], bytes_left: int, calls_left: int) -> str:
    parts = []
    for e in effects:
        if e.bytes or e.calls:
            sizes = [f"{e.bytes:+,} B"] if e.bytes else []
            sizes += [f"{e.calls:+,} call{'s' if abs(e.calls) != 1 else ''}"] if e.calls else []
            parts.append(f"{e.reason} ({', '.join(sizes)})")
    if bytes_left or calls_left:
        parts.append(f"UNEXPLAINED ({bytes_left:+,} B, {calls_left:+,} calls)")
    return "; ".join(parts) if parts else "matches"


def compare_communication(measured: pd.DataFrame) -> pd.DataFrame:
    """Measured rows side by side with zerolib's prediction and the explained differences.

    ``measured`` has the columns engine, strategy, precision, model, workers, rank, kind,
    measured_calls, measured_bytes (one row per rank and kind, every kind present). Returns a
    tidy frame in a fixed row order with stage, layout, predicted and explained calls and
    bytes, what is left unexplained, the mechanisms (``effects``) and their ``explanation``.
    """
    import pandas as pd
    rows = []
    for record in measured.to_dict("records"):
        engine, strategy, precision = record["engine"], record["strategy"], record["precision"]
        workers, kind = int(record["workers"]), record["kind"]
        group = None
        if engine == "pytorch":
            spec, stage = TINY_MODELS[record["model"]], COMMUNICATION_STRATEGIES[strategy].stage
            layout = PYTORCH_LAYOUTS[strategy]
            group = COMMUNICATION_STRATEGIES[strategy].shard_group
            effects = pytorch_effects(strategy, spec, workers)
            schedule = PYTORCH_ENGINES[strategy]
        else:
            spec = next(m for m in DEEPSPEED_MODELS if m.name == record["model"])
            stage, layout = DEEPSPEED_CONFIGS[strategy].stage, DEEPSPEED_LAYOUTS[precision]
            effects = deepspeed_effects(strategy, precision, spec, workers)
            schedule = "deepspeed"
        effects = [e for e in effects if e.kind == kind]
        calls, handed = predicted(spec, workers, stage, layout, group, schedule)[kind]
        measured_calls, measured_bytes = int(record["measured_calls"]), int(record["measured_bytes"])
        explained_bytes, explained_calls = sum(e.bytes for e in effects), sum(e.calls for e in effects)
        bytes_left = measured_bytes - handed - explained_bytes
        calls_left = measured_calls - calls - explained_calls
        rows.append({
            "engine": engine, "strategy": strategy, "stage": stage, "precision": precision,
            "model": spec.name, "workers": workers, "rank": int(record["rank"]), "kind": kind,
            "layout": layout, "measured_calls": measured_calls, "predicted_calls": calls,
            "measured_bytes": measured_bytes, "predicted_bytes": handed,
            "difference_bytes": measured_bytes - handed, "explained_bytes": explained_bytes,
            "unexplained_bytes": bytes_left, "explained_calls": explained_calls,
            "unexplained_calls": calls_left,
            "effects": " ".join(dict.fromkeys(e.key for e in effects if e.bytes or e.calls)),
            "explanation": _describe(effects, bytes_left, calls_left),
        })
    frame = pd.DataFrame(rows)
    order = {"engine": list(ENGINES), "strategy": [*COMMUNICATION_STRATEGIES, *DEEPSPEED_CONFIGS],
             "precision": ["fp32", "bf16"], "kind": list(COMPARED_KINDS)}
    keys = ["engine", "strategy", "precision", "model", "workers", "rank", "kind"]
    frame = frame.sort_values(keys, key=lambda col: col.map(order[col.name].index)
                              if col.name in order else col, kind="stable")
    return frame.reset_index(drop=True)
