"""Pipeline schedules: how many micro-batches a stage keeps in flight, and the activation bytes
on one GPU of each stage (with tensor and sequence parallelism and recomputation).

Activations at a stage's peak (Korthikanti et al., MLSys 2023, arXiv 2205.05198, Sec. 4.2.3; the
schedules of Megatron-LM ``megatron/core/pipeline_parallel/schedules.py``): under 1F1B, stage
r runs p - r - 1 warm-up forward passes before its first backward pass, so it holds the
activations of min(p - r, m) micro-batches (m micro-batches per step): the first stage holds
p micro-batches of L / p layers, "L layers worth of activations regardless of p". Under the
interleaved schedule rank r runs 2(p - r - 1) + (v - 1) p warm-up forward passes of model
chunks (micro-batches taken in groups of p per chunk), so it holds min(2(p - r - 1) + (v - 1)p
+ 1, m v) chunk passes of L / (p v) layers: on rank 0 that is L (1 + (p - 1) / (p v)) layers,
Korthikanti et al.'s factor (their m is v here, the number of model chunks, not the number of
micro-batches). The embedding's activations are held once per in-flight micro-batch of the
first chunk: min(p, m) under 1F1B, min(2p, m) interleaved (rank 0's chunk 0 at the moment its
activations peak); the output layer's and the loss's once (the last stage runs each
micro-batch's backward pass right after its forward pass). One layer being recomputed in
backward (``recompute_transient``) is counted once per GPU. With dense first layers
(DeepSeek's) each copy counts the kind of layer it is (:func:`dense_layer_activations_held`).

Most loaded: the first stage holds at least the layers and the micro-batches in flight of any
middle stage, plus the embedding's activations; the last stage holds the output layer's and the
loss's. ``pipeline_stage=None`` takes the larger of the two (a test checks it against every
stage). Vectorised over ``tensor_parallel``, ``pipeline_parallel``, ``pipeline_stage`` and
``micro_batches``; results are exact int64.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.models import get_model
from zerolib.core.inputs import (
    MAX_BYTES,
    MAX_GPUS,
    check_positive_int,
    check_whole,
    echo,
)
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.activations import (
    DEFAULT_OPTIONS,
    ActivationOptions,
    layer_kinds,
    model_activation_terms,
    model_terms,
    whole_layer_bytes,
)
from zerolib.core.memory.model_parallel import (
    MAX_CHUNKS,
    MAX_MICRO_BATCHES,
    ParallelGrid,
    Pipeline,
    at_stage,
    check_schedule,
    grid_of,
    rows_on_rank,
    stage_dense_layers,
    stage_layers,
    stage_start,
)


def micro_batches_in_flight(pipeline_parallel, pipeline_stage, *, schedule: str = "1f1b",
                            chunks: int = 1, micro_batches=None) -> np.ndarray:
    """Forward passes whose backward pass is still to come on stage r at its peak.

    1F1B: min(p - r, m) micro-batches. Interleaved: min(2(p - r - 1) + (v - 1) p + 1, m v)
    passes of one model chunk each (Megatron-LM ``get_pp_rank_microbatches``: warm-up passes,
    plus the one that starts the steady state). ``micro_batches`` None: as many as it takes to
    fill the pipeline.
    """
    check_schedule(schedule)
    p = check_whole(pipeline_parallel, "pipeline_parallel", "a positive whole number of stages")
    r = check_whole(pipeline_stage, "pipeline_stage", "a pipeline stage index, 0 or more", 0)
    v = check_positive_int(chunks, "chunks", MAX_CHUNKS)
    if schedule == "1f1b" and v != 1:
        raise ValueError(f"chunks must be 1 under the 1f1b schedule, got {echo(chunks)}")
    if np.any(r >= p):
        raise ValueError(f"pipeline_stage must be below pipeline_parallel (stages 0 to p - 1), "
                         f"got {echo(pipeline_stage)} with pipeline_parallel {echo(pipeline_parallel)}")
    if micro_batches is not None:
        micro_batches = check_whole(micro_batches, "micro_batches",
                                    "a positive whole number of micro-batches", 1, MAX_MICRO_BATCHES)
    return _in_flight(p, r, schedule, v, micro_batches)


def _in_flight(p, r, schedule: str, chunks: int, micro_batches) -> np.ndarray:
    """:func:`micro_batches_in_flight` of checked inputs (the planner's path)."""
    p = np.asarray(p, dtype=np.int64)
    r = np.asarray(r, dtype=np.int64)
    if schedule == "interleaved":
        flight = 2 * (p - r - 1) + (chunks - 1) * p + 1
        cap = None if micro_batches is None else np.asarray(micro_batches, dtype=np.int64) * chunks
    else:
        flight = p - r
        cap = None if micro_batches is None else np.asarray(micro_batches, dtype=np.int64)
    return flight if cap is None else np.minimum(flight, cap)


def embedding_micro_batches(pipeline_parallel, *, schedule: str = "1f1b", micro_batches=None) -> np.ndarray:
    """Micro-batches whose embedding activations the first stage holds at its peak:
    min(p, m) under 1F1B; min(2p, m) interleaved (its first chunk's passes then in flight)."""
    check_schedule(schedule)
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    flight = 2 * p if schedule == "interleaved" else p
    return flight if micro_batches is None else np.minimum(flight, np.asarray(micro_batches, dtype=np.int64))


def layer_activations_held(layers: int, pipeline_parallel, pipeline_stage, *, schedule: str = "1f1b",
                           chunks: int = 1, micro_batches=None, first_last=None) -> np.ndarray:
    """Copies of one layer's activations (layers x micro-batches) stage r holds at its peak:
    its layers x :func:`micro_batches_in_flight` (1F1B), or L / (p v) layers per chunk pass
    (interleaved; with uneven stages, ``first_last``, the stage's own layers / v). On the first
    stage with the pipeline full: L, or L (1 + (p - 1) / (p v))."""
    flight = _in_flight(pipeline_parallel, pipeline_stage, schedule, chunks, micro_batches)
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    held = stage_layers(layers, p, pipeline_stage, first_last)
    if schedule == "interleaved":
        return flight * (held // chunks)
    return flight * held


def dense_layer_activations_held(config, pipeline_parallel, pipeline_stage, *, schedule: str = "1f1b",
                                 chunks: int = 1, micro_batches=None, first_last=None) -> np.ndarray:
    """Of :func:`layer_activations_held`, the copies of the model's first ``dense_layers``
    (DeepSeek's dense MLP layers; 0 for a model whose layers are alike). 1F1B: the stage's dense
    layers x the micro-batches in flight. Interleaved: pass k of the warm-up runs model chunk
    (k // p) mod v (Megatron-LM ``get_model_chunk_id``), so each of the rank's chunks is held
    as often as its passes are in flight, times the dense layers in it."""
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    r = np.asarray(pipeline_stage, dtype=np.int64)
    if not config.dense_layers:
        return np.zeros(np.broadcast(p, r).shape, dtype=np.int64)
    flight = _in_flight(p, r, schedule, chunks, micro_batches)
    if schedule != "interleaved":
        return flight * stage_dense_layers(config, p, r, first_last=first_last)
    cycles, rest = np.divmod(flight, p * chunks)
    held = np.zeros(np.shape(flight), dtype=np.int64)
    width = stage_layers(config.layers, p, r, first_last) // chunks
    begin = stage_start(config.layers, p, r, first_last) // chunks
    for j in range(chunks):
        passes = cycles * p + np.clip(rest - j * p, 0, p)      # chunk j's passes in flight
        chunk = np.clip(config.dense_layers - (j * (config.layers // chunks) + begin), 0, width)
        held = held + passes * chunk
    return held


# One layer's activations (with experts, on a model with dense first layers) and one dense
# first layer's (0 without), then the model-level terms.
UNIT_TERMS = ("transformer_layers", "dense_transformer_layer", "recompute_transient",
              "embedding_dropout_mask", "embedding_norm_input", "final_norm_input",
              "output_projection_input", "logits_loss", "whole_layer")
# The terms of a stage's activations (stage_activation_terms): the layers' as one.
STAGE_TERMS = tuple(name for name in UNIT_TERMS if name not in ("dense_transformer_layer",
                                                                 "whole_layer"))


@lru_cache(maxsize=8192)
def unit_terms(config, seq_len: int, micro_batch: int, t: int, options: ActivationOptions,
               vocab_divisible_by: int = 1) -> Mapping[str, int]:
    """:func:`activation_unit_terms` of checked inputs (a TransformerConfig, Python ints,
    :class:`~zerolib.core.memory.activations.ActivationOptions` the model allows at t, a setting
    the parallel rules allow), remembered: the planner's path, which checked them once at its
    door."""
    terms = dict(model_terms(config, seq_len, micro_batch, t, options))
    # One layer of each kind: the stages multiply them by the layers they hold.
    terms["transformer_layers"], terms["dense_transformer_layer"], _ = layer_kinds(
        config, seq_len, micro_batch, t, options)
    # Megatron's block method keeps whole the layers past its first N (a layer unrecomputed).
    terms["whole_layer"] = (whole_layer_bytes(config, seq_len, micro_batch, t, options)
                            if _methodical(options) else 0)
    # The loss's logits follow the vocabulary rows, padded when asked.
    rows = int(rows_on_rank(config.vocab, t, vocab_divisible_by))
    terms["logits_loss"] = options.loss_bytes(seq_len * micro_batch * rows)
    if any(terms[name] > MAX_BYTES for name in UNIT_TERMS):
        raise ValueError(f"activations of {config.name} come to more than {MAX_BYTES:,} bytes: "
                         f"lower seq_len or micro_batch")
    return MappingProxyType({name: terms[name] for name in UNIT_TERMS})


@lru_cache(maxsize=8192)
def _unit_terms_cached(config, seq_len, micro_batch, t: int, options: ActivationOptions,
                       vocab_divisible_by: int) -> Mapping[str, int]:
    # The public path: every check of model_activation_terms once per setting, then the kernel.
    model_activation_terms(config, seq_len, micro_batch, t, options)
    return unit_terms.__wrapped__(config, seq_len, micro_batch, t, options, vocab_divisible_by)


def activation_unit_terms(model, seq_len, micro_batch, tensor_parallel: int,
                          options: ActivationOptions = DEFAULT_OPTIONS,
                          vocab_divisible_by: int = 1) -> Mapping[str, int]:
    """The bytes :func:`stage_activation_terms` multiplies by the schedule, at one
    tensor-parallel degree: ``transformer_layers`` is one layer's activations (the others are
    the model-level terms of :func:`zerolib.core.memory.activations.model_activation_terms`, the
    logits over the rank's vocabulary rows). Pure, and remembered per setting."""
    if not isinstance(options, ActivationOptions):
        raise TypeError(f"options must be an ActivationOptions, got {type(options).__name__}")
    # Checked before the memo, whose keys would take True for 1 and 2.0 for 2.
    key = (get_model(model), check_positive_int(seq_len, "seq_len"),
           check_positive_int(micro_batch, "micro_batch"),
           check_positive_int(tensor_parallel, "tensor_parallel", MAX_GPUS), options,
           vocab_divisible_by)
    try:
        hash(key)
    except TypeError:   # an odd argument: computed (and checked) without the memo
        return _unit_terms_cached.__wrapped__(*key)
    return _unit_terms_cached(*key)


def _term_arrays(grid: ParallelGrid, seq_len, micro_batch,
                 options: ActivationOptions) -> dict[str, np.ndarray]:
    """Each unit term as an array over the grid's t (one activation count per distinct t)."""
    out = {name: np.zeros(grid.t.shape, dtype=np.int64) for name in UNIT_TERMS}
    for t in np.unique(grid.t):
        terms = activation_unit_terms(grid.config, seq_len, micro_batch, int(t), options,
                                      grid.vocab_divisible_by)
        for name in UNIT_TERMS:
            out[name] = np.where(grid.t == t, terms[name], out[name])
    return out


def _too_large(config):
    raise ValueError(f"activations of {config.name} come to more than {MAX_BYTES:,} bytes: "
                     f"lower seq_len or micro_batch")


def _total(config, terms: dict[str, np.ndarray]) -> np.ndarray:
    """The terms' sum, refused before it could pass MAX_BYTES (each term is at most that)."""
    total = np.zeros(np.shape(terms["transformer_layers"]), dtype=np.int64)
    for value in terms.values():
        if np.any(value > MAX_BYTES - total):
            _too_large(config)
        total = total + value
    return total


def _methodical(options: ActivationOptions) -> bool:
    """Full recomputation by a method other than every layer on its own (Megatron-LM's uniform
    with N > 1 layers per chunk, or block)."""
    return options.recompute == "full" and (options.recompute_method,
                                            options.recompute_layers) != ("uniform", 1)


# How a stage's layers keep their activations beyond one copy per layer: (full recomputation's
# method, its layers, whether the loss chain and the recompute transient are separate moments).
EVERY_LAYER = ("uniform", 1, False)


def stage_rules(options: ActivationOptions) -> tuple[str, int, bool]:
    """The :data:`EVERY_LAYER`-like rules of ``options`` that :func:`_stage_terms` reads."""
    method = (options.recompute_method, options.recompute_layers) if _methodical(options) \
        else ("uniform", 1)
    return (*method, options.separate_moments)


def _stage_terms(config, pipeline_parallel, schedule, chunks, micro_batches,
                 units: Mapping[str, np.ndarray], r: np.ndarray,
                 rules: tuple[str, int, bool] = EVERY_LAYER, first_last=None) -> dict[str, np.ndarray]:
    p = pipeline_parallel
    held = layer_activations_held(config.layers, p, r, schedule=schedule, chunks=chunks,
                                  micro_batches=micro_batches, first_last=first_last)
    dense = dense_layer_activations_held(config, p, r, schedule=schedule, chunks=chunks,
                                         micro_batches=micro_batches, first_last=first_last)
    first = np.where(r == 0, embedding_micro_batches(p, schedule=schedule,
                                                     micro_batches=micro_batches), 0)
    last = (r == p - 1).astype(np.int64)
    dense_unit = units.get("dense_transformer_layer", 0)
    if np.any(units["transformer_layers"] > MAX_BYTES // np.maximum(held - dense, 1)) or np.any(
            dense_unit > MAX_BYTES // np.maximum(dense, 1)):
        _too_large(config)
    layers = (held - dense) * units["transformer_layers"]
    if np.any(layers > MAX_BYTES - dense * dense_unit):
        _too_large(config)
    transient = units["recompute_transient"] * np.ones_like(held)
    method, n, separate = rules
    if (method, n) != ("uniform", 1):
        # Megatron-LM's methods (megatron/core/recompute.py): per micro-batch (and model chunk)
        # in flight, a pass over its layers keeps ceil(layers / N) chunk inputs (uniform), or
        # N checkpointed inputs and the rest whole (block); recomputing a uniform chunk holds
        # its N layers at once.
        flight = _in_flight(p, r, schedule, chunks, micro_batches)
        per = stage_layers(config.layers, p, r, first_last) // (
            chunks if schedule == "interleaved" else 1)
        if method == "uniform":
            layers = flight * ceil_div(per, n) * units["transformer_layers"]
            transient = np.minimum(n, per) * units["recompute_transient"]
        else:
            checkpointed = np.minimum(n, per)
            layers = flight * (checkpointed * units["transformer_layers"]
                               + (per - checkpointed) * units["whole_layer"])
        if np.any(layers > MAX_BYTES):
            _too_large(config)
    if separate:   # the loss's peak and a layer's recomputation are different moments
        transient = np.maximum(transient - last * units["logits_loss"], 0)
    return {"transformer_layers": layers + dense * dense_unit,
            "recompute_transient": transient,
            "embedding_dropout_mask": first * units["embedding_dropout_mask"],
            "embedding_norm_input": first * units["embedding_norm_input"],   # BLOOM's, first stage
            "final_norm_input": last * units["final_norm_input"],
            "output_projection_input": last * units["output_projection_input"],
            "logits_loss": last * units["logits_loss"]}


def stage_activation_totals(model, units: Mapping[str, np.ndarray], pipeline_parallel,
                            pipeline_stage, *, schedule: str = "1f1b", chunks: int = 1,
                            micro_batches=None) -> np.ndarray:
    """Activation bytes on one GPU of stage r from :func:`activation_unit_terms` given as arrays
    (one entry per setting, broadcast with ``pipeline_parallel``, ``pipeline_stage`` and
    ``micro_batches``): the schedule's multiples of each term, summed. The vectorised path of
    :func:`activation_bytes_per_gpu` for settings that differ in more than t and p (a planner's
    space); the settings must obey the rules of :func:`zerolib.core.memory.model_parallel.parallel_rules`."""
    config = get_model(model)
    check_schedule(schedule)
    # A model without dense first layers may leave their term out (and every-layer
    # recomputation the whole layer's).
    units = {name: np.asarray(units.get(name, 0) if name in ("dense_transformer_layer", "whole_layer")
                              else units[name], dtype=np.int64) for name in UNIT_TERMS}
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    r = np.asarray(pipeline_stage, dtype=np.int64)
    m = None if micro_batches is None else np.asarray(micro_batches, dtype=np.int64)
    return activation_totals_of(config, units, p, r, schedule, chunks, m)


def stage_terms_of(config, units: Mapping[str, int], p, r, schedule: str, chunks: int,
                   m, rules: tuple = EVERY_LAYER) -> dict[str, np.ndarray]:
    """:func:`stage_activation_terms` by term from :func:`unit_terms`, of checked inputs
    (``rules``: :func:`stage_rules` of the options, and after them, where the stages are uneven,
    their (FIRST, LAST): :func:`with_split`)."""
    terms = _stage_terms(config, p, schedule, chunks, m, units, r, *_split_rules(rules))
    _total(config, terms)   # refused beyond MAX_BYTES, as the public path refuses it
    return terms


def activation_totals_of(config, units: Mapping[str, np.ndarray], p: np.ndarray, r: np.ndarray,
                         schedule: str, chunks: int, m: np.ndarray | None,
                         rules: tuple = EVERY_LAYER) -> np.ndarray:
    """:func:`stage_activation_totals` of checked inputs (a TransformerConfig, int64 arrays;
    ``rules`` as :func:`stage_terms_of`'s, FIRST and LAST arrays with 0 where even): the
    planner's path."""
    return _total(config, _stage_terms(config, p, schedule, chunks, m, units, r,
                                       *_split_rules(rules)))


def with_split(rules: tuple, first_last) -> tuple:
    """``rules`` (:func:`stage_rules`') with the uneven stages' (FIRST, LAST) after them, as
    :func:`stage_terms_of` and :func:`activation_totals_of` read them (None: even)."""
    return tuple(rules[:3]) if first_last is None else (*rules[:3], first_last)


def _split_rules(rules: tuple) -> tuple:
    """(the three rules, FIRST and LAST or None) of a :func:`with_split` tuple."""
    return tuple(rules[:3]), (rules[3] if len(rules) > 3 else None)


def stage_activation_terms(model, seq_len, micro_batch, tensor_parallel=1,
                           pipeline: Pipeline | int = 1, pipeline_stage=0,
                           options: ActivationOptions = DEFAULT_OPTIONS,
                           vocab_divisible_by: int = 1) -> Mapping[str, int]:
    """Activation bytes on one GPU of pipeline stage r at its peak, by term (the names of
    :func:`zerolib.core.memory.activations.model_activation_terms`, which this equals at p = 1),
    under ``pipeline`` (a :class:`~zerolib.core.memory.model_parallel.Pipeline`, or p stages
    under 1F1B) and ``options``.

    ``transformer_layers`` is :func:`layer_activations_held` copies of one layer;
    ``embedding_dropout_mask`` lives on the first stage (:func:`embedding_micro_batches`
    copies), the final norm's and output layer's inputs and the logits on the last (one copy).
    """
    grid = grid_of(model, tensor_parallel, pipeline, pipeline_stage, vocab_divisible_by)
    for name, value in (("tensor_parallel", grid.t), ("pipeline_parallel", grid.p)):
        if value.ndim:
            raise TypeError(f"{name} must be a single number here, got an array "
                            f"(activation_bytes_per_gpu takes arrays)")
    units = _term_arrays(grid, seq_len, micro_batch, options)
    terms = _stage_terms(grid.config, grid.p, grid.schedule, grid.chunks, grid.micro_batches, units,
                         grid.pipeline_stage, stage_rules(options), grid.first_last)
    _total(grid.config, terms)
    return MappingProxyType({name: int(value) for name, value in terms.items()})


def activation_bytes_per_gpu(model, seq_len, micro_batch, tensor_parallel=1,
                             pipeline: Pipeline | int = 1, *, pipeline_stage=None,
                             options: ActivationOptions = DEFAULT_OPTIONS,
                             vocab_divisible_by: int = 1) -> np.ndarray:
    """Total activation bytes (all terms of :func:`stage_activation_terms`) on one GPU,
    vectorised over ``tensor_parallel``, the pipeline's stages and micro-batches and
    ``pipeline_stage``; ``pipeline_stage=None`` takes the larger of the first and last stage.

    A peak adds model state and buffers to this per stage: call it at ``pipeline_stage=0`` and
    ``pipeline_parallel - 1`` and keep the larger sum (the module doc says why two suffice).
    """
    grid = grid_of(model, tensor_parallel, pipeline, pipeline_stage, vocab_divisible_by)
    units = _term_arrays(grid, seq_len, micro_batch, options)
    return at_stage(grid, lambda r: _total(grid.config, _stage_terms(
        grid.config, grid.p, grid.schedule, grid.chunks, grid.micro_batches, units, r,
        stage_rules(options), grid.first_last)))
