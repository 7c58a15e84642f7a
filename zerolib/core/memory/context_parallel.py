"""Which context-parallel degrees a configuration can run at: the planner's rules for C.

A plan's configuration holds t, p, the ZeRO group of gpus / (t p) GPUs, a micro-batch b and
the step's settings; at a CP degree C (:mod:`zerolib.core.memory.working_set`: ranks in
Megatron-LM's order tp-cp-ep-dp-pp, ZeRO over the d x C GPUs of the data- and context-parallel
group) it needs C to divide that group, t to divide the s / C tokens of a CP rank under sequence
parallelism, and d = group / C replicas running B / (d b) micro-batches per step, so the rules
that read d and the micro-batches are checked again for it. Pure numpy over a plan's columns.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from zerolib.core.inputs import check_positive_int, check_sequence
from zerolib.core.memory.activations import MAX_CONTEXT_PARALLEL, context_parallel_tokens


def check_degrees(context_parallel, seq_len: int, flash_attention: bool) -> tuple[int, ...]:
    """The CP degrees a plan searches, checked once: each splits the sequence into 2C chunks,
    and above 1 needs flash attention (the working set's rule)."""
    degrees = tuple(dict.fromkeys(check_positive_int(c, "context_parallel", MAX_CONTEXT_PARALLEL)
                                  for c in check_sequence(context_parallel, "context_parallel",
                                                          "whole numbers, 1 for none")))
    if not degrees:
        raise ValueError("context_parallel must name at least one degree (1: no context parallelism)")
    for c in degrees:
        context_parallel_tokens(seq_len, c)
    if max(degrees) > 1 and not flash_attention:
        raise ValueError("context_parallel above 1 needs flash_attention in the working set")
    return degrees


# The CP degrees a plan searches when none are named, under an engine that runs ring attention:
# up to 16, the degree Meta's Llama 3.1 405B ran at 131,072 tokens (Dubey et al., "The Llama 3
# Herd of Models", arXiv:2407.21783, Sec. 3.3.2 and Table 4: TP 8, CP 16, PP 16, DP 8).
DEFAULT_DEGREES = (1, 2, 4, 8, 16)


def default_degrees(engine_runs_it: bool, seq_len: int, gpus: int, flash_attention: bool) -> tuple[int, ...]:
    """The CP degrees searched when none are named: (1,) under an engine without ring attention
    or without flash attention; else those of :data:`DEFAULT_DEGREES` no larger than ``gpus``
    that cut the sequence into 2C whole chunks (4,096 tokens: up to 16; 8 GPUs: up to 8)."""
    if not (engine_runs_it and flash_attention):
        return (1,)
    return tuple(c for c in DEFAULT_DEGREES if c <= gpus and (c == 1 or seq_len % (2 * c) == 0))


def expand(plan, columns: Mapping[str, np.ndarray], reason: np.ndarray, size: int,
           codes: Mapping[str, int]) -> tuple[Mapping[str, np.ndarray], np.ndarray, int]:
    """A plan's ``columns``, ``reason`` and ``size`` once per degree of ``plan.context_parallel``
    (unchanged for (1,)), with a ``context_parallel`` column and each degree's micro-batches.
    ``plan`` is a checked :class:`zerolib.core.planner.PlanSettings` (its ``seq_len``,
    ``global_batch``, ``host_memory``, its engine's ``pipeline_stages``); ``codes`` gives
    each rule's reason code in the order they are checked (``context_parallel`` and the
    structural rules before ``global_batch``, then ``micro_batches``, ``pipeline_zero``,
    ``host_unknown``), the code of a configuration that breaks none being ``len(codes)``. A row
    whose structural rules held at C = 1 is checked again at C > 1 from ``context_parallel`` on;
    ``data_parallel`` stays the ZeRO group."""
    degrees = plan.context_parallel
    if degrees == (1,):
        return columns, reason, size
    passes, k = len(codes), len(degrees)
    index = np.repeat(np.arange(size), k)
    c = np.tile(np.array(degrees, dtype=np.int64), size)
    out = {name: values[index] for name, values in columns.items()}
    reason = reason[index].copy()
    t, p, group, b = (out[n] for n in ("tensor_parallel", "pipeline_parallel", "data_parallel",
                                       "micro_batch"))
    again = (c > 1) & (reason >= codes["global_batch"])     # the structural rules held
    reason = np.where(again, passes, reason)
    splits = (group % c == 0) & (~out["sequence_parallel"] | ((plan.seq_len // c) % t == 0))
    d = np.where(group % c == 0, group // c, 1)
    whole = plan.global_batch % (d * b) == 0
    m = np.where(whole, plan.global_batch // (d * b), 1)
    out["micro_batches"] = np.where(c > 1, m, out["micro_batches"])
    checks = (("context_parallel", ~splits), ("global_batch", ~whole),
              ("micro_batches", (out["chunks"] > 1) & (m % p != 0)),
              # the engine's rule, as at C = 1 (FSDP2 runs stages 2-3 beside a pipeline)
              ("pipeline_zero", (p > 1) & ~np.isin(out["stage"], plan.engine.pipeline_stages)),
              ("host_unknown", (plan.host_memory is None) & (out["offload"] > 0)))
    for name, broken in checks:
        reason = np.where(again & (reason == passes) & broken, codes[name], reason)
    out["context_parallel"] = c
    return MappingProxyType(out), reason, len(reason)


def apart(configuration, columns=None):
    """A configuration (a dict, or a frame of them) with ``data_parallel`` as d, the ZeRO group
    over C; unchanged without a ``context_parallel`` entry (taken from ``columns`` if given)."""
    if columns is not None and "context_parallel" in columns:
        configuration = configuration.assign(context_parallel=columns["context_parallel"])
    if "context_parallel" not in configuration:
        return configuration
    out = configuration.copy()
    out["data_parallel"] = configuration["data_parallel"] // configuration["context_parallel"]
    return out
