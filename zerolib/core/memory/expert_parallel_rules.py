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

Expert tensor parallelism (ETP, each routed expert split over ETP ranks) is searched under
Megatron-LM only, among the values it accepts (``--expert-tensor-parallel-size``, by default t,
``megatron/training/arguments.py`` at d98e8a64): ETP divides each expert's width (``ffn_hidden``)
and ETP x E divides t x d x C (``parallel_state.py``: world divisible by ETP x EP x PP, the
expert data parallel group world / (ETP x EP x PP)), with sequence parallelism where t > 1 and
ETP differs from t. The other engines keep ETP = t in the search:

- DeepSpeed-MoE splits experts over the tensor-parallel group or not at all (``MoE(...,
  enable_expert_tensor_parallelism=False)``, ``deepspeed/moe/layer.py``: ETP = 1 by default, t
  with the flag); zerolib searches its ETP = t;
- torchtitan's FSDP2 offers ETP = TP or 1 (``parallel_dims.py``: "Currently we only support
  ETP=TP or ETP=1"; with ETP = 1 EP also borrows the tensor-parallel group,
  ``ep % (cp * tp) == 0``); zerolib searches its ETP = TP.

Each configuration that is runnable so far is repeated once per other ETP that obeys the
rules (an ETP breaking them is not enumerated); the configuration at ETP = t stays as it was.

and, for every engine, E divides the routed experts, sequence parallelism when t > 1
(Megatron-LM's rule for the token dispatcher), whole shard groups and no offload (what zerolib
models with E > 1). Pure numpy over a plan's columns.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from zerolib.core.inputs import MAX_GPUS, check_positive_int, check_sequence
from zerolib.core.memory.expert_parallel import ExpertLayout, expert_layers_of, expert_state_of

# Engines whose plans search expert tensor parallelism (the others keep ETP = t, module doc).
ETP_ENGINES = ("megatron",)

RULE = ("expert_parallel must divide the routed experts and the engine's expert group "
        "(d x C; DeepSpeed-MoE: d; FSDP2: a multiple of C), with sequence parallelism where "
        "t > 1, whole shard groups and no offload")
# Engines whose expert-parallel group lies inside the data-parallel group alone.
DATA_PARALLEL_ONLY = ("deepspeed",)
# Engines whose expert-parallel group takes the whole context-parallel group (C divides E).
BORROWS_CONTEXT = ("fsdp2", "torchtitan")


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


def spread_rows(c: Mapping[str, np.ndarray]) -> np.ndarray:
    """The configurations whose experts lie on their own group: E > 1 or ETP other than t."""
    if "expert_parallel" not in c and "expert_tensor_parallel" not in c:
        return np.zeros(0, dtype=np.int64)
    t = c["tensor_parallel"]
    spread = c.get("expert_parallel", np.ones_like(t)) > 1
    if "expert_tensor_parallel" in c:
        spread = spread | (c["expert_tensor_parallel"] != t)
    return np.flatnonzero(spread)


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
    t = c["tensor_parallel"][rows]
    e = c["expert_parallel"][rows] if "expert_parallel" in c else np.ones_like(t)
    etp = c["expert_tensor_parallel"][rows] if "expert_tensor_parallel" in c else t
    groups = ExpertLayout(t, p, c["data_parallel"][rows], e, etp)
    return expert_state_of(config, params[rows], layers, groups, c["stage"][rows], plan.layout)


def check_etp_degrees(expert_tensor_parallel, config, gpus: int, engine) -> tuple[int, ...] | None:
    """The ETP a plan searches, checked once: None (ETP = t only: a dense model, or an engine not
    in :data:`ETP_ENGINES` by default); by default under Megatron-LM every divisor of
    ``ffn_hidden`` up to ``gpus``; else the whole numbers named (a mixture of experts, an engine
    of :data:`ETP_ENGINES`)."""
    if expert_tensor_parallel is None:
        if not config.mixture_of_experts or engine.name not in ETP_ENGINES:
            return None
        return tuple(k for k in range(1, min(config.ffn_hidden, gpus) + 1)
                     if config.ffn_hidden % k == 0)
    degrees = tuple(dict.fromkeys(check_positive_int(k, "expert_tensor_parallel", MAX_GPUS)
                                  for k in check_sequence(expert_tensor_parallel,
                                                          "expert_tensor_parallel",
                                                          "whole numbers")))
    if not degrees:
        raise ValueError("expert_tensor_parallel must name at least one degree")
    if not config.mixture_of_experts:
        raise ValueError(f"expert_tensor_parallel needs a mixture of experts; {config.name} has "
                         f"no experts")
    if engine.name not in ETP_ENGINES:
        raise ValueError(f"expert_tensor_parallel is searched under engine "
                         f"{', '.join(ETP_ENGINES)} only; engine {engine.name} keeps it at "
                         f"tensor_parallel")
    broken = [k for k in degrees if config.ffn_hidden % k]
    if broken:
        raise ValueError(f"expert_tensor_parallel must divide ffn_hidden (each expert's width, "
                         f"{config.ffn_hidden} for {config.name}), got {broken[0]}")
    return degrees


def expand_etp(plan, columns: Mapping[str, np.ndarray], reason: np.ndarray, size: int,
               passes: int) -> tuple[Mapping[str, np.ndarray], np.ndarray, int]:
    """A plan's ``columns``, ``reason`` and ``size`` with an ``expert_tensor_parallel`` column
    (unchanged where ``plan.expert_tensor_parallel`` is None): each row at ETP = t, then each
    runnable-so-far row (reason ``passes``) once more per other ETP searched that obeys the rules
    (module doc)."""
    degrees = plan.expert_tensor_parallel
    if degrees is None:
        return columns, reason, size
    t, group = columns["tensor_parallel"], columns["data_parallel"]    # the ZeRO group, d x C
    e = columns.get("expert_parallel", np.ones_like(t))
    whole = (columns["shard_group"] == group) & (columns["offload"] == 0)
    open_rows = (reason == passes) & whole
    index, etp = [np.arange(size)], [t]
    for k in degrees:
        ok = open_rows & (t != k) & ((t * group) % (k * e) == 0) & ((t == 1) | columns["sequence_parallel"])
        rows = np.flatnonzero(ok)
        index.append(rows)
        etp.append(np.full(len(rows), k, dtype=np.int64))
    index = np.concatenate(index)
    out = {name: values[index] for name, values in columns.items()}
    out["expert_tensor_parallel"] = np.concatenate(etp).astype(np.int64)
    return MappingProxyType(out), reason[index], len(index)
