"""Megatron-LM's own memory estimate, reproduced as a named convention.

Source: NVIDIA Megatron-LM (github.com/NVIDIA/Megatron-LM),
``megatron/training/theoretical_memory_usage.py`` at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22), whose file is that of its last change,
1bcb3b9e0b02 (2026-06-16, "Fix LatentMoE theoretical memory estimate"); the split of the routed
experts over expert parallelism first appears in a7c9e8c44ae8 (2026-05-13). The numbers
``--log-theoretical-memory`` prints: ``compute_weight_and_optimizer_memory`` (dense, MoE,
multi-token prediction, latent attention, latent MoE), ``compute_activation_memory`` (used
with sequence parallelism and selective recomputation) and
``compute_activation_memory_without_sp`` (every other setting), in exact fractions where the
original uses floats; the results are bytes (parameters for :func:`parameter_counts`).

Where Megatron-LM's estimate counts differently from zerolib (each is named, and
``tests/crosscheck/test_megatron_theoretical_memory.py`` shows the two agree once these are accounted for):

``final-norm-per-stage``
    the final norm is part of the "transformer block", which is divided by p: every stage is
    charged norm_size x h / p of it; zerolib puts it on the last stage.
``no-linear-biases``
    the attention and MLP terms have no biases (``add_bias_linear`` is ignored) and there is
    no learned position embedding; zerolib counts both (GPT-2 and the paper's GPTs have them).
``first-stage-only``
    the most-loaded shard is taken to be the first stage; zerolib takes the larger of the first
    and last (an untied output layer plus the final norm outweigh the embedding).
``padded-vocabulary``
    the vocabulary is padded to a multiple of ``make_vocab_size_divisible_by`` x t (128 x t by
    default); zerolib pads only when asked (``vocab_divisible_by``).
``token-ids``
    the activations include 8 bytes per token for the embedding's input (int64 ids, p
    micro-batches in flight), divided by t like everything else; zerolib leaves them out.
``per-layer-formula``
    with sequence parallelism a layer is sbh(18 + 4 ffn/h) (34 sbh for an MLP of 4h: Table 2 of
    Korthikanti et al. with dropout, no gate, no grouped-query attention); zerolib counts each
    saved tensor of the actual block. Without sequence parallelism it is sbh(10 + 24/t) per
    layer whatever the recomputation (no attention scores), and the total is *not* divided by t.
``embedding-dropout``
    the embedding's dropout mask (sbh per micro-batch) is counted whether or not the model uses
    dropout; zerolib counts it only with dropout.
``interleave-penalty``
    under the interleaved schedule every term, the embedding's included, is scaled by
    1 + (p - 1)/(p v); zerolib scales the layers by the same factor (an exact count of chunk
    passes) and holds the embedding's activations for min(2p, m) micro-batches.
``output-terms``
    with p = 1, sequence parallelism: 4sbh(1 + V/h) / t (final norm and output layer inputs in
    2 bytes, fp32 logits); without it 2(sbV/t + sbh): the logits in 2 bytes and one sbh tensor.
``overhead-5-percent``
    without sequence parallelism the total is multiplied by 1.05, "buffer for optimizer and
    miscellaneous temporaries".
``recompute-transient``
    under selective recomputation zerolib also counts the attention tensors of the one layer
    rebuilt in backward (5 a s^2 b / t); the estimate leaves them out.
``no-context-parallel``
    the estimate never reads ``context_parallel_size``: its activations are those of all
    ``seq_length`` tokens, C times what a CP rank keeps of a sequence (s / C tokens, every
    term proportional to them: :func:`zerolib.core.memory.activations.context_parallel_tokens`);
    zerolib divides. With ``seq_length`` = s / C the formula gives what a CP rank keeps, up to
    the conventions above (:func:`context_parallel_comparison`).
``optimizer-over-d``
    with the distributed optimizer it charges 6 + 12 / d bytes per parameter, d =
    ``data_parallel_size`` = world / (t p C) (``arguments.py`` ``validate_args``); the optimizer
    shards over the d x C GPUs of ``get_data_parallel_group(with_context_parallel=True)``, as
    zerolib's ZeRO group does: 6 + 12 / (d C).

:func:`comparison` sets the estimate beside zerolib's for Korthikanti et al.'s four GPTs
(``zerolib crosscheck`` prints it).

**The mixture-of-experts path** (:func:`moe_weight_and_optimizer_bytes`, :func:`moe_comparison`):
per MoE layer the file counts attention, the routed experts (2 h f_moe X x 3/2 with SwiGLU), a
shared expert, the norms, the router (h X, + X with ``add_bias_linear``) and a shared expert's
gate, and splits them three ways: tensor-parallel (attention, shared experts, the dense layers'
MLP, the embedding) over t, replicated (norms, router, gate, a latent MoE's projections), and
the routed experts over ETP x E (``expert_data_parallel_size = world_size // (ETP x EP x PP)``,
world = t p d C); the bytes per parameter are 6 + 12 / d for the first two and 6 + 12 / EDP for
the experts under the distributed optimizer (18 without). With p = 1 and no biases it equals
zerolib's :func:`zerolib.core.memory.expert_parallel.expert_model_state` under the
``bf16-fp32-grads`` layout (2 + 4 + 12 bytes) at ZeRO stage 1 (0 without the distributed
optimizer) to the byte where d and EDP divide the counts; at the first stage with p > 1 only
``final-norm-per-stage`` differs (h / p of the norm, in the dense part's bytes per parameter).
Not in the comparison: with dense first layers Megatron-LM divides the MoE layers by p evenly,
where zerolib counts the MoE layers each stage holds.

**Latent attention** (``multi_latent_attention``, DeepSeek-V2/V3): ``self_attn_term`` is
q_lora_rank (h + heads (qk_head_dim + qk_pos_emb_head_dim) + norm) (or h heads (qk_head_dim +
qk_pos_emb_head_dim) without q_lora_rank), plus kv_lora_rank (h + heads (qk_head_dim +
v_head_dim) + norm), plus h qk_pos_emb_head_dim, plus heads v_head_dim h: transformers'
``DeepseekV3Attention`` module by module (with RMSNorm, norm = 1), so :func:`parameter_counts`
equals :func:`zerolib.core.catalogue.models.parameter_count` and ``active_parameter_count`` to
the parameter (:func:`parameter_comparison`; DeepSeek-V3: 671,026,404,352, the report's 671B,
37.6B active, its 37B). One difference per GPU, ``latent-down-over-t``: the file divides all of
``self_attn_term`` by t, zerolib keeps the down projections and their norms whole on every
tensor-parallel rank (:func:`latent_down_parameters`; they are small and feed every head).

**What zerolib's models cannot hold.** ``mtp_num_layers`` (``args_for(..., mtp_layers=...)``): the file
counts each multi-token-prediction layer as one more layer like the last (a MoE layer for
DeepSeek-V3: 11,507,286,016 parameters), whole on the most-loaded shard; the comparisons name it
``mtp-layers``. (DeepSeek's published 14B MTP module also holds its projection, 2h x h, two
norms and, in the checkpoint, copies of the embedding and output head, which the file leaves
out.) A latent MoE (``moe_latent_size``: the routed experts on a projected-down width, two h x
latent projections beside them) and a router bias (``add_bias_linear`` with experts; Megatron-LM's
default is True, zerolib's routers have none) are transcribed in :func:`parameter_counts` and
refused by :func:`check_zerolib_expressible`, which every comparison calls.

**Activations.** Neither activation function reads experts or latent attention: every layer is
charged as a dense layer of ``ffn_hidden_size`` with h-wide attention (the file's TODO says
so), so a MoE or MLA model's activations are not reconciled here; zerolib's own are in
:mod:`zerolib.core.memory.activations` (latent attention, the routed tokens at a capacity
factor).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.inputs import check_flag, check_positive_int
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import get_layout, model_state
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.memory.model_parallel import Pipeline, parameters_per_gpu
from zerolib.core.memory.pipeline_schedule import stage_activation_terms
from zerolib.crosscheck.korthikanti import LOGITS_BYTES, RUNS, SEQ_LEN

COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128   # megatron/training/arguments.py default
OVERHEAD = Fraction(105, 100)        # compute_activation_memory_without_sp, step 9
COMPARISON_COLUMNS = ("model", "item", "megatron_bytes", "zerolib_bytes", "difference_bytes",
                      "differs_by")


@dataclass(frozen=True)
class MegatronArgs:
    """The ``args`` fields the estimate reads (names as in Megatron-LM)."""

    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    padded_vocab_size: int
    seq_length: int
    micro_batch_size: int
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    data_parallel_size: int = 1
    swiglu: bool = False
    normalization: str = "LayerNorm"
    untie_embeddings_and_output_weights: bool = False
    sequence_parallel: bool = False
    recompute_granularity: str | None = None
    use_distributed_optimizer: bool = False
    context_parallel_size: int = 1      # read by Megatron-LM's arguments, not by the estimate
    # The mixture-of-experts fields (None: a dense model).
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    moe_shared_expert_gate: bool = False
    moe_layer_freq: tuple[int, ...] | int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None    # None: tensor_model_parallel_size
    # Megatron-LM's default is True; the file reads it only for the router's bias, and
    # args_for gives False (zerolib's routers have no bias: check_zerolib_expressible).
    add_bias_linear: bool = False
    mtp_num_layers: int | None = None       # multi-token prediction layers (None: none)
    moe_latent_size: int | None = None      # latent MoE: the routed experts' width (None: h)
    # Multi-head latent attention (DeepSeek-V2/V3).
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None          # None: queries projected directly
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None          # a query/key head without its rotary part
    qk_pos_emb_head_dim: int | None = None  # the rotary part
    v_head_dim: int | None = None

    @property
    def world_size(self) -> int:
        """t x p x d x C (``validate_args``: d = world / (t x p x C))."""
        return (self.tensor_model_parallel_size * self.pipeline_model_parallel_size
                * self.data_parallel_size * self.context_parallel_size)


def padded_vocab_size(vocab: int, tensor_parallel: int,
                      divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron-LM's ``vocab_size_with_padding``: up to a multiple of divisible_by x t."""
    multiple = check_positive_int(divisible_by, "divisible_by") * check_positive_int(
        tensor_parallel, "tensor_parallel")
    return ceil_div(check_positive_int(vocab, "vocab"), multiple) * multiple


