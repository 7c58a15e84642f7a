"""Activations saved for the backward pass, term by term (Korthikanti et al., MLSys 2023).

Source: V. Korthikanti, J. Casper, S. Lym, L. McAfee, M. Andersch, M. Shoeybi, B. Catanzaro,
"Reducing Activation Recomputation in Large Transformer Models", MLSys 2023, arXiv 2205.05198.
Sec. 4.1 lists what one GPT block stores (16-bit activations, 1-byte dropout masks, MLP of 4h);
Table 2 sums it per layer, with s = sequence length, b = micro-batch, h = hidden, a = heads,
t = tensor-parallel degree:

    no parallelism                        sbh (34 + 5as/h)
    tensor parallel                       sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel            sbh (34/t + 5as/(ht))
    tensor parallel + selective recompute sbh (10 + 24/t)
    tensor + sequence + selective         sbh (34/t)
    full recomputation                    2 sbh

Here every one of those bytes is a named term whose width is a parameter (``element_bytes`` for
activations, ``mask_bytes`` for dropout masks), so the same list also covers gated MLPs
(SwiGLU with inner size f), grouped-query attention (narrower K and V), models trained without
dropout, and flash-style attention, which stores no s x s matrix: only the output (already
counted as the output projection's input) and one fp32 log-sum-exp per head and token.

Conventions and what is left out:
- Bytes are per tensor-parallel rank (the most-loaded one: a split tensor holds ceil(n / t)).
- Without sequence parallelism the norm inputs, the dropout masks after attention and MLP, and
  the inputs of the QKV and first MLP projections are replicated on every tensor-parallel rank
  (the paper's "10"); with it they are split along the sequence.
- Grouped-query attention: K and V are kv_heads x head_dim wide; a rank holds its share of
  the key/value heads, but at least one (with fewer heads than ranks they are replicated).
- Per-token norm statistics (mean / reciprocal std, fp32) are ignored, as in the paper.
- A head width of its own (``head_dim``, Gemma-2: 256 on a hidden size of 3,584 with 16 heads):
  Q and the attention output projection's input are heads x head_dim wide, K and V kv_heads x
  head_dim; the s x s terms do not depend on it. Without ``head_dim``, hidden / heads.
- Norms after attention and after the MLP (``post_norms``, Gemma-2's four RMSNorms per layer):
  each saves its input, the attention output projection's output and the MLP's output (s x b x h
  each, replicated across tensor-parallel ranks unless sequence parallelism splits them).
- Mixture of experts (``experts`` > 0, ``experts_per_token`` = k): routing with a capacity factor
  of 1 and no token dropped, so each token passes through exactly k experts and each of them saves
  for that token what a dense MLP saves. Per token that is the MLP's input (the router's input,
  saved by the router's matmul, as in a dense layer), the router's probabilities (the softmax over
  the experts' logits, kept in fp32 as Mixtral computes them: 4 B x experts), the k copies of the
  input dispatched to the experts (their first projections save them), the expert MLP's f-wide
  tensors k times, and the k expert outputs (weighting them by the routing probabilities saves
  them for the probabilities' gradient). So the MLP's f-wide terms scale by k. Left out, like the
  norm statistics: the k routing weights and expert indices per token. Under tensor parallelism
  each expert's f-wide tensors are split as a dense MLP's (expert tensor parallelism equal to the
  tensor-parallel degree); expert parallelism, which gives each rank whole experts, is not
  modelled.
- Expert tensor parallelism other than t (``expert_tensor_parallel`` = ETP, Megatron-LM's
  ``--expert-tensor-parallel-size``; None: t, the count above): Megatron-LM's alltoall dispatcher
  (``token_dispatcher.py`` at d98e8a64, ``tp_group = pg_collection.expt_tp``) all-gathers the rows
  a rank received over its ETP ranks before the experts and reduce-scatters their outputs back
  after. With uniform routing a rank of the sequence-parallel t dispatches and receives
  slots / t rows, so the experts' first projections save the gathered ETP x slots / t rows
  (``expert_input``: h x ETP x slots / t per rank); their f-wide tensors are those rows by
  f / ETP, slots x f / t as at ETP = t; ``expert_output`` (the reduce-scattered rows the
  probabilities weight) keeps slots / t rows. Needs sequence parallelism where t > 1 (each
  rank routes its own part of the sequence). The same holds at ETP = t (None) under sequence
  parallelism: the dispatcher gathers over its t ranks, so ``expert_input`` is slots x h on
  every rank, not slots x h / t. Megatron-LM's default dispatcher at that commit,
  ``allgather`` (``transformer_config.py``: ``moe_token_dispatcher_type = "allgather"``),
  gathers every token over the ETP x EP ranks and keeps the rows of its own experts: under
  uniform routing the same ETP x slots / t rows, so one count serves both.
- Norms on queries and keys (``qk_norm``: Qwen3 and Gemma-3 per head, OLMo-2 over the whole
  projection; transformers' modeling files): each RMSNorm saves its input, so Q and K are held
  twice (the projections' outputs and the normed copies the attention reads).
- One norm feeding attention and the MLP side by side (``shared_norm``, Falcon-7B's parallel
  block, transformers' FalconDecoderLayer): the MLP reads the tensor the QKV projection already
  saved, so the MLP's norm input and input are not stored again (autograd keeps one tensor once).
- ALiBi (BLOOM, Falcon-RW) adds a constant bias to the scores before the softmax, which saves
  its output as without it: no term of its own (an assumption about eager attention: the bias is
  built once per step and not counted).
- Shared experts (``shared_expert_ffn``, Qwen2-MoE's ``shared_expert``): an always-active MLP of
  its own width beside the routed ones, saving what a dense MLP of that width saves (its input is
  the MLP input, already counted); with ``shared_expert_gate`` the sigmoid gate saves its output
  (one value per token, in the element size) and the product saves the shared output (s x b x h).
- Capacity factor (``capacity_factor``, a stated setting; None: dropless routing, each expert
  holds exactly the tokens routed to it, as transformers runs Mixtral and Qwen-MoE). With a
  factor c each of the E experts holds a fixed buffer of ceil(c x k x s x b / E) token slots
  (GShard, Lepikhin et al. 2020, Sec. 2.2; Switch Transformer, Fedus et al. 2021, Sec. 2.1),
  padded when fewer arrive, so the expert tensors are E x that many tokens wide; tokens beyond a
  buffer are dropped, which this count does not model further.
- Multi-head latent attention (``kv_lora_rank`` > 0, DeepSeek-V2/V3, transformers'
  DeepseekV3Attention run eagerly): the down projections' outputs are saved by their RMSNorms and
  the norms' outputs by the up projections (2 x s x b x rank for the query latent, if any, and
  for the key/value latent, whole on every tensor-parallel rank as the down projections are);
  queries and keys are heads x (head_dim + rope_head_dim) wide, values and the output
  projection's input heads x v_head_dim. Assumption: the rotary key part shared by the heads
  saves nothing of its own (it is concatenated into the keys counted above), as with RoPE.
- Dense first layers (``dense_layers``, DeepSeek's first_k_dense_replace): those layers save
  what a dense gated MLP of ``dense_ffn_hidden`` saves; the others the mixture of experts'.
- Gated MLP, as eager PyTorch runs ``down(act(gate(x)) * up(x))``: the activation saves its input
  (the gate projection), the product saves both factors (activation output, up projection), the
  down projection saves the product: four f-wide tensors. A fused SwiGLU kernel stores three.
- Full recomputation stores each layer's input (2sbh, as Table 2); under sequence parallelism that
  input is already split along the sequence, so 2sbh/t (the paper's Table 2 row has no t because
  it stores the unsplit input).
- Model level (Sec. 4.3): the embedding's dropout mask, the final norm's input, the output
  projection's input, and the vocabulary-sized logits. The paper counts the logits once in fp32
  (4sbv/t); by default here they are counted in the element size (the projection's output) plus
  an fp32 copy for the loss (the upcast whose log-softmax the loss keeps for backward), as in
  Hugging Face's loss; ``logits_bytes=(4,)`` gives the paper's convention. Gradient buffers that
  exist only for a moment during backward (the logits' gradient, one layer's activation
  gradients) are not counted.
- Context parallelism (``context_parallel`` = C: Megatron-LM's ``--context-parallel-size``,
  torchtitan's ``context_parallel``): each sequence is cut into 2C chunks and CP rank i keeps
  chunks i and 2C - 1 - i (Megatron-LM ``get_batch_on_this_cp_rank``: "we split sequence into
  2*CP ranks ... so that we can get balanced workload" under the causal mask), so s must be a
  multiple of 2C and every rank holds s/C tokens of every sequence. Every term above is
  proportional to the tokens a rank holds except the s x s scores, and CP runs only with fused
  (flash) attention (TransformerEngine's ``AttnFuncWithCPAndKVP2P``), whose one fp32
  log-sum-exp per head and token is proportional too: a CP rank's activations are exactly those
  of a sequence of s/C tokens (:func:`context_parallel_tokens`), logits and loss included. The
  ring's K,V blocks: TransformerEngine saves for backward the last K,V block it received in
  place of its own (``kv = p2p_comm_buffers[-1]``), the same bytes as the ``key`` and ``value``
  terms; the blocks received during one layer's forward (up to C of them, the whole sequence's
  K and V of that layer) and the backward's two (K,V, dK,dV) double buffers are transient and
  left out, like the other one-layer buffers.
- ZeRO-R's partitioned activation checkpoints (P_a, Rajbhandari et al. SC20 Sec. VI-A;
  DeepSpeed's ``activation_checkpointing.partition_activations``): under full recomputation
  the checkpoint each layer keeps (its input) is split over the t tensor-parallel ranks instead
  of replicated, e*ceil(sbh/t) per rank (with sequence parallelism it is split already);
  with ``cpu_checkpointing`` (P_a+cpu, Sec. VI-A's offload) it moves to host memory and the GPU
  keeps none of it (:func:`checkpoint_terms`). Both apply to checkpointed layers only, so they
  need full recomputation.
- During backward, the layer being recomputed holds its full activations (full recomputation)
  or its recomputed attention core (selective): one layer's worth, counted as
  ``recompute_transient``. Table 2 does not include it (it lists what is *stored*).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from types import MappingProxyType

from zerolib.core.catalogue.models import MAX_MODEL_SIZE, TransformerConfig, get_model
from zerolib.core.defaults import (  # noqa: F401 (where callers find them)
    MAX_CONTEXT_PARALLEL,
    MAX_ELEMENT_BYTES,
    MAX_RECOMPUTE_LAYERS,
    NORMS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
)
from zerolib.core.inputs import MAX_GPUS, check_count, check_flag, check_positive_int
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.loss import MAX_LOSS_CHUNKS, check_loss, loss_bytes

# The policies the chapter's planner searches by default (op-selective is torchtitan's, asked for).
CHAPTER_RECOMPUTE = ("none", "selective", "full")
FP32_BYTES, AMAX_BYTES = 4, 2   # an fp32 element; torchao's amax of a bf16 tensor (bf16 scalar)
LINEAR_AMAXES = 2    # per Float8Linear under an op-level policy: the input's and the weight's
LOGSUMEXP_BYTES = 4  # flash attention keeps its softmax statistics in fp32 (one per head, token)
LOSS_FP32_BYTES = 4  # the loss upcasts the logits to fp32
ROUTER_BYTES = 4     # Mixtral's router softmax runs in fp32 (transformers: softmax(logits.float()))


def _check_recompute(recompute) -> str:
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    return recompute


def _split(n: int, t: int) -> int:
    """Elements of a tensor split t ways on the most-loaded rank."""
    return ceil_div(n, t)


@dataclass(frozen=True)
class ActivationOptions:
    """How a run keeps its activations, beside the model's shape: the settings of the count in
    the module doc. ``sequence_parallel``, ``recompute`` (one of :data:`RECOMPUTE`),
    ``flash_attention``, the widths of an activation (``element_bytes``) and of a dropout mask
    (``mask_bytes``), ``dropout`` (None: the model's own), ``logits_bytes`` (the widths of the
    vocabulary-sized tensors held at once; None: ``(element_bytes, 4)``), a mixture of experts'
    ``capacity_factor`` (None: dropless) and ``expert_tensor_parallel`` (None: the
    tensor-parallel degree), and ZeRO-R's ``partition_activations`` and ``cpu_checkpointing``
    (DeepSpeed's ``activation_checkpointing``; both need full recomputation).

    What a trainer's code changes (``data/mechanisms_measured.md``): ``norms``, ``fp8`` (two
    bf16 amax scalars per Linear under the op-level policy), ``recompute_method`` and
    ``recompute_layers`` (Megatron-LM's), the ``loss`` (:mod:`zerolib.core.memory.loss`, with
    ``loss_chunks``, ``logits_freed``), ``separate_moments`` (loss and recompute apart).
    Checked when made, so equal settings are equal options: the key of every memo of the
    per-setting counts."""

    sequence_parallel: bool = False
    recompute: str = "none"
    flash_attention: bool = False
    element_bytes: int = 2
    mask_bytes: int = 1
    dropout: bool | None = None
    logits_bytes: tuple[int, ...] | None = None
    capacity_factor: float | None = None
    expert_tensor_parallel: int | None = None
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    norms: str = "fused"
    fp8: bool = False
    recompute_method: str = "uniform"
    recompute_layers: int = 1
    loss: str = "stored"
    loss_chunks: int = 8
    logits_freed: bool = False
    separate_moments: bool = False

    def __post_init__(self):
        put = object.__setattr__
        for name in ("sequence_parallel", "flash_attention", "partition_activations",
                     "cpu_checkpointing", "fp8", "logits_freed", "separate_moments"):
            if getattr(self, name) is not False:   # a default is not checked again
                put(self, name, check_flag(getattr(self, name), name))
        _check_recompute(self.recompute)
        if self.norms not in NORMS:
            raise ValueError(f"norms must be one of {', '.join(NORMS)}, got {self.norms!r}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise ValueError(f"recompute_method must be one of {', '.join(RECOMPUTE_METHODS)}, "
                             f"got {self.recompute_method!r}")
        if self.recompute_layers != 1 or type(self.recompute_layers) is not int:
            put(self, "recompute_layers", check_positive_int(self.recompute_layers,
                                                             "recompute_layers", MAX_RECOMPUTE_LAYERS))
        if (self.recompute_method, self.recompute_layers) != ("uniform", 1) and self.recompute != "full":
            raise ValueError(f"recompute_method and recompute_layers choose how full recomputation "
                             f"checkpoints layers: they need recompute='full', got {self.recompute!r}")
        if self.loss != "stored":   # the default is not checked again
            check_loss(self.loss)
        if self.loss_chunks != 8 or type(self.loss_chunks) is not int:
            put(self, "loss_chunks", check_positive_int(self.loss_chunks, "loss_chunks", MAX_LOSS_CHUNKS))
        if self.logits_bytes is not None and self.loss != "stored":
            raise ValueError(f"logits_bytes are the widths of the 'stored' count: not with "
                             f"loss={self.loss!r}")
        put(self, "element_bytes", check_positive_int(self.element_bytes, "element_bytes",
                                                      MAX_ELEMENT_BYTES))
        put(self, "mask_bytes", check_count(self.mask_bytes, "mask_bytes", MAX_ELEMENT_BYTES))
        if self.dropout is not None:
            put(self, "dropout", check_flag(self.dropout, "dropout"))
        if self.logits_bytes is not None:
            put(self, "logits_bytes", logits_widths(self.logits_bytes, self.element_bytes))
        if self.capacity_factor is not None:
            put(self, "capacity_factor", check_capacity_factor(self.capacity_factor))
        if self.expert_tensor_parallel is not None:
            put(self, "expert_tensor_parallel", check_positive_int(
                self.expert_tensor_parallel, "expert_tensor_parallel", MAX_GPUS))
        for name in ("partition_activations", "cpu_checkpointing"):
            if getattr(self, name) and self.recompute != "full":
                raise ValueError(f"{name} applies to activation checkpoints: it needs "
                                 f"recompute='full', got {self.recompute!r}")

    def __deepcopy__(self, memo) -> ActivationOptions:
        return self  # immutable

    @classmethod
    def from_checked(cls, **values) -> ActivationOptions:
        """Options whose fields a door checked already (the planner's, from its checked
        settings), by name as the constructor takes them (the others at their defaults), made
        without checking them again: the same options, and the same memo key, as checked ones."""
        options = object.__new__(cls)
        for name, default in _DEFAULTS.items():
            object.__setattr__(options, name, values.pop(name, default))
        if values:
            raise TypeError(f"from_checked takes ActivationOptions' fields, got {', '.join(values)}")
        return options

    def dropout_of(self, config: TransformerConfig) -> bool:
        """Whether ``config`` runs with dropout under these options (None: the model's own)."""
        return config.dropout if self.dropout is None else self.dropout

    def loss_bytes(self, logits: int) -> int:
        """Bytes of the logits and the loss at the loss's peak, ``logits`` on this rank
        (:func:`zerolib.core.memory.loss.loss_bytes` of this run's implementation)."""
        return loss_bytes(self.loss, logits, freed=self.logits_freed, chunks=self.loss_chunks,
                          widths=self.logits_widths)

    @property
    def logits_widths(self) -> tuple[int, ...]:
        """The widths of the vocabulary-sized tensors: ``logits_bytes``, or the logits in the
        element size and their fp32 copy for the loss."""
        return (self.element_bytes, LOSS_FP32_BYTES) if self.logits_bytes is None else self.logits_bytes

    def etp_at(self, tensor_parallel: int) -> int | None:
        """The expert-tensor-parallel degree where it differs from ``tensor_parallel``, else
        None (the count of the module doc at ETP = t)."""
        etp = self.expert_tensor_parallel
        return None if etp is None or etp == tensor_parallel else etp


DEFAULT_OPTIONS = ActivationOptions()
_DEFAULTS = {f.name: f.default for f in fields(ActivationOptions)}
_OPTION_NAMES = frozenset(_DEFAULTS)


def layer_shape(hidden, heads, **shape) -> TransformerConfig:
    """One transformer layer's shape as a :class:`TransformerConfig` (a model of one layer, no
    vocabulary to speak of): ``hidden`` and ``heads``, and any other field of the config as a
    keyword (``kv_heads``: ``heads``; ``ffn_hidden``: 4 x ``hidden``; ``dropout``: True, the
    paper's GPT block)."""
    h = check_positive_int(hidden, "hidden", MAX_MODEL_SIZE)
    a = check_positive_int(heads, "heads", MAX_MODEL_SIZE)
    kv, f = shape.pop("kv_heads", None), shape.pop("ffn_hidden", None)
    shape.setdefault("dropout", True)
    return TransformerConfig(
        name=f"a layer of hidden size {h} with {a} heads", hidden=h, layers=1, heads=a,
        kv_heads=a if kv is None else check_positive_int(kv, "kv_heads", MAX_MODEL_SIZE),
        ffn_hidden=4 * h if f is None else check_positive_int(f, "ffn_hidden", MAX_MODEL_SIZE),
        vocab=1, max_positions=1, tied_embeddings=False, gated_mlp=shape.pop("gated_mlp", False),
        **shape)


def layer_activation_terms(model, seq_len, micro_batch, tensor_parallel=1,
                           options: ActivationOptions = DEFAULT_OPTIONS) -> Mapping[str, int]:
    """Bytes each saved tensor of one transformer layer of ``model`` (a preset name or a
    :class:`TransformerConfig`, e.g. :func:`layer_shape`) takes on one of ``tensor_parallel``
    ranks, under ``options`` (see the module doc for what each shape field and option saves).
    A model with experts: one layer with experts.

    Terms that a setting removes are 0 rather than absent, so the names stay the same.
    """
    config = get_model(model)
    s = check_positive_int(seq_len, "seq_len")
    b = check_positive_int(micro_batch, "micro_batch")
    t = check_positive_int(tensor_parallel, "tensor_parallel")
    options = _check_options(options)
    if config.heads % t:
        raise ValueError(f"tensor_parallel ({t}) must divide heads ({config.heads})")
    etp = check_expert_tensor_parallel(options.expert_tensor_parallel, t, options.sequence_parallel,
                                       config.experts, config.ffn_hidden)
    return _layer_terms(config, s, b, t, options, options.recompute, etp)


def _check_options(options) -> ActivationOptions:
    if not isinstance(options, ActivationOptions):
        raise TypeError(f"options must be an ActivationOptions, got {type(options).__name__}")
    return options


def check_expert_tensor_parallel(expert_tensor_parallel, t: int, sp: bool, experts: int,
                                 ffn_hidden: int) -> int | None:
    """A checked ETP, or None where it is t (or not given): the count of the module doc."""
    if expert_tensor_parallel is None:
        return None
    etp = check_positive_int(expert_tensor_parallel, "expert_tensor_parallel")
    if etp == t:
        return None
    if not experts:
        raise ValueError(f"expert_tensor_parallel other than tensor_parallel ({t}) needs a mixture "
                         f"of experts, got {etp}")
    if ffn_hidden % etp:
        raise ValueError(f"expert_tensor_parallel must divide ffn_hidden (each expert's width, "
                         f"{ffn_hidden}), got {etp}")
    if t > 1 and not sp:
        raise ValueError("expert_tensor_parallel other than tensor_parallel needs "
                         "sequence_parallel where tensor_parallel is above 1")
    return etp


def check_capacity_factor(capacity_factor) -> float:
    """A capacity factor from 1 to 64, as a float (the key of every memo that holds it)."""
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, numbers.Real) or not (
            1 <= capacity_factor <= 64):
        raise ValueError(f"capacity_factor must be a number from 1 to 64, or None for dropless "
                         f"routing, got {capacity_factor!r}")
    return float(capacity_factor)


