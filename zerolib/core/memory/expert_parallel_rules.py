"""Which expert-parallel degrees a plan searches, and the rules each configuration must keep.

For a mixture of experts :func:`zerolib.core.planner.plan` repeats every configuration once per
degree E of ``expert_parallel`` (by default every divisor of the routed experts up to the GPUs;
(1,) for a dense model, which has nothing to spread). A configuration with E > 1 must keep the
engine's rule for where the expert-parallel group sits:

- Megatron-LM (and the paper's schedule): EP inside the data- and context-parallel group,
  E divides d x C (``megatron/core/parallel_state.py``: the expert grid ETP x EP x EDP x PP
  tiles the same GPUs as t x C x d x p; ETP = t here);
- DeepSpeed-MoE: the expert-parallel group carved out of the data-parallel one, E divides d
  (``deepspeed/utils/groups.py``: expert data parallel = d / E);
- FSDP2 (torchtitan, ETP = TP): EP borrows all of C and part of the sharded data-parallel
  degree, C divides E and E divides d x C (torchtitan ``distributed/parallel_dims.py``:
  ``ep % cp == 0 and (dp_shard * cp) % ep == 0``);

and, for every engine, E divides the routed experts, sequence parallelism when t > 1
(Megatron-LM's rule for the token dispatcher), whole shard groups and no offload (what zerolib
models with E > 1). Pure numpy over a plan's columns.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from zerolib.core.inputs import MAX_GPUS, check_positive_int, check_sequence
from zerolib.core.memory.expert_parallel import expert_layers_of, expert_state_of

RULE = ("expert_parallel must divide the routed experts and the engine's expert group "
        "(d x C; DeepSpeed-MoE: d; FSDP2: a multiple of C), with sequence parallelism where "
        "t > 1, whole shard groups and no offload")
# Engines whose expert-parallel group lies inside the data-parallel group alone.
DATA_PARALLEL_ONLY = ("deepspeed",)
# Engines whose expert-parallel group takes the whole context-parallel group (C divides E).
BORROWS_CONTEXT = ("fsdp2",)


def check_degrees(expert_parallel, config, gpus: int) -> tuple[int, ...]:
    """The E a plan searches, checked once: None, every divisor of the routed experts up to
    ``gpus`` ((1,) for a dense model); else whole numbers, above 1 only for a mixture of experts."""
    if expert_parallel is None:
        if not config.mixture_of_experts:
            return (1,)
        return tuple(e for e in range(1, min(config.experts, gpus) + 1) if config.experts % e == 0)
    degrees = tuple(dict.fromkeys(check_positive_int(e, "expert_parallel", MAX_GPUS)
                                  for e in check_sequence(expert_parallel, "expert_parallel",
                                                          "whole numbers, 1 for none")))
    if not degrees:
        raise ValueError("expert_parallel must name at least one degree (1: no expert parallelism)")
    if max(degrees) > 1 and not config.mixture_of_experts:
        raise ValueError(f"expert_parallel above 1 needs a mixture of experts; {config.name} has "
                         f"no experts")
    return degrees


def expand(plan, columns: Mapping[str, np.ndarray], reason: np.ndarray, size: int,
           codes: Mapping[str, int]) -> tuple[Mapping[str, np.ndarray], np.ndarray, int]:
    """A plan's ``columns``, ``reason`` and ``size`` once per degree of ``plan.expert_parallel``
    (unchanged for (1,)), with an ``expert_parallel`` column; a configuration that passed every
    rule up to ``expert_parallel`` and breaks the engine's rule gets its code."""
    degrees = plan.expert_parallel
    if degrees == (1,):
        return columns, reason, size
    index = np.repeat(np.arange(size), len(degrees))
    e = np.tile(np.array(degrees, dtype=np.int64), size)
    out = {name: values[index] for name, values in columns.items()}
    reason = reason[index].copy()
    group = out["data_parallel"]     # the ZeRO group, d x C
    c = out.get("context_parallel", np.ones_like(group))
    tiled = group // c if plan.engine.name in DATA_PARALLEL_ONLY else group
    borrows = (e % c != 0) if plan.engine.name in BORROWS_CONTEXT else np.zeros(len(e), dtype=bool)
    broken = (e > 1) & ((plan.model.experts % e != 0) | (tiled % e != 0) | borrows
                        | ((out["tensor_parallel"] > 1) & ~out["sequence_parallel"])
                        | (out["shard_group"] != group) | (out["offload"] > 0))
    reason = np.where(broken & (reason > codes["expert_parallel"]), codes["expert_parallel"], reason)
    out["expert_parallel"] = e
    return MappingProxyType(out), reason, len(reason)


def persistent(plan, c: Mapping[str, np.ndarray], params: np.ndarray, r: np.ndarray,
               rows: np.ndarray, chunks: np.ndarray) -> np.ndarray:
    """Persistent bytes on a GPU of pipeline stage ``r`` holding ``params`` (every routed
    expert t-split), for the configurations ``rows`` of ``c`` (E > 1, whole shard groups, no
    offload): :func:`zerolib.core.memory.expert_parallel.expert_state_of`, the dense part over
    the ZeRO group and experts / E over group / E."""
    config = plan.model
    p, v, stage_r = c["pipeline_parallel"][rows], chunks[rows], np.broadcast_to(r, params.shape)[rows]
    layers = np.zeros(len(rows), dtype=np.int64)
    for chunk in np.unique(v).tolist():
        sel = v == chunk
        layers[sel] = expert_layers_of(config, p[sel], stage_r[sel],
                                       schedule="interleaved" if chunk > 1 else "1f1b", chunks=chunk)
    return expert_state_of(params[rows], layers, c["tensor_parallel"][rows], c["data_parallel"][rows],
                           c["expert_parallel"][rows], c["stage"][rows], plan.layout, config)