@dataclass(frozen=True)
class ParallelFlags:
    """The parallel flags of a Megatron-LM launch, checked when made:
    ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, the virtual pipeline
    size (``chunks``; None without interleaving), the data-parallel size,
    ``--sequence-parallel``, ``--context-parallel-size``, ``--expert-model-parallel-size`` and
    ``--expert-tensor-parallel-size`` (None: the tensor-parallel size)."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    chunks: int | None = None
    data_parallel: int = 1
    sequence_parallel: bool = False
    context_parallel: int = 1
    expert_parallel: int = 1
    expert_tensor_parallel: int | None = None

    def __post_init__(self):
        for name in ("tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel",
                     "expert_parallel"):
            object.__setattr__(self, name, check_positive_int(getattr(self, name), name))
        for name in ("chunks", "expert_tensor_parallel"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_positive_int(getattr(self, name), name))
        check_flag(self.sequence_parallel, "sequence_parallel")


def args_for(model, seq_len, micro_batch, parallel: ParallelFlags = ParallelFlags(), *,
             recompute=None, distributed_optimizer=False,
             vocab_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY, mtp_layers=None) -> MegatronArgs:
    """The arguments a Megatron-LM run of ``model`` would have under ``parallel`` (its
    :class:`ParallelFlags`; ``recompute``: None, "selective" or "full"; a model with experts
    also gets the MoE fields, the expert-parallel and expert-tensor-parallel sizes among them;
    one with latent attention the MLA fields; ``mtp_layers``: Megatron-LM's
    ``--mtp-num-layers``, which zerolib's models do not hold)."""
    config: TransformerConfig = get_model(model)
    if not isinstance(parallel, ParallelFlags):
        raise TypeError(f"parallel must be a ParallelFlags, got {type(parallel).__name__}")
    tensor_parallel = parallel.tensor_parallel
    extra = {}
    if config.latent_attention:
        if config.kv_heads != config.heads:     # the file asserts not group_query_attention
            raise ValueError(f"{config.name}: latent attention with grouped-query attention "
                             f"(kv_heads {config.kv_heads} of {config.heads} heads) is not a "
                             "Megatron-LM setting")
        extra.update(multi_latent_attention=True, q_lora_rank=config.q_lora_rank or None,
                   kv_lora_rank=config.kv_lora_rank, qk_head_dim=config.head_width,
                   qk_pos_emb_head_dim=config.rope_head_dim, v_head_dim=config.v_head_dim)
    if mtp_layers is not None:
        extra["mtp_num_layers"] = check_positive_int(mtp_layers, "mtp_layers")
    if config.mixture_of_experts:
        extra |= {"num_experts": config.experts, "moe_ffn_hidden_size": config.ffn_hidden,
               "moe_router_topk": config.experts_per_token,
               "moe_shared_expert_intermediate_size": config.shared_expert_ffn or None,
               "moe_shared_expert_gate": config.shared_expert_gate,
               "moe_layer_freq": (0,) * config.dense_layers + (1,) * config.sparse_layers,
               "expert_model_parallel_size": parallel.expert_parallel,
               "expert_tensor_parallel_size": parallel.expert_tensor_parallel}
    if recompute not in (None, "selective", "full"):
        raise ValueError(f"recompute must be None, 'selective' or 'full', got {recompute!r}")
    return MegatronArgs(
        hidden_size=config.hidden,
        ffn_hidden_size=config.dense_ffn_hidden if config.dense_layers else config.ffn_hidden,
        num_layers=config.layers,
        num_attention_heads=config.heads, num_query_groups=config.kv_heads,
        kv_channels=config.head_width,
        padded_vocab_size=padded_vocab_size(config.vocab, tensor_parallel, vocab_divisible_by),
        seq_length=check_positive_int(seq_len, "seq_len"),
        micro_batch_size=check_positive_int(micro_batch, "micro_batch"),
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=parallel.pipeline_parallel,
        virtual_pipeline_model_parallel_size=parallel.chunks,
        data_parallel_size=parallel.data_parallel,
        swiglu=config.gated_mlp,
        normalization="RMSNorm" if config.norm == "rmsnorm" else "LayerNorm",
        untie_embeddings_and_output_weights=not config.tied_embeddings,
        sequence_parallel=parallel.sequence_parallel,
        recompute_granularity=recompute,
        use_distributed_optimizer=check_flag(distributed_optimizer, "distributed_optimizer"),
        context_parallel_size=parallel.context_parallel, **extra)


def _attention_parameters(a: MegatronArgs, norm_size: int) -> Fraction:
    """``self_attn_term``: the latent attention branch (``multi_latent_attention``) or the
    grouped-query one."""
    h = a.hidden_size
    if a.multi_latent_attention:
        missing = [name for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
                   if getattr(a, name) is None]
        if missing:
            raise ValueError(f"multi_latent_attention needs {', '.join(missing)} (whole numbers)")
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        if a.q_lora_rank is None:
            q_term = h * a.num_attention_heads * qk
        else:       # q lora + rope + q norm
            q_term = a.q_lora_rank * (h + a.num_attention_heads * qk + norm_size)
        return Fraction(q_term
                        # kv lora + rope + kv norm
                        + a.kv_lora_rank * (h + a.num_attention_heads * (a.qk_head_dim + a.v_head_dim)
                                            + norm_size)
                        + h * a.qk_pos_emb_head_dim
                        + a.num_attention_heads * a.v_head_dim * h)     # o proj
    query_ratio = Fraction(a.kv_channels * a.num_attention_heads, h)
    return 2 * h * h * (1 + Fraction(a.num_query_groups, a.num_attention_heads)) * query_ratio


def _terms(a: MegatronArgs) -> dict[str, Fraction]:
    """The named quantities of ``compute_weight_and_optimizer_memory`` (parameters)."""
    h, layers = a.hidden_size, a.num_layers
    experts = a.num_experts is not None
    if not experts:
        pattern = (0,) * layers
    elif isinstance(a.moe_layer_freq, tuple):
        pattern = a.moe_layer_freq
        if len(pattern) != layers:
            raise ValueError(f"moe_layer_freq must have num_layers ({layers}) entries, got {len(pattern)}")
    else:
        pattern = tuple(int(i % a.moe_layer_freq == 0) for i in range(layers))
    mtp = a.mtp_num_layers or 0
    norm_size = 1 if a.normalization == "RMSNorm" else 2
    gated = Fraction(3, 2) if a.swiglu else 1
    # Latent MoE: the routed experts work on moe_latent_size, with projections down and back.
    routed_width = a.moe_latent_size if a.moe_latent_size is not None else h
    moe_ffn = a.moe_ffn_hidden_size if experts else 0
    shared_ffn = a.moe_shared_expert_intermediate_size or 0
    t = {"moe_layers": sum(pattern), "dense_layers": layers - sum(pattern),
         "mtp_moe_layers": pattern[-1] * mtp, "mtp_dense_layers": (1 - pattern[-1]) * mtp,
         "attention": _attention_parameters(a, norm_size),
         "dense_mlp": 2 * h * a.ffn_hidden_size * gated,
         "shared_expert": 2 * h * shared_ffn * gated,
         "routed_experts": 2 * routed_width * moe_ffn * (a.num_experts or 1) * gated,
         "active_routed_experts": 2 * routed_width * moe_ffn * a.moe_router_topk * gated if experts else 0,
         "latent_projection": 2 * h * a.moe_latent_size if experts and a.moe_latent_size is not None else 0,
         "layernorm": 2 * h * norm_size,
         "router": h * a.num_experts + (a.num_experts if a.add_bias_linear else 0) if experts else 0,
         "shared_expert_gate": h if shared_ffn > 0 and a.moe_shared_expert_gate else 0,
         "embedding": h * a.padded_vocab_size, "final_layernorm": norm_size * h}
    return {k: Fraction(v) for k, v in t.items()}


def parameter_counts(a: MegatronArgs) -> dict[str, Fraction]:
    """The file's ``num_parameters_in_transformer_block``, ``..._in_mtp_block``,
    ``..._in_embedding_layers``, ``num_total_parameters`` and ``num_active_parameters``
    (keys ``transformer_block``, ``mtp_block``, ``embedding_layers``, ``total``, ``active``)."""
    t = _terms(a)
    common = t["attention"] + t["shared_expert"] + t["latent_projection"] + t["layernorm"] \
        + t["router"] + t["shared_expert_gate"]
    dense_layer = t["attention"] + t["dense_mlp"] + t["layernorm"]
    moe_layer, active_moe_layer = common + t["routed_experts"], common + t["active_routed_experts"]
    block = dense_layer * t["dense_layers"] + moe_layer * t["moe_layers"] + t["final_layernorm"]
    active_block = dense_layer * t["dense_layers"] + active_moe_layer * t["moe_layers"] + t["final_layernorm"]
    mtp = dense_layer * t["mtp_dense_layers"] + moe_layer * t["mtp_moe_layers"]
    embedding = t["embedding"] * (2 if a.untie_embeddings_and_output_weights else 1)
    return {"transformer_block": block, "mtp_block": mtp, "embedding_layers": embedding,
            "total": block + mtp + embedding, "active": active_block + mtp + embedding}


def _shard_pieces(a: MegatronArgs) -> dict[str, Fraction]:
    """The most-loaded shard's parameters split as the file splits them (any model)."""
    t = _terms(a)
    tp, p = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    etp = tp if a.expert_tensor_parallel_size is None else a.expert_tensor_parallel_size
    replicated_moe = t["layernorm"] + t["latent_projection"] + t["router"] + t["shared_expert_gate"]
    tp_block = ((t["attention"] + t["dense_mlp"]) * t["dense_layers"]
                + (t["attention"] + t["shared_expert"]) * t["moe_layers"])
    replicated_block = t["layernorm"] * t["dense_layers"] + replicated_moe * t["moe_layers"] + t["final_layernorm"]
    tp_mtp = ((t["attention"] + t["dense_mlp"]) * t["mtp_dense_layers"]
              + (t["attention"] + t["shared_expert"]) * t["mtp_moe_layers"])
    replicated_mtp = t["layernorm"] * t["mtp_dense_layers"] + replicated_moe * t["mtp_moe_layers"]
    # The most loaded shard: 1/p of the block's layers, the whole MTP block, one embedding.
    tp_sharded = (tp_block / p + tp_mtp + t["embedding"]) / tp
    if a.untie_embeddings_and_output_weights and p == 1:
        tp_sharded += t["embedding"] / tp
    return {"tp_sharded": tp_sharded, "replicated": replicated_block / p + replicated_mtp,
            "expert_sharded": (t["routed_experts"] * t["moe_layers"] / p
                               + t["routed_experts"] * t["mtp_moe_layers"])
            / (etp * a.expert_model_parallel_size)}


def parameters_on_most_loaded_shard(a: MegatronArgs) -> Fraction:
    """``num_parameters_on_most_loaded_model_shard``: the first stage's share."""
    return sum(_shard_pieces(a).values(), Fraction(0))


def bytes_per_parameter(a: MegatronArgs) -> Fraction:
    """18 (bf16 weights, fp32 main gradients, fp32 main weights and Adam states), or
    6 + 12 / d with the distributed optimizer."""
    return Fraction(18) if not a.use_distributed_optimizer else 6 + Fraction(12, a.data_parallel_size)


def weight_and_optimizer_bytes(a: MegatronArgs) -> Fraction:
    """``compute_weight_and_optimizer_memory``, in bytes (any model; for one with experts the
    same as :func:`moe_weight_and_optimizer_bytes`'s total)."""
    return _weight_and_optimizer(a)["total"]


def moe_shard_pieces(a: MegatronArgs) -> dict[str, Fraction]:
    """Parameters on the most-loaded shard of the MoE path, three ways: ``tp_sharded`` (over t),
    ``replicated`` and ``expert_sharded`` (over ETP x E); the untied output layer with p = 1 is
    in ``tp_sharded``."""
    if a.num_experts is None:
        raise ValueError("moe_shard_pieces needs a model with experts (num_experts)")
    return _shard_pieces(a)


def expert_data_parallel_size(a: MegatronArgs) -> int:
    """``world_size // (ETP x EP x PP)``."""
    etp = a.tensor_model_parallel_size if a.expert_tensor_parallel_size is None else a.expert_tensor_parallel_size
    return a.world_size // (etp * a.expert_model_parallel_size * a.pipeline_model_parallel_size)


def _weight_and_optimizer(a: MegatronArgs) -> dict[str, Fraction]:
    pieces = _shard_pieces(a)

    def per_parameter(group: int) -> Fraction:
        return Fraction(18) if not a.use_distributed_optimizer else 6 + Fraction(12, group)

    dense = (pieces["tp_sharded"] + pieces["replicated"]) * per_parameter(a.data_parallel_size)
    experts = pieces["expert_sharded"] * per_parameter(expert_data_parallel_size(a))
    return {"dense": dense, "experts": experts, "total": dense + experts}


def moe_weight_and_optimizer_bytes(a: MegatronArgs) -> dict[str, Fraction]:
    """The MoE path of ``compute_weight_and_optimizer_memory``: bytes of the ``dense`` part (over
    d) and the ``experts`` (over the expert-data-parallel group), and their ``total``."""
    moe_shard_pieces(a)      # refuses a dense model
    return _weight_and_optimizer(a)


def check_zerolib_expressible(a: MegatronArgs) -> MegatronArgs:
    """``a`` unchanged if zerolib's models can hold what it describes; else a ValueError naming
    the field: a latent MoE (``moe_latent_size``), a router with a bias (``add_bias_linear``
    with experts). Multi-token prediction is not refused: the comparisons name it."""
    if a.moe_latent_size is not None:
        raise ValueError(f"moe_latent_size {a.moe_latent_size}: a latent mixture of experts (routed "
                         "experts on a projected-down width); zerolib's models cannot express it")
    if a.num_experts is not None and a.add_bias_linear:
        raise ValueError("add_bias_linear with num_experts: a router with a bias; zerolib's routers "
                         "have none (give add_bias_linear=False)")
    return a


# Mixtral-8x7B's layouts for the MoE comparison: (t, p, d, E, ETP, distributed optimizer).
MOE_SETTINGS = ((1, 1, 8, 8, None, True), (1, 1, 16, 8, None, True), (2, 1, 8, 4, 1, True),
                (2, 1, 4, 8, 1, False), (1, 4, 8, 8, None, True))
# DeepSeek-V3's (latent attention, a shared expert, three dense first layers), p = 1: at
# p > 1 Megatron-LM spreads the dense layers over the stages evenly, zerolib puts them first.
MLA_SETTINGS = ((1, 1, 64, 64, None, True), (1, 1, 256, 32, None, True), (2, 1, 32, 64, 1, True),
                (4, 1, 16, 8, 4, False))


def latent_down_parameters(config: TransformerConfig) -> int:
    """Per layer, what zerolib keeps whole on every tensor-parallel rank of latent attention
    (:data:`~zerolib.core.memory.model_parallel.MODULE_SPLITS`: the query and key/value down
    projections and their norms) and the file divides by t with the rest of ``self_attn_term``
    (``latent-down-over-t``): q_lora_rank (h + 1) + kv_lora_rank (h + 1) + h x rope_head_dim."""
    h = config.hidden
    return (config.q_lora_rank * (h + 1) + config.kv_lora_rank * (h + 1)
            + h * config.rope_head_dim)


def moe_comparison(model="mixtral-8x7b", settings=None) -> pd.DataFrame:
    """Megatron-LM's MoE weights and optimizer state beside zerolib's
    (:func:`zerolib.core.memory.expert_parallel.state_of` of the first stage's
    :func:`~zerolib.core.memory.expert_parallel.stage_parameters`, bf16-fp32-grads, stage 1
    under the distributed optimizer else 0, Megatron-LM's padded vocabulary, the first pipeline
    stage) for each setting (t, p, d, E, ETP, distributed optimizer; None: :data:`MOE_SETTINGS`):
    the dense part, the experts and the total, each difference named (``final-norm-per-stage``;
    ``latent-down-over-t``: :func:`latent_down_parameters` x (1 - 1/t) x layers more for zerolib)."""
    from zerolib.core.memory.expert_parallel import check_expert_layout, stage_parameters, state_of
    config = get_model(model)
    rows = []
    for t, p, d, e, etp, distributed in MOE_SETTINGS if settings is None else settings:
        flags = ParallelFlags(t, p, data_parallel=d, expert_parallel=e, expert_tensor_parallel=etp)
        args = check_zerolib_expressible(args_for(config, 4096, 1, flags,
                                                  distributed_optimizer=distributed))
        theirs = moe_weight_and_optimizer_bytes(args)
        groups = check_expert_layout(config, t, p, d, e, etp)
        first = stage_parameters(config, groups, 0, vocab_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY)
        state = state_of(groups, first, 1 if distributed else 0, get_layout("bf16-fp32-grads"))
        ours = {"dense": state.dense["total"], "experts": state.experts["total"], "total": state.total}
        # both at the first stage: only Megatron-LM's share of the final norm there differs,
        # and with latent attention at t > 1 the down projections it divides by t
        named = " ".join(n for n, on in (("final-norm-per-stage", p > 1),
                                         ("latent-down-over-t", config.latent_attention and t > 1)) if on)
        differs = {"dense": named, "experts": "", "total": named}
        setting = f"t={t} p={p} d={d} E={e} ETP={etp or t}" + (" distributed-optimizer" if distributed else "")
        for item in ours:
            megatron = int(theirs[item])
            rows.append({"model": f"{config.name} {setting}", "item": item,
                         "megatron_bytes": megatron, "zerolib_bytes": ours[item],
                         "difference_bytes": ours[item] - megatron, "differs_by": differs[item]})
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))