def _layer_terms(config: TransformerConfig, s: int, b: int, t: int, options: ActivationOptions,
                 recompute: str, etp: int | None) -> Mapping[str, int]:
    """:func:`layer_activation_terms` of checked inputs (``recompute`` may differ from the
    options', to count what another setting would keep; ``etp`` None: ETP = t, else the checked
    ETP of :func:`check_expert_tensor_parallel`)."""
    h, a, f, kv, d = config.hidden, config.heads, config.ffn_hidden, config.kv_heads, config.head_width
    e, m = options.element_bytes, options.mask_bytes
    n_experts, k, gated = config.experts, config.experts_per_token, config.gated_mlp
    sp, flash, drop, post = (options.sequence_parallel, options.flash_attention,
                             options.dropout_of(config), config.post_norms)
    qk_norm, shared_norm, shared_gate = config.qk_norm, config.shared_norm, config.shared_expert_gate
    fs, kv_rank, q_rank = config.shared_expert_ffn, config.kv_lora_rank, config.q_lora_rank
    rope, v_width, capacity_factor = config.rope_head_dim, config.v_head_dim, options.capacity_factor
    sbh = s * b * h
    # Token slots the experts hold: k per token dropless, else E fixed buffers of the capacity.
    slots = s * b * k
    if n_experts and capacity_factor is not None:
        slots = n_experts * math.ceil(capacity_factor * k * s * b / n_experts)
    # A mixture of experts runs k expert MLPs per token; a dense layer one MLP.
    sbf = (slots if n_experts else s * b) * f
    # K (or V) width on one rank: its key/value heads x head_dim. With fewer key/value heads
    # than ranks each rank still holds one (Megatron replicates the groups).
    kv_width = d * _split(kv, t)
    scores = a * s * s * b                     # one s x s matrix per head
    # Replicated across tensor-parallel ranks unless sequence parallelism splits them.
    pointwise_t = t if sp else 1

    names = ["attention_norm_input", "qkv_input", "query", "key", "value",
             "softmax_output", "attention_dropout_mask", "attention_dropout_output",
             "flash_logsumexp", "attention_output_projection_input", "attention_dropout_mask_after_projection",
             "post_attention_norm_input", "mlp_norm_input", "mlp_input", "router_probabilities",
             "expert_input", "query_norm_input", "key_norm_input", "query_latent", "kv_latent",
             "shared_expert_gate_projection", "shared_expert_activation_output", "shared_expert_up_projection",
             "shared_expert_down_projection_input", "shared_expert_gate_output", "shared_expert_output"]
    names += (["mlp_gate_projection", "mlp_activation_output", "mlp_up_projection", "mlp_down_projection_input"]
              if gated else ["mlp_activation_input", "mlp_down_projection_input"])
    names += ["expert_output", "post_mlp_norm_input", "mlp_dropout_mask", "layer_input",
              "rmsnorm_fp32_copies", "saved_projection_outputs", "float8_amax"]
    terms = dict.fromkeys(names, 0)

    if recompute == "full":
        # Only the layer's input is kept; the rest is recomputed in backward.
        terms["layer_input"] = e * _split(sbh, pointwise_t)
        return MappingProxyType(terms)
    if recompute == "op-selective":
        return _op_selective_terms(config, s, b, t, options, terms)

    # Attention block (paper Sec. 4.1: 11sbh + 5as^2b).
    terms["attention_norm_input"] = e * _split(sbh, pointwise_t)
    terms["qkv_input"] = e * _split(sbh, pointwise_t)
    terms["query"] = e * _split(s * b * a * d, t)          # Q and K for QK^T (paper: 4sbh)
    terms["key"] = e * s * b * kv_width
    terms["value"] = e * s * b * kv_width                  # V for the attention over values
    if kv_rank:     # latent attention: wider queries and keys, values of their own width
        terms["query"] = e * _split(s * b * a * (d + rope), t)
        terms["key"] = e * _split(s * b * a * (d + rope), t)
        terms["value"] = e * _split(s * b * a * (v_width or d), t)
        terms["query_latent"] = 2 * e * s * b * q_rank          # norm input, up-projection input
        terms["kv_latent"] = 2 * e * s * b * kv_rank
    if qk_norm != "none":                                   # each norm saves its input
        terms["query_norm_input"] = e * _split(s * b * a * d, t)
        terms["key_norm_input"] = e * s * b * kv_width
    if recompute == "none":                                 # selective recomputes the core
        if flash:
            terms["flash_logsumexp"] = LOGSUMEXP_BYTES * _split(a * s * b, t)
        else:
            terms["softmax_output"] = e * _split(scores, t)
            if drop:
                terms["attention_dropout_mask"] = m * _split(scores, t)
                terms["attention_dropout_output"] = e * _split(scores, t)
    terms["attention_output_projection_input"] = e * _split(s * b * a * (v_width if kv_rank else d), t)
    if drop:
        terms["attention_dropout_mask_after_projection"] = m * _split(sbh, pointwise_t)
    if post:
        terms["post_attention_norm_input"] = e * _split(sbh, pointwise_t)

    # MLP block (paper: 19sbh with f = 4h) and the two norms (paper: 4sbh).
    if not shared_norm:     # one shared norm: the MLP reads the tensor QKV already saved
        terms["mlp_norm_input"] = e * _split(sbh, pointwise_t)
        terms["mlp_input"] = e * _split(sbh, pointwise_t)
    if n_experts:
        terms["router_probabilities"] = ROUTER_BYTES * _split(s * b * n_experts, pointwise_t)
        # The experts' first projections save the rows gathered over the ETP ranks, ETP x
        # slots / t (token_dispatcher.py at d98e8a64, dispatch_postprocess: the all-gather over
        # tp_group = expt_tp), at ETP = t too: slots rows. Without sequence parallelism (t = 1,
        # or ETP = t) a rank already holds every token's k rows.
        gathered = etp if etp is not None else (t if sp else 1)
        terms["expert_input"] = e * _split(gathered * slots * h, pointwise_t)
        terms["expert_output"] = e * _split(slots * h, pointwise_t)
    if fs:
        sbfs = s * b * fs
        shared_names = (("shared_expert_gate_projection", "shared_expert_activation_output",
                         "shared_expert_up_projection", "shared_expert_down_projection_input")
                        if gated else ("shared_expert_activation_output",
                                       "shared_expert_down_projection_input"))
        for name in shared_names:
            terms[name] = e * _split(sbfs, t)
    if shared_gate:
        terms["shared_expert_gate_output"] = e * _split(s * b, pointwise_t)
        terms["shared_expert_output"] = e * _split(sbh, pointwise_t)
    if gated:
        for name in ("mlp_gate_projection", "mlp_activation_output", "mlp_up_projection",
                     "mlp_down_projection_input"):
            terms[name] = e * _split(sbf, t)
    else:
        terms["mlp_activation_input"] = e * _split(sbf, t)          # GeLU input
        terms["mlp_down_projection_input"] = e * _split(sbf, t)     # GeLU output
    if post:
        terms["post_mlp_norm_input"] = e * _split(sbh, pointwise_t)
    if drop:
        terms["mlp_dropout_mask"] = m * _split(sbh, pointwise_t)
    if options.norms == "eager" and config.norm == "rmsnorm":
        # Python RMSNorm (upcast, pow, mean, rsqrt, multiply, cast back, weight) also saves its
        # fp32 input copy (4h) and the per-token 1/rms (4) beside what a fused norm keeps.
        norms = (1 if shared_norm else 2) + (2 if post else 0)
        terms["rmsnorm_fp32_copies"] = norms * (FP32_BYTES * _split(sbh, pointwise_t)
                                                + FP32_BYTES * _split(s * b, pointwise_t))
    return MappingProxyType(terms)


