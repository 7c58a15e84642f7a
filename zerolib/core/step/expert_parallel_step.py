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

from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.memory.expert_parallel import expert_elements_of, expert_layers_of
from zerolib.core.step.expert_parallel_traffic import all_to_all_seconds_of


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


def expert_parts(config, ic, st, slots, params, r, seq_len, c, units, zero_slots):
    """(the ZeRO slots' seconds with the experts over their own group, the all-to-alls' seconds
    per micro-batch) on pipeline stage r; rows with E = 1 keep ``slots`` as given."""
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
    a2a = all_to_all_seconds_of(config, ic, seq_len, st.micro_batch, t, st.sequence_parallel, e,
                                layers, st.capacity_factor, st.element_bytes, etp * c, etp,
                                st.recompute == RECOMPUTE.index("full"))
    return out, a2a


def active_parameters(config, params, t, p, r):
    """Of ``params`` on one GPU of pipeline stage r (every routed expert t-split), those one
    token's FLOPs use: the dense part and k / X of the experts, with or without expert
    parallelism (a GPU's experts / E see E times the tokens). ``params`` for a dense model."""
    if not config.mixture_of_experts:
        return params
    layers = expert_layers_of(config, p, r)
    one = expert_elements_of(config, t, 1)
    return params - layers * one * (config.experts - config.experts_per_token)
