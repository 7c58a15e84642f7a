"""Megatron-LM's own memory estimate, reproduced as a named convention.

Source: NVIDIA Megatron-LM, ``megatron/training/theoretical_memory_usage.py`` at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (last changed in 1bcb3b9e0b02), the numbers
``--log-theoretical-memory`` prints: ``compute_weight_and_optimizer_memory``,
``compute_activation_memory`` (used with sequence parallelism and selective recomputation) and
``compute_activation_memory_without_sp`` (every other setting). Transcribed here for dense
models (no mixture of experts, no multi-token prediction, no latent attention), in exact
fractions where the original uses floats; the results are bytes.

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
transcribed from the revision of the same file that splits the routed experts over expert
parallelism (its ``expert_tensor_parallel_size``, ``expert_model_parallel_size`` and
``expert_data_parallel_size = world_size // (ETP x EP x PP)``); at the commit named above the MoE
path still charges every GPU all the experts / t and shards their optimizer over d. Per MoE layer
it counts attention, the routed experts (2 h f_moe X x 3/2 with SwiGLU), a shared expert, the
norms, the router (h X) and a shared expert's gate, and splits them three ways: tensor-parallel
(attention, shared experts, the dense layers' MLP, the embedding) over t, replicated (norms,
router, gate), and the routed experts over ETP x E; the bytes per parameter are 6 + 12 / d for
the first two and 6 + 12 / EDP for the experts under the distributed optimizer (18 without).
Latent attention and multi-token prediction are not transcribed. With p = 1 and no biases it
equals zerolib's :func:`zerolib.core.memory.expert_parallel.expert_model_state` under the
``bf16-fp32-grads`` layout (2 + 4 + 12 bytes) at ZeRO stage 1 (0 without the distributed
optimizer) to the byte where d and EDP divide the counts; at the first stage with p > 1 only
``final-norm-per-stage`` differs (h / p of the norm, in the dense part's bytes per parameter).
Not in the comparison: with dense first layers Megatron-LM divides the MoE layers by p evenly,
where zerolib counts the MoE layers each stage holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.inputs import check_flag, check_positive_int
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import model_state
from zerolib.core.memory.model_parallel import parameters_per_gpu
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

    @property
    def world_size(self) -> int:
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.data_parallel_size


def padded_vocab_size(vocab: int, tensor_parallel: int,
                      divisible_by: int = MAKE_VOCAB_SIZE_DIVISIBLE_BY) -> int:
    """Megatron-LM's ``vocab_size_with_padding``: up to a multiple of divisible_by x t."""
    multiple = check_positive_int(divisible_by, "divisible_by") * check_positive_int(
        tensor_parallel, "tensor_parallel")
    return ceil_div(check_positive_int(vocab, "vocab"), multiple) * multiple


def args_for(model, seq_len, micro_batch, tensor_parallel=1, pipeline_parallel=1, *, chunks=None,
             data_parallel=1, sequence_parallel=False, recompute=None, distributed_optimizer=False,
             vocab_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY, expert_parallel=1,
             expert_tensor_parallel=None, context_parallel=1) -> MegatronArgs:
    """The arguments a Megatron-LM run of ``model`` would have (``recompute``: None, "selective"
    or "full"; ``chunks``: the virtual pipeline size, None without interleaving; a model with
    experts also gets the MoE fields, ``expert_parallel`` and ``expert_tensor_parallel``)."""
    config: TransformerConfig = get_model(model)
    moe = {}
    if config.mixture_of_experts:
        if config.latent_attention:
            raise ValueError(f"{config.name}: latent attention's MoE path is not transcribed here")
        moe = {"num_experts": config.experts, "moe_ffn_hidden_size": config.ffn_hidden,
               "moe_router_topk": config.experts_per_token,
               "moe_shared_expert_intermediate_size": config.shared_expert_ffn or None,
               "moe_shared_expert_gate": config.shared_expert_gate,
               "moe_layer_freq": (0,) * config.dense_layers + (1,) * config.sparse_layers,
               "expert_model_parallel_size": check_positive_int(expert_parallel, "expert_parallel"),
               "expert_tensor_parallel_size": None if expert_tensor_parallel is None else
               check_positive_int(expert_tensor_parallel, "expert_tensor_parallel")}
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
        tensor_model_parallel_size=check_positive_int(tensor_parallel, "tensor_parallel"),
        pipeline_model_parallel_size=check_positive_int(pipeline_parallel, "pipeline_parallel"),
        virtual_pipeline_model_parallel_size=chunks,
        data_parallel_size=check_positive_int(data_parallel, "data_parallel"),
        swiglu=config.gated_mlp,
        normalization="RMSNorm" if config.norm == "rmsnorm" else "LayerNorm",
        untie_embeddings_and_output_weights=not config.tied_embeddings,
        sequence_parallel=check_flag(sequence_parallel, "sequence_parallel"),
        recompute_granularity=recompute,
        use_distributed_optimizer=check_flag(distributed_optimizer, "distributed_optimizer"),
        context_parallel_size=check_positive_int(context_parallel, "context_parallel"), **moe)