def _matmuls(config: TransformerConfig, t: int) -> list[tuple[str, int, bool]]:
    """A block's matrix multiplies in the order its forward runs them: (name, output width per
    token on one rank, row-parallel). Column-parallel outputs are split over t ranks; a
    row-parallel one is the rank's partial sum, h wide."""
    h, a, kv, d, f = config.hidden, config.heads, config.kv_heads, config.head_width, config.ffn_hidden
    kv_width = d * _split(kv, t)
    out = ([("qkv", _split(a * d, t) + 2 * kv_width, False)] if config.fused_qkv else
           [("q", _split(a * d, t), False), ("k", kv_width, False), ("v", kv_width, False)])
    out.append(("o", h, True))
    if config.gated_mlp:
        out += ([("gate_up", 2 * _split(f, t), False)] if config.fused_gate_up else
                [("gate", _split(f, t), False), ("up", _split(f, t), False)])
    else:
        out.append(("fc1", _split(f, t), False))
    out.append(("down", h, True))
    return out


def _op_selective_terms(config: TransformerConfig, s: int, b: int, t: int,
                        options: ActivationOptions, terms: dict) -> Mapping[str, int]:
    """torchtitan's op-level selective checkpointing (``SelectiveAC``, commit b5bcd76c;
    ``_op_sac_save_list``): each block under ``torch.utils.checkpoint`` with a policy that saves
    the outputs of mm (all but every second one, counted per block forward), of the flash /
    efficient attention kernels (output and fp32 log-sum-exp), of reduce-scatter (sequence
    parallelism's) and of max (Float8's amax), and recomputes everything else; the checkpoint
    keeps the block's input. Measured: ``data/mechanisms_measured.csv`` ``op-sac``, 2h + 2ad +
    2kd + (2ad + 4a) + 2f + 2h per token of a Llama block."""
    if config.experts or config.kv_lora_rank:
        raise ValueError(f"recompute 'op-selective' is modelled for dense blocks with standard "
                         f"attention, got {config.name} (experts or latent attention)")
    e, h, a, d, sp = options.element_bytes, config.hidden, config.heads, config.head_width, \
        options.sequence_parallel
    tokens = s * b
    pointwise_t = t if sp else 1
    terms["layer_input"] = e * _split(tokens * h, pointwise_t)
    kept = sum(width for index, (_, width, _) in enumerate(_matmuls(config, t)) if index % 2 == 0)
    terms["saved_projection_outputs"] = e * tokens * kept
    if sp and t > 1:     # both row-parallel outputs reduce-scattered over the sequence, saved
        terms["saved_projection_outputs"] += 2 * e * _split(tokens * h, t)
    if options.flash_attention:
        terms["attention_output_projection_input"] = e * tokens * _split(a * d, t)
        terms["flash_logsumexp"] = LOGSUMEXP_BYTES * _split(a * tokens, t)
    if options.fp8:     # torchao Float8Linear: two bf16 amax scalars per Linear (the list's max)
        terms["float8_amax"] = LINEAR_AMAXES * AMAX_BYTES * len(_matmuls(config, t))
    return MappingProxyType(terms)


