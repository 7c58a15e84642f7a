"""Expert parallelism's all-to-alls: the tokens a mixture-of-experts layer dispatches and combines.

With E-way expert parallelism each GPU holds experts / E of every layer's routed experts, so the
tokens its router sends elsewhere must travel there and back (GShard, Lepikhin et al. 2020,
Sec. 2.2; Megatron-LM's ``MoEAlltoAllTokenDispatcher``; DeepSpeed-MoE's ``_AllToAll``). Per MoE
layer and micro-batch, four all-to-alls over the E ranks of the expert-parallel group (six under
full recomputation):

- forward: **dispatch** (each token's k copies to the ranks of its experts) and **combine** (the
  experts' outputs back to the token's rank);
- backward: the gradients of both, the same sizes in the opposite direction (the autograd of an
  all-to-all is the reverse all-to-all);
- full recomputation: the forward's two again, before the backward, so 6. Megatron-LM d98e8a64's
  ``--recompute-granularity full`` wraps whole layers, MoE layers included, in
  ``tensor_parallel.checkpoint`` (``transformer_block.py`` 662-663 calls ``checkpointed_forward``,
  ``recompute.py`` 142), whose backward re-runs the layer's forward (``tensor_parallel/random.py``
  659), the MoE layer's ``self.dispatch`` and ``self.combine`` with it (``moe_layer.py`` 680-685);
  its selective default, ``core_attn`` (``transformer_config.py`` 1940-1941), re-runs core
  attention only (``transformer_block.py`` 299-301), no all-to-all (``moe`` among the
  ``recompute_modules`` would re-run them, ``moe_layer.py`` 247-249 and 701-713; not modelled).
  DeepSpeed's activation checkpointing re-runs the checkpointed function in the backward
  (``runtime/activation_checkpointing/checkpointing.py`` 745 at edaa722, version 0.19.6) and
  torchtitan's full activation checkpointing wraps each block, MoE and its expert-parallel
  all-to-alls included (``torchtitan/distributed/activation_checkpoint.py`` 166-183 at b5bcd76; its
  ``models/common/token_dispatcher.py`` 261 and 328 call ``all_to_all_single``),
  while its selective one saves ``all_to_all_single``'s outputs (line 63) and re-sends none.

Bytes handed to one all-to-all per GPU: the token rows it routes, x hidden x the activation
width (2 bytes in 16-bit). Rows:

- dropless routing (``capacity_factor`` None): T x k, T the tokens on the GPU;
- a capacity factor c: every one of the X routed experts takes a fixed buffer of
  ceil(c x k x T / X) rows from each GPU, padded when fewer arrive (the rule
  :mod:`zerolib.core.memory.activations` sizes the experts' buffers by), so X x that many.

Of that, the rows for the GPU's own experts stay; the share that leaves it is (E - 1) / E under
uniform routing (exact with a capacity: every rank's buffers are the same size; dropless, the
expected share, rounded up to whole rows). T is s x b, or s x b / t under sequence parallelism
with tensor parallelism t (Megatron-LM requires sequence parallelism when t > 1 and E > 1, so
each tensor-parallel rank dispatches its own 1 / t of the sequence).

The activations of the experts' tokens are unchanged by expert parallelism under uniform
routing: a GPU's X / E experts each receive one buffer from each of the E ranks, X buffers in all,
as many rows as its own experts would hold without expert parallelism, so
:mod:`zerolib.core.memory.activations`' count stands and is not repeated here.

Expert tensor parallelism (ETP, Megatron-LM's ``--expert-tensor-parallel-size``; by default t):
the alltoall dispatcher works over the expert group of ETP x E ranks (``token_dispatcher.py`` at
d98e8a64: ``self.tp_group = pg_collection.expt_tp``). Each rank dispatches its own rows over E
(``token_dispatch``: ``all_to_all(self.ep_group, ...)``), then all-gathers what it received over
the ETP ranks before the experts (``dispatch_postprocess``: ``gather_from_sequence_parallel_region
(..., group=self.tp_group)``), and reduce-scatters the experts' partial outputs back after them
(``combine_preprocess``: ``reduce_scatter_to_sequence_parallel_region(..., group=self.tp_group)``);
the backward pass runs the reverse of each (a reduce-scatter for the all-gather, an all-gather for
the reduce-scatter). Per MoE layer and micro-batch, with R the rows a GPU hands to one all-to-all,
that is 2 all-gathers and 2 reduce-scatters over ETP, each of an ETP x R-row tensor of which a GPU
sends (ETP - 1) x R rows; full recomputation re-runs the layer's forward in the backward pass, and
with it the all-gather and the reduce-scatter: 6. They are counted at every ETP above 1, ETP = t
(the default) included: the MoE layer runs none of a dense MLP's collectives over t (its input
and output stay sequence shards), so :mod:`zerolib.core.step.model_parallel_traffic` leaves the
MLP's rows out of a MoE layer (:func:`~zerolib.core.step.model_parallel_traffic.moe_mlp_free_layers`).
The one exception is ETP = t > 1 without sequence parallelism, which Megatron-LM refuses for
training (``moe_layer.py`` 636): there the dense MLP's all-reduces over t stand in and the ETP
collectives are not counted. The reduce-scatter runs at the probabilities' width
(``hidden_states.to(self.probs.dtype)``, line 830), the activations' own unless
``moe_router_dtype`` is set. The probabilities' all-to-all and all-gather (one value per row)
and the split sizes are not counted.

The dispatcher is Megatron-LM's ``--moe-token-dispatcher-type alltoall``
(``MoEAlltoAllTokenDispatcher``), what its Mixtral example trains with
(``examples/mixtral/train_mixtral_8x7b_distributed.sh`` 56) and the all-to-all dispatch and
combine DeepSeek-V3 reports (arXiv 2412.19437, Sec. 3.2.2; Megatron-LM's DeepSeek-V3 example runs
``flex``, DeepEP's all-to-all kernels, ``examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh`` 93);
Megatron-LM's default, ``allgather`` (``transformer_config.py`` 891), would instead all-gather
every token's hidden state over the ETP x E ranks and reduce-scatter the experts' outputs back
(``token_dispatcher.py`` 299-300 and 365-366), (ETP x E - 1) x T rows received per call whatever
k, not modelled here.

Timing through the one ring model (:func:`zerolib.core.step.collectives.ring_timing_of` with
kind ``all_to_all``, as qgZ's all-to-alls are timed in :mod:`zerolib.core.step.time`): latency per
call for E - 1 steps, the bytes sent at the ring's bus bandwidth. The expert-parallel group sits
in Megatron-LM's rank order inside the data-parallel dimension next to tensor parallelism
(tp-cp-ep-dp-pp): its E ranks are t apart (``stride`` t x cp).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zerolib.core.catalogue.models import get_model
from zerolib.core.catalogue.nodes import Interconnect
from zerolib.core.inputs import MAX_GPUS, check_flag, check_positive_int, whole_in_range
from zerolib.core.memory.activations import DEFAULT_OPTIONS, ActivationOptions
from zerolib.core.step.collectives import ring_timing_of

# Each kind of a MoE layer's dispatcher collective (the all-to-alls: dispatch and combine; over
# ETP: the all-gather before the experts and the reduce-scatter after) runs twice in the forward
# and twice in the backward; full recomputation runs the forward's two again.
CALLS_PER_LAYER = 4
RECOMPUTED_PER_LAYER = 2
MAX_TOKENS = 2**40


@dataclass(frozen=True)
class ExpertTraffic:
    """Per GPU: one MoE layer's all-to-alls for one micro-batch, and their count per step."""

    expert_parallel: int
    tokens: int                    # tokens this GPU routes per micro-batch (T)
    rows: int                      # token rows handed to one all-to-all
    handed_bytes: int              # per all-to-all
    sent_bytes: int                # per all-to-all: the rows for other ranks' experts
    moe_layers: int                # MoE layers on the GPU (its pipeline stage)
    micro_batches: int
    capacity_factor: float | None
    expert_tensor_parallel: int = 1    # ETP where its collectives are counted; 1: none
    etp_tensor_bytes: int = 0      # per ETP all-gather (its output) or reduce-scatter (its input)
    etp_sent_bytes: int = 0        # per ETP call: the (ETP - 1) x R rows a GPU sends
    full_recompute: bool = False   # the forward's collectives run again in the backward

    @property
    def etp_calls(self) -> int:
        """ETP all-gathers and reduce-scatters per step on one GPU: 4 per MoE layer per
        micro-batch (6 under full recomputation) where ETP is counted (see the module doc)."""
        if self.expert_tensor_parallel == 1:
            return 0
        return (int(calls_per_layer(self.full_recompute)) * self.moe_layers
                * self.micro_batches)

    @property
    def step_etp_sent_bytes(self) -> int:
        return self.etp_calls * self.etp_sent_bytes

    @property
    def calls(self) -> int:
        """All-to-alls per step on one GPU: 4 per MoE layer per micro-batch, 6 under full
        recomputation (none when E = 1)."""
        if self.expert_parallel == 1:
            return 0
        return (int(calls_per_layer(self.full_recompute)) * self.moe_layers
                * self.micro_batches)

    @property
    def step_handed_bytes(self) -> int:
        return self.calls * self.handed_bytes

    @property
    def step_sent_bytes(self) -> int:
        return self.calls * self.sent_bytes

    def as_dict(self) -> dict:
        return {"expert_parallel": self.expert_parallel, "tokens_per_micro_batch": self.tokens,
                "rows_per_all_to_all": self.rows, "capacity_factor": self.capacity_factor,
                "routing": "uniform" if self.capacity_factor is None else "capacity-padded",
                "moe_layers": self.moe_layers, "micro_batches": self.micro_batches,
                "all_to_all_calls": self.calls,
                "handed_bytes_per_all_to_all": self.handed_bytes,
                "sent_bytes_per_all_to_all": self.sent_bytes,
                "handed_bytes_per_step": self.step_handed_bytes,
                "sent_bytes_per_step": self.step_sent_bytes,
                "expert_tensor_parallel": self.expert_tensor_parallel,
                "etp_calls": self.etp_calls,
                "etp_tensor_bytes_per_call": self.etp_tensor_bytes,
                "etp_sent_bytes_per_call": self.etp_sent_bytes,
                "etp_sent_bytes_per_step": self.step_etp_sent_bytes}


