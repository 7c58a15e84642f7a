"""Which parameters a step multiplies: the FLOP convention's parameter side (``docs/flops.md``).

A token's FLOPs are 6 per parameter that a matrix multiplies (2 forward, 4 backward; Kaplan et
al. 2020, arXiv:2001.08361, Sec. 2.1, whose N leaves the embeddings out) plus the attention
core (:mod:`zerolib.core.step.time`). Two kinds of parameters are held but not multiplied:

- the **input embedding**, a lookup: each token gathers one row of the V x h table (PyTorch's
  ``nn.Embedding``, Megatron-LM's ``VocabParallelEmbedding``: an index, then an all-reduce of
  the rows each rank holds), and a learned position embedding alike. The output projection is
  a matrix product (h x V per token); with tied embeddings it is the same matrix, which the
  step then multiplies once (on the last pipeline stage's copy when the pipeline splits them);
- a mixture of experts' routed experts that a token is not routed to
  (:func:`zerolib.core.catalogue.models.active_parameter_count`).

Counting the embedding as 6 FLOPs per parameter and token made the first pipeline stage
the slowest of every pipeline that holds it, by the embedding's share of the stage.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from zerolib.core.catalogue.models import (
    TransformerConfig,
    active_parameter_count,
    get_model,
    parameter_count,
)
from zerolib.core.memory.model_parallel import module_splits, rank_elements

LOOKUP_MODULES = ("embedding", "position_embedding")   # gathered per token, never multiplied


@lru_cache(maxsize=64)
def _lookup_pieces(config: TransformerConfig) -> tuple:
    """The model's looked-up modules with their split rules, found once per model (the step
    asks on every stage of every setting)."""
    return tuple(piece for piece in module_splits(config) if piece.name in LOOKUP_MODULES)


def lookup_parameters_on(config: TransformerConfig, tensor_parallel, pipeline_parallel,
                         pipeline_stage) -> np.ndarray:
    """Parameters on one GPU of pipeline stage r that a token looks up and no matrix multiplies
    (int64, broadcast over t, p and r): on the first stage its share of the input embedding's
    vocabulary rows and a learned position embedding; 0 elsewhere. With tied embeddings and one
    stage holding both ends, the table is the output projection too, multiplied: only the
    position embedding is idle there."""
    t = np.asarray(tensor_parallel, dtype=np.int64)
    p = np.asarray(pipeline_parallel, dtype=np.int64)
    r = np.asarray(pipeline_stage, dtype=np.int64)
    shape = np.broadcast(t, p, r).shape
    embedding = position = np.zeros(shape, dtype=np.int64)
    for piece in _lookup_pieces(config):
        if piece.name == "embedding":
            embedding = np.broadcast_to(rank_elements(piece, t), shape)
        else:
            position = np.broadcast_to(rank_elements(piece, t), shape)
    both_ends = (r == 0) & (r == p - 1) & config.tied_embeddings
    return np.where(r == 0, np.where(both_ends, 0, embedding) + position, 0).astype(np.int64)


def idle_parameters(model) -> int:
    """Parameters of the whole model (one GPU holding all of it) that a token's FLOPs do not
    use: :func:`lookup_parameters_on` at t = p = 1 and the routed experts it skips."""
    config = get_model(model)
    skipped = parameter_count(config) - active_parameter_count(config)
    return int(lookup_parameters_on(config, 1, 1, 0)) + skipped


def multiplied_parameters(model) -> int:
    """Parameters a token's matrices multiply, over the whole model: the N of 6N (Kaplan et
    al.'s non-embedding count, with the output projection, which is a product)."""
    config = get_model(model)
    return parameter_count(config) - idle_parameters(config)