def layer_activation_bytes(seq_len, micro_batch, hidden, heads, **options) -> int:
    """Bytes of activations one transformer layer saves for backward, per tensor-parallel rank:
    the short form of :func:`layer_activation_terms`, summed. The keywords are the layer's shape
    (the fields of :func:`layer_shape`), ``tensor_parallel`` and the fields of
    :class:`ActivationOptions`. With the paper's GPT block (``ffn_hidden`` = 4 x hidden, 2-byte
    elements, 1-byte dropout masks) this is Korthikanti et al.'s Table 2 exactly, e.g.
    ``sbh(34 + 5as/h)`` with no parallelism and no recomputation.
    """
    run = {name: options.pop(name) for name in list(options) if name in _OPTION_NAMES}
    tensor_parallel = options.pop("tensor_parallel", 1)
    config = layer_shape(hidden, heads, **options)
    return sum(layer_activation_terms(config, seq_len, micro_batch, tensor_parallel,
                                      ActivationOptions(**run)).values())


def logits_widths(logits_bytes, element_bytes: int) -> tuple[int, ...]:
    if logits_bytes is None:
        return (element_bytes, LOSS_FP32_BYTES)
    if isinstance(logits_bytes, (str, bytes)) or not hasattr(logits_bytes, "__iter__"):
        raise TypeError(f"logits_bytes must be a tuple of byte widths like (2, 4), got {logits_bytes!r}")
    return tuple(check_positive_int(w, "logits_bytes entry", MAX_ELEMENT_BYTES) for w in logits_bytes)