def _parameter_pieces(a: MegatronArgs) -> dict[str, Fraction]:
    h = a.hidden_size
    query_ratio = Fraction(a.kv_channels * a.num_attention_heads, h)
    norm_size = 1 if a.normalization == "RMSNorm" else 2
    gated = Fraction(3, 2) if a.swiglu else 1
    attention = 2 * h * h * (1 + Fraction(a.num_query_groups, a.num_attention_heads)) * query_ratio
    mlp = 2 * h * a.ffn_hidden_size * gated
    layernorm = 2 * h * norm_size
    return {"tp_sharded_in_block": (attention + mlp) * a.num_layers,
            "replicated_in_block": Fraction(layernorm * a.num_layers + norm_size * h),
            "embedding_size": Fraction(h * a.padded_vocab_size)}


def parameters_on_most_loaded_shard(a: MegatronArgs) -> Fraction:
    """``num_parameters_on_most_loaded_model_shard`` (dense): the first stage's share."""
    pieces = _parameter_pieces(a)
    t, p = a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    sharded = (pieces["tp_sharded_in_block"] / p + pieces["embedding_size"]) / t
    if a.untie_embeddings_and_output_weights and p == 1:
        sharded += pieces["embedding_size"] / t
    return sharded + pieces["replicated_in_block"] / p


def bytes_per_parameter(a: MegatronArgs) -> Fraction:
    """18 (bf16 weights, fp32 main gradients, fp32 main weights and Adam states), or
    6 + 12 / d with the distributed optimizer."""
    return Fraction(18) if not a.use_distributed_optimizer else 6 + Fraction(12, a.data_parallel_size)


def weight_and_optimizer_bytes(a: MegatronArgs) -> Fraction:
    """``compute_weight_and_optimizer_memory`` (dense models), in bytes."""
    return parameters_on_most_loaded_shard(a) * bytes_per_parameter(a)


def moe_shard_pieces(a: MegatronArgs) -> dict[str, Fraction]:
    """Parameters on the most-loaded shard of the MoE path, three ways: ``tp_sharded`` (over t),
    ``replicated`` and ``expert_sharded`` (over ETP x E); the untied output layer with p = 1 is
    in ``tp_sharded``."""
    if a.num_experts is None:
        raise ValueError("moe_shard_pieces needs a model with experts (num_experts)")
    h, t, p = a.hidden_size, a.tensor_model_parallel_size, a.pipeline_model_parallel_size
    pattern = (a.moe_layer_freq if isinstance(a.moe_layer_freq, tuple)
               else tuple(int(i % a.moe_layer_freq == 0) for i in range(a.num_layers)))
    moe_layers = sum(pattern)
    dense_layers = a.num_layers - moe_layers
    query_ratio = Fraction(a.kv_channels * a.num_attention_heads, h)
    norm_size = 1 if a.normalization == "RMSNorm" else 2
    gated = Fraction(3, 2) if a.swiglu else 1
    attention = 2 * h * h * (1 + Fraction(a.num_query_groups, a.num_attention_heads)) * query_ratio
    dense_mlp = 2 * h * a.ffn_hidden_size * gated
    shared = 2 * h * (a.moe_shared_expert_intermediate_size or 0) * gated
    routed = 2 * h * a.moe_ffn_hidden_size * a.num_experts * gated
    layernorm = 2 * h * norm_size
    router = h * a.num_experts                        # add_bias_linear False
    gate = h if a.moe_shared_expert_intermediate_size and a.moe_shared_expert_gate else 0
    embedding = h * a.padded_vocab_size
    etp = t if a.expert_tensor_parallel_size is None else a.expert_tensor_parallel_size
    tp_block = (attention + dense_mlp) * dense_layers + (attention + shared) * moe_layers
    replicated = layernorm * dense_layers + (layernorm + router + gate) * moe_layers + norm_size * h
    tp_sharded = (tp_block / p + embedding) / t
    if a.untie_embeddings_and_output_weights and p == 1:
        tp_sharded += Fraction(embedding, t)
    return {"tp_sharded": tp_sharded, "replicated": Fraction(replicated, p),
            "expert_sharded": routed * moe_layers / p / (etp * a.expert_model_parallel_size)}


def expert_data_parallel_size(a: MegatronArgs) -> int:
    """``world_size // (ETP x EP x PP)``."""
    etp = a.tensor_model_parallel_size if a.expert_tensor_parallel_size is None else a.expert_tensor_parallel_size
    return a.world_size // (etp * a.expert_model_parallel_size * a.pipeline_model_parallel_size)


