"""Expert parallelism in the step model: what E changes in :func:`zerolib.core.step.parallel.parallel_step_time`.

With E-way expert parallelism (ETP = t, Megatron-LM's default) one GPU holds experts / E of every
MoE layer's routed experts (:mod:`zerolib.core.memory.expert_parallel`), so per pipeline stage

- the **dense part** (everything but the routed experts) is reduced, gathered and sharded over
  the ZeRO group of d GPUs t apart, as before;
- the **routed experts** it holds over their expert-data-parallel group of d / E GPUs, t x E
  apart (Megatron-LM's expert grid ETP x EP x EDP x PP: ``megatron/core/parallel_state.py``),
  fewer bytes on a smaller ring, each slot timed by the same schedule
  (:mod:`zerolib.core.step.traffic`) and added to the dense part's;
- each MoE layer runs 4 all-to-alls per micro-batch (dispatch and combine, forward and backward;
  6 under full recomputation, which re-runs the forward's two;
  :mod:`zerolib.core.step.expert_parallel_traffic`) over the E ranks t x C apart, not overlapped
  (the ``expert`` part of the step).

Expert tensor parallelism (``expert_tensor_parallel``, ETP; None: t) changes three things where it
differs from t: a GPU holds its experts / E split ETP ways (their elements as
:func:`~zerolib.core.memory.expert_parallel.expert_elements_of` counts them at ETP); their
expert-data-parallel group is t x d / (ETP x E) GPUs, ETP x E apart (Megatron-LM's
``expert_data_parallel_size = world / (ETP x EP x PP)``, ``parallel_state.py`` ~871-884); and
each MoE layer adds the dispatcher's ETP all-gathers and reduce-scatters
(:mod:`zerolib.core.step.expert_parallel_traffic`) to the ``expert`` part. Those run at ETP = t
too, E = 1 included (a plain tensor-parallel mixture: 4 per MoE layer and micro-batch, 6 under
full recomputation, in place of the MLP's collectives over t, which the ``tensor`` part leaves
out of a MoE layer), so every mixture goes through :func:`expert_parts`. The all-to-alls run
over E ranks ETP x C apart (t x C at ETP = t, as before).

Compute is unchanged by E: under uniform routing a GPU's experts / E see E times the tokens, as
many expert FLOPs as without expert parallelism, those of the active parameters (the dense part
and k / X of the routed experts, :func:`active_parameters`). Only whole shard groups (G = d) and no offload are
modelled with E > 1; the settings are refused otherwise.
"""
from __future__ import annotations

import numpy as np

from zerolib.core.catalogue.nodes import Interconnect
from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.memory.expert_parallel import expert_elements_of, expert_layers_of
from zerolib.core.step.collectives import ring_timing_of
from zerolib.core.step.expert_parallel_traffic import calls_per_layer, counted_etp, etp_call_seconds


def checked(config, e, t, d, sp, shard_group, offload, etp=None) -> bool:
    """True once the arrays of a setting with some E > 1 or some ETP other than t obey the rules
    (ValueError otherwise); ``etp`` None: ETP = t."""
    if not config.mixture_of_experts:
        raise ValueError(f"expert_parallel above 1 needs a mixture of experts; {config.name} has "
                         f"no experts")
    many = e > 1
    if np.any(config.experts % e):
        raise ValueError(f"expert_parallel must divide the routed experts ({config.experts} for "
                         f"{config.name})")
    if etp is None and np.any(d % e):
        raise ValueError("expert_parallel must divide data_parallel (the experts' grid tiles "
                         "the ZeRO group)")
    if etp is not None:
        if np.any(config.ffn_hidden % etp):
            raise ValueError(f"expert_tensor_parallel must divide ffn_hidden (each expert's width, "
                             f"{config.ffn_hidden} for {config.name})")
        if np.any((t * d) % (etp * e)):
            raise ValueError("expert_tensor_parallel x expert_parallel must divide "
                             "tensor_parallel x data_parallel (the experts' grid tiles the GPUs)")
        if np.any((etp != t) & (t > 1) & ~sp):
            raise ValueError("expert_tensor_parallel other than tensor_parallel needs "
                             "sequence_parallel where tensor_parallel is above 1")
        many = many | (etp != t)
    if np.any(many & (t > 1) & ~sp):
        raise ValueError("expert_parallel above 1 with tensor_parallel above 1 needs "
                         "sequence_parallel (Megatron-LM's rule)")
    if np.any(many & (offload > 0)) or (shard_group is not None and np.any(many & (shard_group != d))):
        raise ValueError("expert_parallel above 1 is modelled with whole shard groups and no "
                         "offload only")
    return True