def model_activation_terms(model, seq_len, micro_batch, tensor_parallel=1,
                           options: ActivationOptions = DEFAULT_OPTIONS) -> Mapping[str, int]:
    """Activation bytes of a whole model on one of ``tensor_parallel`` ranks, by term.

    ``model`` is a preset name or a :class:`zerolib.core.catalogue.models.TransformerConfig`;
    ``options`` (:class:`ActivationOptions`) how the run keeps them: its ``dropout=None`` uses
    the model's own (GPT-2 trains with dropout; the Llama family does not), its
    ``logits_bytes`` by default ``(element_bytes, 4)`` (the logits, then their fp32 copy for the
    loss; the paper's Sec. 4.3 uses ``(4,)``).

    Terms: ``transformer_layers`` (L x one layer), ``recompute_transient`` (one layer being
    recomputed during backward), ``embedding_dropout_mask`` (the embedding output itself is the
    first layer's input, counted there), ``embedding_norm_input`` (BLOOM's norm after the
    embedding saves its input; the first layer's input is that norm's output),
    ``final_norm_input``, ``output_projection_input`` and
    ``logits_loss`` (vocabulary x sequence x micro-batch, split over tensor-parallel ranks).
    """
    config = get_model(model)
    # The layer inputs are checked once here; the layer sums of model_terms trust them.
    layer_activation_terms(config, seq_len, micro_batch, tensor_parallel, options)
    return model_terms(config, int(seq_len), int(micro_batch), int(tensor_parallel), options)