def parameter_comparison(model="mixtral-8x7b", *, mtp_layers=None) -> pd.DataFrame:
    """The file's ``num_total_parameters`` and ``num_active_parameters`` (t = 1, so no padding
    beyond 128) beside zerolib's :func:`~zerolib.core.catalogue.models.parameter_count` and
    :func:`~zerolib.core.catalogue.models.active_parameter_count`. ``mtp_layers``: Megatron-LM
    counts that many more layers like the last one (``mtp-layers``; DeepSeek-V3 trains with 1),
    which zerolib's models do not hold."""
    from zerolib.core.catalogue.models import active_parameter_count, parameter_count
    config = get_model(model)
    args = check_zerolib_expressible(args_for(config, 4096, 1, mtp_layers=mtp_layers))
    theirs = parameter_counts(args)
    padded = args.padded_vocab_size != config.vocab
    differs = " ".join(n for n, on in (("padded-vocabulary", padded), ("mtp-layers", mtp_layers))
                       if on)
    rows = []
    for item, ours in (("total", parameter_count(config)), ("active", active_parameter_count(config))):
        megatron = int(theirs[item])
        rows.append({"model": config.name, "item": f"{item} parameters", "megatron_bytes": megatron,
                     "zerolib_bytes": ours, "difference_bytes": ours - megatron, "differs_by": differs})
    # counts, not bytes: the columns are the comparison tables' own
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))