def expert_parts(config, ic, st, slots, params, r, units, zero_slots):
    """(the ZeRO slots' seconds with the experts over their own group, the all-to-alls' seconds
    per micro-batch) on pipeline stage r of the checked settings ``st`` (one context-parallel
    degree); rows with E = 1 keep ``slots`` as given."""
    e, t, p, d = st.expert_parallel, st.tensor_parallel, st.pipeline_parallel, st.data_parallel
    given = getattr(st, "expert_tensor_parallel", None)
    etp = t if given is None else given
    layers = expert_layers_of(config, p, r)
    every = layers * expert_elements_of(config, t, config.experts)
    held = layers * expert_elements_of(config, etp, config.experts // e)
    edp = t * d // (etp * e)        # Megatron-LM's expert data parallel (d / E at ETP = t)
    # whole groups where the experts are spread (checked): t x group / (ETP x E) is the EDP
    group = None if st.shard_group is None else t * st.shard_group // (etp * e)
    many = (e > 1) | (etp != t)
    out = slots
    if np.any(many):     # E = 1 at ETP = t: the experts' state reduces with the dense part's
        dense, _ = zero_slots(ic, params - every, d, t, st.stage, st.layout, st.shard_group, units,
                              p, st.engine)
        experts, _ = zero_slots(ic, held, edp, etp * e, st.stage, st.layout, group, units, p,
                                st.engine)
        out = {name: np.where(many, dense[name] + experts[name], seconds)
               for name, seconds in slots.items()}
    # The dispatcher's ETP collectives at every ETP above 1 (E = 1 too), full recomputation's.
    return out, all_to_all_seconds_of(config, ic, st, layers)


def all_to_all_seconds_of(config, ic: Interconnect, st, moe_layers) -> np.ndarray:
    """Seconds per micro-batch of one GPU's all-to-alls under the checked settings ``st`` (a
    :class:`~zerolib.core.step.parallel.ParallelSettings` of one context-parallel degree: the
    planner's path; :func:`~zerolib.core.step.expert_parallel_traffic.expert_traffic` and
    :func:`~zerolib.core.step.expert_parallel_traffic.expert_traffic_seconds` per setting),
    ``moe_layers`` on the GPU: 4 per MoE layer (6 under full recomputation), each its latency
    plus the rows for other ranks' experts at the bus bandwidth of E ranks ETP x C apart; 0
    where E = 1. A GPU routes the tokens of s / C of each sequence. The dispatcher's ETP
    all-gathers and reduce-scatters are added as ``expert_traffic`` counts them."""
    b, t, e = st.micro_batch, st.tensor_parallel, st.expert_parallel
    given = getattr(st, "expert_tensor_parallel", None)
    etp = t if given is None else given
    seq_len, full = st.seq_len // st.context_parallel, st.recompute == RECOMPUTE.index("full")
    tokens = np.where(st.sequence_parallel, seq_len * b // t, seq_len * b)
    x, k = config.experts, config.experts_per_token
    if st.capacity_factor is None:
        rows = tokens * k
    else:    # the float rule routed_rows applies, element by element
        rows = x * np.ceil(st.capacity_factor * k * tokens / x).astype(np.int64)
    sent = -(-rows * (e - 1) // e) * config.hidden * st.element_bytes
    latency, bandwidth = ring_timing_of(ic, "all_to_all", e, etp * st.context_parallel)
    seconds = (calls_per_layer(full) * np.asarray(moe_layers) * (latency + sent / bandwidth))
    seconds = np.where(e > 1, seconds, 0.0)
    counted = counted_etp(etp, t, st.sequence_parallel)
    etp_sent = (counted - 1) * rows * config.hidden * st.element_bytes
    etp_seconds = calls_per_layer(full) * np.asarray(moe_layers) * etp_call_seconds(ic, counted, etp_sent)
    return seconds + np.where(counted > 1, etp_seconds, 0.0)


def active_parameters(config, params, t, p, r):
    """Of ``params`` on one GPU of pipeline stage r (every routed expert t-split), those one
    token's FLOPs use: the dense part and k / X of the experts, with or without expert
    parallelism (a GPU's experts / E see E times the tokens). ``params`` for a dense model."""
    if not config.mixture_of_experts:
        return params
    layers = expert_layers_of(config, p, r)
    one = expert_elements_of(config, t, 1)
    return params - layers * one * (config.experts - config.experts_per_token)