def model_terms(config: TransformerConfig, seq_len: int, micro_batch: int, tensor_parallel: int,
                options: ActivationOptions) -> Mapping[str, int]:
    """:func:`model_activation_terms` of checked inputs (a TransformerConfig, Python ints, an
    ETP the model allows): the planner's path, per setting."""
    s, b, h, v, t = seq_len, micro_batch, config.hidden, config.vocab, tensor_parallel
    one, dense, transient = layer_kinds(config, s, b, t, options)
    layers_total = config.layers * one
    if config.dense_layers:     # DeepSeek's first layers: a dense gated MLP, no experts
        layers_total = config.sparse_layers * one + config.dense_layers * dense
    pointwise_t = t if options.sequence_parallel else 1
    sbh_rank = _split(s * b * h, pointwise_t)
    element_bytes = options.element_bytes
    return MappingProxyType({
        "transformer_layers": layers_total,
        "recompute_transient": transient,
        "embedding_dropout_mask": options.mask_bytes * sbh_rank if options.dropout_of(config) else 0,
        "embedding_norm_input": element_bytes * sbh_rank if config.embedding_norm else 0,
        "final_norm_input": element_bytes * sbh_rank + (
            FP32_BYTES * (sbh_rank + _split(s * b, pointwise_t))
            if options.norms == "eager" and config.norm == "rmsnorm" else 0),
        "output_projection_input": element_bytes * sbh_rank,
        "logits_loss": options.loss_bytes(s * b * _split(v, t)),   # vocabulary-parallel output
    })