def _pipeline_factor(a: MegatronArgs, num_microbatches: int | None) -> Fraction:
    p, v = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size
    if v is not None:
        return 1 + Fraction(p - 1, p * v)
    if p > 1 and num_microbatches is not None:
        return min(Fraction(1), Fraction(num_microbatches, p))
    return Fraction(1)


def activation_bytes(a: MegatronArgs, num_microbatches: int | None = None) -> Fraction:
    """What ``report_theoretical_memory`` uses: ``compute_activation_memory`` under sequence
    parallelism with selective recomputation, else ``compute_activation_memory_without_sp``."""
    s, b, h = a.seq_length, a.micro_batch_size, a.hidden_size
    t, p = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    embedding = 8 * s * b * p + s * b * h * p            # token ids, embedding dropout
    if a.sequence_parallel and a.recompute_granularity == "selective":
        memory = s * b * h * (18 + 4 * Fraction(a.ffn_hidden_size, h)) * a.num_layers + embedding
        memory *= _pipeline_factor(a, num_microbatches)
        if p == 1:
            memory += s * b * h * 4 * (1 + Fraction(a.padded_vocab_size, h))
        return memory / t
    memory = s * b * h * (10 + Fraction(24, t)) * a.num_layers + embedding
    memory *= _pipeline_factor(a, num_microbatches)
    if p == 1:
        memory += (Fraction(s * b * a.padded_vocab_size, t) + s * b * h) * 2
    return memory * OVERHEAD