def calls_per_layer(full_recompute):
    """Calls of each kind of dispatcher collective per MoE layer and micro-batch, the
    all-to-alls or the ETP all-gathers and reduce-scatters: 4, or 6 where full recomputation
    re-runs the forward (arrays too)."""
    return CALLS_PER_LAYER + RECOMPUTED_PER_LAYER * np.asarray(full_recompute, dtype=np.int64)


def counted_etp(expert_tensor_parallel, tensor_parallel, sequence_parallel):
    """The ETP whose dispatcher collectives are counted (arrays too): ETP, except 1 (none) at
    ETP = t > 1 without sequence parallelism, where the dense MLP's all-reduces stand in."""
    etp = np.asarray(expert_tensor_parallel, dtype=np.int64)
    return np.where((etp != tensor_parallel) | np.asarray(sequence_parallel, dtype=bool), etp, 1)


def routed_rows(experts: int, experts_per_token: int, tokens: int,
                capacity_factor: float | None) -> int:
    """Token rows one GPU hands to a dispatch: T x k dropless, else X x ceil(c x k x T / X)."""
    if capacity_factor is None:
        return tokens * experts_per_token
    return experts * math.ceil(capacity_factor * experts_per_token * tokens / experts)


def expert_traffic(model, seq_len: int, micro_batch: int, expert_parallel: int, *,
                   tensor_parallel: int = 1, moe_layers: int | None = None, micro_batches: int = 1,
                   options: ActivationOptions = DEFAULT_OPTIONS) -> ExpertTraffic:
    """The all-to-alls of ``model`` under ``expert_parallel`` E for one GPU of a
    ``tensor_parallel`` group. ``moe_layers`` (None: every layer with experts, i.e. no pipeline)
    counts the MoE layers the GPU holds; ``micro_batches`` the micro-batches per step it runs.
    Of ``options`` (:class:`~zerolib.core.memory.activations.ActivationOptions`): the element
    size of a token's row, sequence parallelism (each rank dispatches its part of the sequence),
    the capacity factor (None: dropless), ``expert_tensor_parallel`` (None: t), whose dispatcher
    all-gathers and reduce-scatters are added at any ETP above 1 (see the module doc), and
    whether full recomputation runs the forward's all-to-alls and ETP collectives again."""
    config = get_model(model)
    if not isinstance(options, ActivationOptions):
        raise TypeError(f"options must be an ActivationOptions, got {type(options).__name__}")
    sequence_parallel, expert_tensor_parallel = options.sequence_parallel, options.expert_tensor_parallel
    e = check_positive_int(expert_parallel, "expert_parallel", MAX_GPUS)
    if not config.mixture_of_experts:
        raise ValueError(f"expert_parallel needs a mixture of experts; {config.name} has no experts")
    if config.experts % e:
        raise ValueError(f"expert_parallel must divide the routed experts: {config.name} has "
                         f"{config.experts}, got expert_parallel {e}")
    s = check_positive_int(seq_len, "seq_len", MAX_TOKENS)
    b = check_positive_int(micro_batch, "micro_batch", MAX_TOKENS)
    t = check_positive_int(tensor_parallel, "tensor_parallel", MAX_GPUS)
    sp = check_flag(sequence_parallel, "sequence_parallel")
    etp = t if expert_tensor_parallel is None else check_positive_int(
        expert_tensor_parallel, "expert_tensor_parallel", MAX_GPUS)
    if config.ffn_hidden % etp:
        raise ValueError(f"expert_tensor_parallel must divide ffn_hidden (each expert's width): "
                         f"{config.name} has {config.ffn_hidden}, got expert_tensor_parallel {etp}")
    if etp != t and t > 1 and not sp:
        raise ValueError("expert_tensor_parallel other than tensor_parallel needs "
                         "sequence_parallel where tensor_parallel is above 1 (each tensor-parallel "
                         "rank dispatches its part of the sequence)")
    if t > 1 and e > 1 and not sp:
        raise ValueError("expert_parallel above 1 with tensor_parallel above 1 needs "
                         "sequence_parallel (Megatron-LM's rule: each tensor-parallel rank "
                         "dispatches its part of the sequence)")
    if sp and s % t:
        raise ValueError(f"tensor_parallel must divide seq_len under sequence parallelism, got "
                         f"seq_len {s}, tensor_parallel {t}")
    width = options.element_bytes
    layers = config.sparse_layers if moe_layers is None else int(whole_in_range(
        moe_layers, "moe_layers", 0, config.sparse_layers,
        f"a whole number of MoE layers from 0 to {config.sparse_layers}"))
    m = check_positive_int(micro_batches, "micro_batches", 2**24)
    c = options.capacity_factor
    tokens = s * b // t if sp else s * b
    rows = routed_rows(config.experts, config.experts_per_token, tokens, c)
    row_bytes = config.hidden * width
    away = -(-rows * (e - 1) // e)     # exact with a capacity (X / E buffers per rank)
    counted = int(counted_etp(etp, t, sp))
    return ExpertTraffic(e, tokens, rows, rows * row_bytes if e > 1 else 0,
                         away * row_bytes, layers, m, c, counted,
                         counted * rows * row_bytes if counted > 1 else 0,
                         (counted - 1) * rows * row_bytes, options.recompute == "full")


def expert_traffic_seconds(traffic: ExpertTraffic, ic: Interconnect, stride: int = 1) -> float:
    """Seconds per step of the all-to-alls on their ring (E ranks ``stride`` apart on ``ic``):
    each call's latency plus the bytes sent at the ring's bus bandwidth; not overlapped."""
    stride = np.int64(check_positive_int(stride, "stride", MAX_GPUS))
    seconds = 0.0
    if traffic.calls:
        latency, bandwidth = ring_timing_of(ic, "all_to_all", np.int64(traffic.expert_parallel),
                                            stride)
        seconds += float(traffic.calls * latency + traffic.step_sent_bytes / bandwidth)
    if traffic.etp_calls:     # the ETP ranks are neighbours (innermost in the expert grid)
        seconds += float(traffic.etp_calls * etp_call_seconds(
            ic, np.int64(traffic.expert_tensor_parallel), traffic.etp_sent_bytes))
    return seconds


def etp_call_seconds(ic: Interconnect, etp, sent_bytes):
    """Seconds of one ETP all-gather or reduce-scatter: its latency plus the bytes a GPU sends
    at the bus bandwidth of ETP adjacent ranks (the two have the same ring cost)."""
    latency, bandwidth = ring_timing_of(ic, "all_gather", etp, np.int64(1))
    return latency + sent_bytes / bandwidth