@lru_cache(maxsize=64)
def _dense_layer(config: TransformerConfig) -> TransformerConfig:
    """One of DeepSeek's first layers as a model of its own: a dense gated MLP of
    ``dense_ffn_hidden``, no experts."""
    return replace(config, ffn_hidden=config.dense_ffn_hidden, experts=0, experts_per_token=0,
                   shared_expert_ffn=0, shared_expert_gate=False, dense_layers=0,
                   dense_ffn_hidden=0)


def layer_kinds(config: TransformerConfig, seq_len: int, micro_batch: int, tensor_parallel: int,
                options: ActivationOptions) -> tuple[int, int, int]:
    """(one layer, one of the first dense layers, the recompute transient) in bytes on one
    rank, of checked inputs (as :func:`model_terms`). "One layer" is every layer of a model
    whose layers are alike, else one with experts; the dense layer is 0 without ``dense_layers``;
    the transient is the larger kind's."""
    s, b, t, recompute = seq_len, micro_batch, tensor_parallel, options.recompute
    etp = options.etp_at(t)

    def layer(kind: TransformerConfig, how: str) -> int:
        return sum(_layer_terms(kind, s, b, t, options, how,
                                etp if kind.experts else None).values())

    one = layer(config, recompute)
    if recompute == "none":
        transient = 0
    else:
        # The layer being recomputed in backward briefly holds what "none" would have stored
        # (full) or what the policy dropped (selective: the attention core; op-selective: the
        # outputs it did not save).
        everything = layer(config, "none")
        transient = everything if recompute == "full" else everything - one
    dense_one = 0
    if config.dense_layers:     # DeepSeek's first layers: a dense gated MLP, no experts
        dense = _dense_layer(config)
        dense_one = layer(dense, recompute)
        if recompute != "none":     # the larger of the two kinds of layer being recomputed
            everything = layer(dense, "none")
            transient = max(transient, everything if recompute == "full"
                            else everything - dense_one)
    return one, dense_one, transient


