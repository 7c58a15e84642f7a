"""Which layers each pipeline stage holds: an even split (L // p a stage, one more on the first
L mod p: DeepSpeed 0.19.8 ``runtime/utils.py partition_uniform``) or uneven stages, the first and
last stage's layers given and the rest split evenly over the middle ones, as Megatron-LM splits
them (``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``; commit
d98e8a64: ``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build``,
``transformer_layer.py`` ``get_transformer_layer_offset``, the rules in
``transformer_config.py`` "Uneven PP"). Megatron-LM splits nothing unevenly on its own: without
them the pipeline size must divide the layers (``megatron/training/arguments.py`` 985-1000).

Vectorised: ``first_last`` is (FIRST, LAST) as numbers or int64 arrays broadcast with p, FIRST 0
on a setting split evenly.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.defaults import MAX_CHUNKS
from zerolib.core.inputs import check_positive_int, echo

if TYPE_CHECKING:
    from zerolib.core.catalogue.models import TransformerConfig

MAX_LAYERS = 2**20                        # layers of one pipeline stage


def check_first_last(first_last, name: str = "pipeline_layers") -> tuple[int, int]:
    """Two whole numbers of layers, each 1 or more (Megatron-LM's TransformerConfig:
    "num_layers_in_first_pipeline_stage must be larger than 0", and the last likewise)."""
    if isinstance(first_last, (str, bytes)) or not hasattr(first_last, "__len__") \
            or len(first_last) != 2:
        raise TypeError(f"{name} must be two whole numbers (FIRST, LAST), got {echo(first_last)}")
    return tuple(check_positive_int(x, name, MAX_LAYERS) for x in first_last)


def stage_layers(layers: int, pipeline_parallel, pipeline_stage, first_last=None) -> np.ndarray:
    """Transformer layers on pipeline stage r of p: L // p, plus one for the first L mod p
    stages (the interleaved schedule's L / p when p x chunks divides L is the same). With
    ``first_last`` (FIRST, LAST; arrays broadcast with p, 0 where a setting is even) the first
    stage holds FIRST, the last LAST and each middle stage (L - FIRST - LAST) / (p - 2):
    Megatron-LM's ``--decoder-first-pipeline-num-layers`` and ``--decoder-last-...``
    (``megatron/core/transformer/transformer_block.py`` ``get_num_layers_to_build``)."""
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    r = np.asarray(pipeline_stage, dtype=np.int64)
    even = layers // p + (r < layers % p)
    if first_last is None:
        return even
    first, last = (np.asarray(x, dtype=np.int64) for x in first_last)
    middle = (layers - first - last) // np.maximum(p - 2, 1)
    return np.where(first > 0, np.where(r == 0, first, np.where(r == p - 1, last, middle)), even)


def stage_start(layers: int, pipeline_parallel, pipeline_stage, first_last=None) -> np.ndarray:
    """The index of the first layer on stage r (1F1B's contiguous runs; Megatron-LM's
    ``get_transformer_layer_offset``: FIRST + (r - 1) x the middle stages' layers)."""
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    r = np.asarray(pipeline_stage, dtype=np.int64)
    even = r * (layers // p) + np.minimum(r, layers % p)
    if first_last is None:
        return even
    first, last = (np.asarray(x, dtype=np.int64) for x in first_last)
    middle = (layers - first - last) // np.maximum(p - 2, 1)
    return np.where(first > 0, np.where(r == 0, 0, first + (r - 1) * middle), even)


def uneven_ok(layers: int, p, chunks, first_last) -> np.ndarray:
    """Megatron-LM's rules for uneven stages (``transformer_config.py``, "Uneven PP"): FIRST and
    LAST at least 1, the middle layers split evenly over p - 2 stages (none at p = 2),
    interleaved: v divides FIRST, LAST and each middle stage's layers."""
    p = np.asarray(p, dtype=np.int64)
    v = np.asarray(chunks, dtype=np.int64)
    first, last = (np.asarray(x, dtype=np.int64) for x in first_last)
    rest, middles = layers - first - last, p - 2
    whole = np.where(middles > 0, (rest > 0) & (rest % np.maximum(middles, 1) == 0), rest == 0)
    per = rest // np.maximum(middles, 1)
    chunked = (first % v == 0) & (last % v == 0) & ((middles <= 0) | (per % v == 0))
    ok = (p >= 2) & (first >= 1) & (last >= 1) & whole & chunked
    return np.where(first > 0, ok, True) if np.ndim(first) else ok


def stage_dense_layers(config: TransformerConfig, pipeline_parallel, pipeline_stage, *,
                       schedule: str = "1f1b", chunks: int = 1, first_last=None) -> np.ndarray:
    """Of the layers on pipeline stage r, how many are the model's first ``dense_layers``.

    1F1B: stage r holds the contiguous layers from r (L // p) + min(r, L mod p) on
    (:func:`stage_layers`), so the dense ones are those below ``dense_layers``. Interleaved:
    rank r holds model chunks r, r + p, ... of L / (p v) layers each, chunk c from layer
    c L / (p v) on. 0 for a model whose layers are alike."""
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    r = np.asarray(pipeline_stage, dtype=np.int64)
    dense = config.dense_layers
    held = stage_layers(config.layers, p, r, first_last)
    start = stage_start(config.layers, p, r, first_last)
    if schedule == "interleaved":   # chunk j of rank r: from j L / v + start / v, held / v wide
        width, begin = held // chunks, start // chunks
        return sum(np.clip(dense - (j * (config.layers // chunks) + begin), 0, width)
                   for j in range(chunks))
    return np.clip(dense - start, 0, held)


def candidate_stages(config: TransformerConfig, pipeline_parallel, first_last=None) -> list[np.ndarray]:
    """The pipeline stages that can be the most loaded, as arrays broadcast with ``p``: the
    first and the last; with uneven stages (``first_last``) also the second, the middle stage
    with the most micro-batches in flight (its layers can outnumber the first's); with dense
    first layers (lighter than an expert layer, so a middle stage of expert layers can
    outweigh the first) every stage, the k-th as min(k, p - 1)."""
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    if not config.dense_layers:
        if first_last is not None:
            return [np.zeros_like(p), np.minimum(1, p - 1), p - 1]
        return [np.zeros_like(p), p - 1]
    return [np.minimum(k, p - 1) for k in range(int(np.max(p)))]


# --- the doors: a run's field, checked once ---------------------------------------------------

def door_split(value, pipeline: int) -> tuple[int, int]:
    """``parallel.pipeline_layers`` as given, checked without the model: two whole numbers of 1
    or more (Megatron-LM allows no stage of 0 layers: "num_layers_in_first_pipeline_stage must
    be larger than 0") on a pipeline of 2 stages or more."""
    try:
        split = check_first_last(value)
    except (TypeError, ValueError):
        raise ValueError(f"parallel.pipeline_layers must be two whole numbers FIRST, LAST, each 1 "
                         f"or more, got {echo(value)}") from None
    if pipeline < 2:
        raise ValueError("parallel.pipeline_layers needs parallel.pipeline of 2 or more (the "
                         "layers of the first and the last pipeline stage)")
    return split


def check_run_split(config: TransformerConfig | None, parallel) -> None:
    """A run's uneven stages against its model (``parallel``: its Parallelism), in one line naming
    the field: Megatron-LM's rules (:func:`uneven_ok`)."""
    p, (first, last) = parallel, parallel.pipeline_layers
    if config is None:
        raise ValueError("parallel.pipeline_layers needs a model with layers (a preset, a config "
                         "or Megatron-LM arguments), not a bare parameter count")
    if p.expert > 1:
        raise ValueError("parallel.pipeline_layers with parallel.expert above 1: uneven stages of "
                         "a mixture spread over expert-parallel ranks are not modelled yet")
    if bool(uneven_ok(config.layers, p.pipeline, p.chunks, (first, last))):
        return
    middle, rest = p.pipeline - 2, config.layers - first - last
    why = (f"the other {rest} layers must split evenly over the {middle} middle stages, at least "
           f"1 each" if middle > 0 else f"at 2 stages FIRST + LAST must be all {config.layers} layers")
    if p.chunks > 1 and (middle <= 0 or (rest > 0 and rest % middle == 0)):
        why = (f"with {p.chunks} model chunks per stage each stage's layers must divide by "
               f"{p.chunks} (FIRST {first}, LAST {last}"
               + (f", middle {rest // middle})" if middle > 0 else ")"))
    raise ValueError(f"parallel.pipeline_layers {first},{last} does not split {config.name}'s "
                     f"{config.layers} layers over {p.pipeline} stages: {why} (Megatron-LM's "
                     f"TransformerConfig, uneven pipeline stages)")


# --- the planner's search ------------------------------------------------------------------------

@lru_cache(maxsize=1024)
def uneven_splits(layers: int, p: int, chunks) -> tuple[tuple[int, int, int], ...]:
    """The uneven stages the planner searches at p beside the even split: one layer fewer on the
    first and the last stage, (L + 2) / p - 1 each and (L + 2) / p on every middle stage, where
    p >= 3 divides L + 2 (Meta's Llama 3.1 405B: 126 layers over 16 stages as 7, 8 x 14, 7, the
    room going to the embedding and the output layer); as :func:`given_split`'s (v, FIRST,
    LAST). FIRST and FIRST + 1 share no factor, so it runs 1F1B only."""
    if p < 3 or (layers + 2) % p or (layers + 2) // p < 2:
        return ()
    return given_split(layers, p, chunks, ((layers + 2) // p - 1,) * 2)


@lru_cache(maxsize=1024)
def given_split(layers: int, p: int, chunks, first_last: tuple[int, int]) -> tuple[tuple[int, int, int], ...]:
    """(v, FIRST, LAST) for each schedule of ``chunks`` ("all", or the v named) under which
    ``first_last`` splits the layers over p stages (:func:`uneven_ok`); none where it does not,
    nor where it is the even split itself."""
    if layers % p == 0 and first_last == (layers // p,) * 2:
        return ()
    allowed = range(1, MAX_CHUNKS + 1) if isinstance(chunks, str) else chunks
    return tuple((v, *first_last) for v in allowed
                 if v <= max(first_last) and bool(uneven_ok(layers, p, v, first_last)))