def comparison() -> pd.DataFrame:
    """Korthikanti et al.'s four GPTs as they ran (Table 3: sequence parallelism, selective
    recomputation, their schedule): per GPU of the first pipeline stage, Megatron-LM's weights
    and optimizer state and its activations beside zerolib's, in bytes (Megatron-LM's rounded
    down to whole bytes), with the conventions that make them differ."""
    rows = []
    for name, run in RUNS.items():
        t, p, b = run.tensor_parallel, run.pipeline_parallel, run.micro_batch
        flags = ParallelFlags(t, p, chunks=run.chunks if run.chunks > 1 else None,
                              sequence_parallel=True)
        args = args_for(run.model, SEQ_LEN, b, flags, recompute="selective")
        parameters = int(parameters_per_gpu(run.model, t, p, pipeline_stage=0, schedule=run.schedule,
                                            chunks=run.chunks))
        ours = {"weights and optimizer": int(model_state(parameters, 1, 0, "bf16-fp32-grads").total),
                "activations": sum(stage_activation_terms(
                    run.model, SEQ_LEN, b, t, Pipeline(p, run.schedule, run.chunks, run.micro_batches),
                    0, ActivationOptions(sequence_parallel=True, recompute="selective", dropout=True,
                                         logits_bytes=LOGITS_BYTES)).values())}
        theirs = {"weights and optimizer": weight_and_optimizer_bytes(args),
                  "activations": activation_bytes(args, run.micro_batches)}
        # The named conventions (above) behind each difference; zerolib also keeps the layer
        # selective recomputation rebuilds in backward (its recompute_transient term).
        differs_by = {"weights and optimizer": "no-linear-biases" + (" final-norm-per-stage" if p > 1 else ""),
                      "activations": "token-ids embedding-dropout"
                                     + (" interleave-penalty" if run.chunks > 1 else "")
                                     + " recompute-transient"}
        for item in ours:
            megatron = int(theirs[item])
            rows.append({"model": name, "item": item, "megatron_bytes": megatron,
                         "zerolib_bytes": ours[item], "difference_bytes": ours[item] - megatron,
                         "differs_by": differs_by[item]})
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))