def moe_weight_and_optimizer_bytes(a: MegatronArgs) -> dict[str, Fraction]:
    """The MoE path of ``compute_weight_and_optimizer_memory``: bytes of the ``dense`` part (over
    d) and the ``experts`` (over the expert-data-parallel group), and their ``total``."""
    pieces = moe_shard_pieces(a)

    def per_parameter(group: int) -> Fraction:
        return Fraction(18) if not a.use_distributed_optimizer else 6 + Fraction(12, group)

    dense = (pieces["tp_sharded"] + pieces["replicated"]) * per_parameter(a.data_parallel_size)
    experts = pieces["expert_sharded"] * per_parameter(expert_data_parallel_size(a))
    return {"dense": dense, "experts": experts, "total": dense + experts}


# Mixtral-8x7B's layouts for the MoE comparison: (t, p, d, E, ETP, distributed optimizer).
MOE_SETTINGS = ((1, 1, 8, 8, None, True), (1, 1, 16, 8, None, True), (2, 1, 8, 4, 1, True),
                (2, 1, 4, 8, 1, False), (1, 4, 8, 8, None, True))


def moe_comparison(model="mixtral-8x7b") -> pd.DataFrame:
    """Megatron-LM's MoE weights and optimizer state beside zerolib's
    (:func:`zerolib.core.memory.expert_parallel.expert_model_state`, bf16-fp32-grads, stage 1
    under the distributed optimizer else 0, Megatron-LM's padded vocabulary, the first pipeline
    stage) for each of :data:`MOE_SETTINGS`: the dense part, the experts and the total."""
    from zerolib.core.memory.expert_parallel import expert_model_state
    rows = []
    for t, p, d, e, etp, distributed in MOE_SETTINGS:
        args = args_for(model, 4096, 1, t, p, data_parallel=d, distributed_optimizer=distributed,
                        expert_parallel=e, expert_tensor_parallel=etp)
        theirs = moe_weight_and_optimizer_bytes(args)
        state = expert_model_state(model, t, p, d, 1 if distributed else 0, "bf16-fp32-grads",
                                   expert_parallel=e, expert_tensor_parallel=etp, pipeline_stage=0,
                                   vocab_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY)
        ours = {"dense": state.dense["total"], "experts": state.experts["total"], "total": state.total}
        # both at the first stage: only Megatron-LM's share of the final norm there differs
        differs = {"dense": "final-norm-per-stage" if p > 1 else "", "experts": "",
                   "total": "final-norm-per-stage" if p > 1 else ""}
        setting = f"t={t} p={p} d={d} E={e} ETP={etp or t}" + (" distributed-optimizer" if distributed else "")
        for item in ours:
            megatron = int(theirs[item])
            rows.append({"model": f"{get_model(model).name} {setting}", "item": item,
                         "megatron_bytes": megatron, "zerolib_bytes": ours[item],
                         "difference_bytes": ours[item] - megatron, "differs_by": differs[item]})
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
        args = args_for(run.model, SEQ_LEN, b, t, p, chunks=run.chunks if run.chunks > 1 else None,
                        sequence_parallel=True, recompute="selective")
        parameters = int(parameters_per_gpu(run.model, t, p, pipeline_stage=0, schedule=run.schedule,
                                            chunks=run.chunks))
        ours = {"weights and optimizer": int(model_state(parameters, 1, 0, "bf16-fp32-grads").total),
                "activations": sum(stage_activation_terms(
                    run.model, SEQ_LEN, b, t, p, 0, schedule=run.schedule, chunks=run.chunks,
                    micro_batches=run.micro_batches, sequence_parallel=True, recompute="selective",
                    dropout=True, logits_bytes=LOGITS_BYTES).values())}
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
        theirs = activation_bytes(args_for(model, seq_len, 1, tensor_parallel, sequence_parallel=True,
                                           recompute="selective", context_parallel=c))
        local = activation_bytes(args_for(model, tokens, 1, tensor_parallel, sequence_parallel=True,
                                          recompute="selective", context_parallel=c))
        ours = sum(stage_activation_terms(model, tokens, 1, tensor_parallel, sequence_parallel=True,
                                          recompute="selective", flash_attention=True,
                                          vocab_divisible_by=MAKE_VOCAB_SIZE_DIVISIBLE_BY).values())
        rows.append({"model": get_model(model).name, "seq_len": seq_len, "context_parallel": c,
                     "megatron_bytes": int(theirs), "megatron_at_local_tokens_bytes": int(local),
                     "zerolib_bytes": int(ours)})
    return pd.DataFrame(rows, columns=list(CONTEXT_PARALLEL_COLUMNS))