def whole_layer_bytes(config: TransformerConfig, seq_len: int, micro_batch: int,
                      tensor_parallel: int, options: ActivationOptions) -> int:
    """One layer's bytes with nothing recomputed (what a layer outside Megatron's checkpointed
    block keeps), of checked inputs; a model's larger kind of layer."""
    etp = options.etp_at(tensor_parallel)
    kinds = [config] + ([_dense_layer(config)] if config.dense_layers else [])
    return max(sum(_layer_terms(kind, seq_len, micro_batch, tensor_parallel, options, "none",
                                etp if kind.experts else None).values()) for kind in kinds)




def context_parallel_tokens(seq_len, context_parallel) -> int:
    """Tokens of each sequence one of ``context_parallel`` = C ranks holds: s / C, where s is a
    multiple of 2C (the causal load balancing cuts each sequence into 2C chunks and gives each
    rank two, see the module doc). C = 1 is s."""
    s = check_positive_int(seq_len, "seq_len")
    c = check_positive_int(context_parallel, "context_parallel", MAX_CONTEXT_PARALLEL)
    if c > 1 and s % (2 * c):
        raise ValueError(f"seq_len ({s}) must be a multiple of 2 x context_parallel "
                         f"(2 x {c} = {2 * c}): Megatron-LM cuts each sequence into 2C chunks")
    return s // c


def checkpoint_terms(seq_len, micro_batch, hidden, *, tensor_parallel=1, sequence_parallel=False,
                     element_bytes=2, partition_activations=False,
                     cpu_checkpointing=False) -> Mapping[str, int]:
    """Bytes of one layer's activation checkpoint under full recomputation (its input, s x b x h
    elements, s the tokens this rank holds), on the GPU and on the host, per tensor-parallel
    rank: replicated over the t ranks without sequence parallelism, split over them with it or
    with ZeRO-R's P_a (``partition_activations``); with ``cpu_checkpointing`` the GPU keeps none
    and the host all (Rajbhandari et al. SC20 Sec. VI-A, DeepSpeed's ``cpu_checkpointing``).
    ``gathered`` is what P_a's all-gather rebuilds before the layer is recomputed (the whole
    checkpoint on every rank; 0 when nothing is partitioned)."""
    s = check_positive_int(seq_len, "seq_len")
    b = check_positive_int(micro_batch, "micro_batch")
    h = check_positive_int(hidden, "hidden")
    t = check_positive_int(tensor_parallel, "tensor_parallel")
    e = check_positive_int(element_bytes, "element_bytes")
    sp, pa, cpu = (check_flag(sequence_parallel, "sequence_parallel"),
                   check_flag(partition_activations, "partition_activations"),
                   check_flag(cpu_checkpointing, "cpu_checkpointing"))
    return checkpoint_terms_of(s, b, h, t, e, sp, pa, cpu)


def checkpoint_terms_of(s, b, h, t, e, sp, pa, cpu) -> Mapping[str, int]:
    """:func:`checkpoint_terms` of checked Python ints and flags."""
    kept = e * _split(s * b * h, t if (sp or pa) else 1)
    return MappingProxyType({"gpu": 0 if cpu else kept, "host": kept if cpu else 0,
                             "gathered": e * s * b * h if (pa and t > 1 and not sp) else 0})