CONTEXT_PARALLEL_COLUMNS = ("model", "seq_len", "context_parallel", "megatron_bytes",
                            "megatron_at_local_tokens_bytes", "zerolib_bytes")


def context_parallel_comparison(model="llama-2-70b", seq_len=32_768, tensor_parallel=8,
                                context_parallel=(1, 2, 4, 8)) -> pd.DataFrame:
    """Activations per GPU (p = 1, sequence parallelism, selective recomputation, the estimate's
    own setting) at each CP degree: Megatron-LM's estimate as it is (``no-context-parallel``:
    the same at every C), the estimate at s / C tokens, and zerolib's, which divides by C; the
    last two differ by the conventions of :func:`comparison` (token ids, the layer formula,
    the logits' widths, the recomputed layer), at each C by 1 / C of their difference at C = 1."""
    from zerolib.core.memory.activations import context_parallel_tokens
    rows = []
    for c in context_parallel:
        tokens = context_parallel_tokens(seq_len, c)
        flags = ParallelFlags(tensor_parallel, sequence_parallel=True, context_parallel=c)
        theirs = activation_bytes(args_for(model, seq_len, 1, flags, recompute="selective"))
        local = activation_bytes(args_for(model, tokens, 1, flags, recompute="selective"))
        ours = sum(stage_activation_terms(
            model, tokens, 1, tensor_parallel,
            options=ActivationOptions(sequence_parallel=True, recompute="selective",
                                      flash_attention=True),
            vocab_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY).values())
        rows.append({"model": get_model(model).name, "seq_len": seq_len, "context_parallel": c,
                     "megatron_bytes": int(theirs), "megatron_at_local_tokens_bytes": int(local),
                     "zerolib_bytes": int(ours)})
    return pd.DataFrame(rows, columns=list(CONTEXT_PARALLEL_COLUMNS))
