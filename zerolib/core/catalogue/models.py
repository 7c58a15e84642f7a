"""Decoder-only transformers described by their configuration: exact parameter counts.

A :class:`TransformerConfig` holds what a model's ``config.json`` says (hidden size, layers,
attention heads, key/value heads, feed-forward size, vocabulary, tying, biases, norm type,
gated MLP, position embeddings). From it:

- :func:`parameter_count` gives the exact number of trainable parameters (what
  ``model.num_parameters()`` reports in Hugging Face transformers: a tied output projection is
  counted once; buffers such as Llama-2's rotary ``inv_freq`` are not parameters and are not
  counted, although some checkpoint totals include them);
- :func:`largest_layer` gives the largest *module* in elements, as DeepSpeed defines
  ``largest_layer_params`` in ``deepspeed/runtime/zero/stage3.py`` (``model_to_params``): the
  maximum over ``model.modules()`` of ``sum(p.numel() for p in m.parameters(recurse=False))``,
  i.e. one module's own weight plus its bias. A tied output projection is a module of its own
  there, so it counts as large as the embedding it shares.

Modules follow the Hugging Face implementations: GPT-2 fuses Q, K and V in one ``c_attn``
(``fused_qkv=True``); Llama, Mistral and Qwen2 keep ``q_proj``/``k_proj``/``v_proj`` apart.

Shapes beyond the dense Llama block:

- **Head width of its own** (``head_dim``): the query projection is heads x head_dim wide, the
  key and value projections kv_heads x head_dim, the attention output projection maps heads x
  head_dim back to hidden. Gemma-2-9B has 16 heads of 256 on a hidden size of 3,584 (not 224).
- **Norms after attention and after the MLP** (``post_norms``): Gemma-2's block has four RMSNorms,
  ``input_layernorm`` (here ``attention_norm``), ``post_attention_layernorm`` on the attention
  output (``post_attention_norm``), ``pre_feedforward_layernorm`` (``mlp_norm``) and
  ``post_feedforward_layernorm`` on the MLP output (``post_mlp_norm``). (Llama's
  ``post_attention_layernorm`` is the norm *before* its MLP: ``mlp_norm`` here.) Gemma stores each
  RMSNorm weight as one plain vector of hidden elements, initialised to 0 and applied as
  x_hat * (1 + w), so it counts as Llama's does.
- **Mixture of experts** (``experts``, ``experts_per_token``): each layer's MLP is ``experts``
  copies of the (gated) MLP, each ``ffn_hidden`` wide, and a ``router``, a bias-free hidden x
  experts matrix (Mixtral: ``gate = nn.Linear(hidden, num_local_experts, bias=False)``). Every
  expert's projection is a module of its own (``expert_gate_projection``,
  ``expert_up_projection``, ``expert_down_projection``, each counted layers x experts times), as in
  Mistral's reference implementation and transformers before version 5 (``w1``, ``w3``, ``w2`` of
  ``MixtralBlockSparseTop2MLP``). transformers 5 keeps a layer's experts in one module of 3-D
  tensors (``MixtralExperts``: ``gate_up_proj`` and ``down_proj``); ``largest_layer(...,
  fused_experts=True)`` gives DeepSpeed's largest module for that layout.

Shapes read from other architectures' config.json (:mod:`zerolib.core.catalogue.hf_config`),
each checked against transformers: Phi-3's fused ``gate_up_proj`` (``fused_gate_up``); norms on
queries and keys (``qk_norm``: per head in Qwen3 and Gemma-3, over the projection in OLMo-2);
BLOOM's norm after the embedding (``embedding_norm``) and ALiBi (no position parameters);
Falcon-7B's one norm before attention and MLP side by side (``shared_norm``); a bias on the
output projection (``output_projection_bias``, Phi-3.5-MoE's ``lm_head_bias``); a shared expert
beside the routed ones (``shared_expert_ffn``, with Qwen2-MoE's sigmoid ``shared_expert_gate``);
DeepSeek's multi-head latent attention (``kv_lora_rank``, ``q_lora_rank``, ``rope_head_dim``,
``v_head_dim``) and its first dense layers (``dense_layers`` of ``dense_ffn_hidden``).

:func:`active_parameter_count` counts the parameters one token's forward pass uses: everything
except the experts a token is not routed to, i.e. the embedding, attention, norms, the whole
router, ``experts_per_token`` experts per layer and the output projection (a tied one once). This
is the count Mixtral's paper (Sec. 2.1) calls active and Megatron-LM's
``theoretical_memory_usage.py`` computes (``num_active_parameters``, embeddings included); for a
dense model it equals :func:`parameter_count`. Memory for model state follows the total: every
expert has parameters, gradients and optimizer state whichever tokens it sees.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import lru_cache
from types import MappingProxyType

from zerolib.core.inputs import MAX_PARAMS, check_count, check_flag, check_positive_int

NORMS = ("layernorm", "rmsnorm")            # layernorm: weight + bias; rmsnorm: weight only
POSITION_EMBEDDINGS = ("learned", "rotary", "alibi", "none")  # only "learned" has parameters
QK_NORMS = ("none", "head", "projection")  # a norm on each query/key head, or on the whole projection
MAX_MODEL_SIZE = 2**24   # largest hidden size, layer count, vocabulary... of a description


@dataclass(frozen=True)
class TransformerConfig:
    """One decoder-only transformer. Sizes are counts of elements, not bytes."""

    name: str
    hidden: int                 # hidden size h (d_model)
    layers: int                 # transformer blocks L
    heads: int                  # attention (query) heads a
    kv_heads: int               # key/value heads (= heads without grouped-query attention)
    ffn_hidden: int             # feed-forward inner size f (4h for GPT-2)
    vocab: int                  # vocabulary size V (rows of the embedding)
    max_positions: int          # context length the model was configured for
    tied_embeddings: bool       # output projection shares the input embedding
    gated_mlp: bool             # SwiGLU-style gate/up/down (3 matrices) instead of 2
    norm: str = "rmsnorm"       # "layernorm" (weight + bias) or "rmsnorm" (weight only)
    position_embedding: str = "rotary"  # "learned" (a max_positions x h table) or "rotary"
    qkv_bias: bool = False      # biases on the query/key/value projections
    output_bias: bool = False   # bias on the attention output projection
    mlp_bias: bool = False      # biases on the MLP projections
    fused_qkv: bool = False     # Q, K, V in one module (GPT-2's c_attn): matters for largest_layer
    dropout: bool = False       # the model trains with dropout (GPT-2: 0.1); activations use it
    source: str = ""            # where the configuration and the published count come from
    head_dim: int | None = None  # attention head width; None: hidden // heads (see head_width)
    post_norms: bool = False    # a norm after attention and after the MLP too (Gemma-2: 4 per layer)
    experts: int = 0            # MLP experts per layer (Mixtral: 8); 0: one dense MLP, no router
    experts_per_token: int = 0  # experts each token is routed to (Mixtral: 2); 0 when dense
    fused_gate_up: bool = False  # gate and up in one module (Phi-3's gate_up_proj): largest_layer
    qk_norm: str = "none"       # RMSNorm on queries and keys: per head (Qwen3, Gemma-3) or whole (OLMo-2)
    embedding_norm: bool = False  # a norm right after the embedding (BLOOM's word_embeddings_layernorm)
    shared_norm: bool = False   # one norm feeds attention and the MLP side by side (Falcon-7B)
    shared_expert_ffn: int = 0  # width of the always-active shared expert MLP (Qwen2-MoE); 0: none
    shared_expert_gate: bool = False  # a hidden x 1 sigmoid gate on the shared expert (Qwen2-MoE)
    # Multi-head latent attention (DeepSeek-V2/V3): keys and values from a compressed latent of
    # kv_lora_rank (0: ordinary attention), queries through one of q_lora_rank (0: directly);
    # head_dim is then the part of a query/key head without rotary embedding (qk_nope_head_dim).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0      # the rotary part of each query/key head (qk_rope_head_dim)
    v_head_dim: int = 0         # width of a value head
    dense_layers: int = 0       # the first layers keep a dense MLP (first_k_dense_replace)
    dense_ffn_hidden: int = 0   # that dense MLP's width (the experts' is ffn_hidden)
    output_projection_bias: bool = False  # a bias on the output projection (Phi-3.5-MoE's lm_head_bias)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")
        for name in ("hidden", "layers", "heads", "kv_heads", "ffn_hidden", "vocab", "max_positions"):
            if not isinstance(getattr(self, name), int):   # whole numbers, not 4096.0
                raise TypeError(f"{name} must be a positive whole number, got {getattr(self, name)!r}")
            check_positive_int(getattr(self, name), name, MAX_MODEL_SIZE)
        for name in ("tied_embeddings", "gated_mlp", "qkv_bias", "output_bias", "mlp_bias",
                     "fused_qkv", "dropout", "post_norms", "fused_gate_up", "embedding_norm", "shared_norm",
                     "shared_expert_gate", "output_projection_bias"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.head_dim is None:
            if self.hidden % self.heads:
                raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) "
                                 f"unless head_dim is given")
        else:
            if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int):
                raise TypeError(f"head_dim must be a positive whole number or None, got {self.head_dim!r}")
            check_positive_int(self.head_dim, "head_dim", MAX_MODEL_SIZE)
        for name in ("experts", "experts_per_token", "shared_expert_ffn", "kv_lora_rank", "q_lora_rank",
                     "rope_head_dim", "v_head_dim", "dense_layers", "dense_ffn_hidden"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be a whole number, got {value!r}")
            check_count(value, name, MAX_MODEL_SIZE)
        if (self.experts == 0) != (self.experts_per_token == 0):
            raise ValueError(f"experts ({self.experts}) and experts_per_token ({self.experts_per_token}) "
                             f"must both be 0 (a dense MLP) or both positive")
        if self.experts_per_token > self.experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) must be at most experts "
                             f"({self.experts})")
        if self.kv_lora_rank and not (self.v_head_dim and self.head_dim):
            raise ValueError("kv_lora_rank (latent attention) needs head_dim and v_head_dim")
        if (self.q_lora_rank or self.rope_head_dim or self.v_head_dim) and not self.kv_lora_rank:
            raise ValueError("q_lora_rank, rope_head_dim and v_head_dim need kv_lora_rank "
                             "(multi-head latent attention)")
        if self.dense_layers and not (self.experts and self.dense_ffn_hidden
                                      and self.dense_layers < self.layers):
            raise ValueError(f"dense_layers ({self.dense_layers}) needs experts, dense_ffn_hidden and "
                             f"fewer dense layers than layers ({self.layers})")
        if self.dense_ffn_hidden and not self.dense_layers:
            raise ValueError("dense_ffn_hidden needs dense_layers")
        if self.qk_norm not in QK_NORMS:
            raise ValueError(f"qk_norm must be one of {', '.join(QK_NORMS)}, got {self.qk_norm!r}")
        if (self.shared_expert_ffn or self.shared_expert_gate) and not self.experts:
            raise ValueError("shared_expert_ffn and shared_expert_gate need experts (a mixture of experts)")
        if self.shared_expert_gate and not self.shared_expert_ffn:
            raise ValueError("shared_expert_gate needs shared_expert_ffn (a shared expert to gate)")
        if self.shared_norm and self.post_norms:
            raise ValueError("shared_norm (one norm per layer) and post_norms (four) exclude each other")
        if self.output_projection_bias and self.tied_embeddings:
            raise ValueError("output_projection_bias needs an output projection of its own (not "
                             "tied_embeddings): a tied one is the embedding, which has no bias")
        if self.fused_gate_up and not self.gated_mlp:
            raise ValueError("fused_gate_up needs gated_mlp (a gate and an up projection to fuse)")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding must be one of {', '.join(POSITION_EMBEDDINGS)}, "
                             f"got {self.position_embedding!r}")
        if not isinstance(self.source, str):
            raise TypeError("source must be a string")
        # The count --params and estimate() accept at most: a description of a larger model
        # (each of its sizes within bounds) must not slip past through --config.
        total = parameter_count(self)
        if total > MAX_PARAMS:
            raise ValueError(f"the model has {total:,} parameters; zerolib sizes models of at "
                             f"most {MAX_PARAMS:,}")

    def __deepcopy__(self, memo) -> TransformerConfig:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    @property
    def head_width(self) -> int:
        """Width of one attention head: ``head_dim`` if given, else hidden // heads."""
        return self.hidden // self.heads if self.head_dim is None else self.head_dim

    @property
    def query_width(self) -> int:
        """Width of the query projection (and the attention output projection's input)."""
        return self.heads * self.head_width

    @property
    def kv_hidden(self) -> int:
        """Width of the key (or value) projection: kv_heads x head width."""
        return self.kv_heads * self.head_width

    @property
    def norms_per_layer(self) -> int:
        return 4 if self.post_norms else 1 if self.shared_norm else 2

    @property
    def mixture_of_experts(self) -> bool:
        return self.experts > 0

    @property
    def latent_attention(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def sparse_layers(self) -> int:
        """Layers holding the mixture of experts (all of them unless the first are dense)."""
        return self.layers - self.dense_layers if self.experts else 0

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Module:
    """A module's own parameters (weight + bias), how many such modules, and whether its
    weights are another module's (a tied output projection: not counted again in the total)."""

    name: str
    elements: int
    count: int = 1
    shared: bool = False


# The per-expert modules of a mixture-of-experts layer (each counted layers x experts times).
EXPERT_MODULES = ("expert_gate_projection", "expert_up_projection", "expert_down_projection")


def modules(config: TransformerConfig | str) -> tuple[Module, ...]:
    """Every parameter-holding module, in model order, with its own element count.

    Names: ``embedding``, ``position_embedding`` (learned only), ``attention_norm``,
    ``qkv_projection`` (fused) or ``query_projection``/``key_projection``/``value_projection``,
    ``attention_output_projection``, ``post_attention_norm`` (post_norms only), ``mlp_norm``, then
    either ``mlp_gate_projection`` (gated only), ``mlp_up_projection`` (or, fused, one
    ``mlp_gate_up_projection``), ``mlp_down_projection`` or,
    (``embedding_norm`` after the embedding with ``embedding_norm``; ``query_norm`` and
    ``key_norm`` before the output projection with ``qk_norm``; no ``mlp_norm`` with
    ``shared_norm``; ``shared_expert_*`` projections and ``shared_expert_gate`` after the routed
    experts with a shared expert)
    with experts, ``router`` and the :data:`EXPERT_MODULES` (``expert_gate_projection`` gated
    only), ``post_mlp_norm`` (post_norms only), ``final_norm``, ``output_projection``.
    """
    if not isinstance(config, TransformerConfig):   # a resolved config needs no look-up
        config = get_model(config)
    h, f, v = config.hidden, config.ffn_hidden, config.vocab
    q, kv = config.query_width, config.kv_hidden   # heads x head width, kv_heads x head width
    norm = 2 * h if config.norm == "layernorm" else h
    L = config.layers

    def linear(n_in, n_out, bias):
        return n_in * n_out + (n_out if bias else 0)

    out = [Module("embedding", v * h)]
    if config.position_embedding == "learned":
        out.append(Module("position_embedding", config.max_positions * h))
    if config.embedding_norm:
        out.append(Module("embedding_norm", norm))
    out.append(Module("attention_norm", norm, L))
    if config.latent_attention:     # DeepSeek-V2/V3 (transformers' DeepseekV3Attention)
        qk = config.head_width + config.rope_head_dim
        bias = config.qkv_bias     # attention_bias: on the down projections and the output
        if config.q_lora_rank:
            out += [Module("query_down_projection", linear(h, config.q_lora_rank, bias), L),
                    Module("query_down_norm", config.q_lora_rank, L),
                    Module("query_up_projection", linear(config.q_lora_rank, config.heads * qk, False), L)]
        else:
            out.append(Module("query_projection", linear(h, config.heads * qk, False), L))
        out += [Module("kv_down_projection", linear(h, config.kv_lora_rank + config.rope_head_dim, bias), L),
                Module("kv_down_norm", config.kv_lora_rank, L),
                Module("kv_up_projection", linear(config.kv_lora_rank, config.heads * (
                    config.head_width + config.v_head_dim), False), L),
                Module("attention_output_projection", linear(config.heads * config.v_head_dim, h,
                                                             config.output_bias), L)]
    elif config.fused_qkv:
        out.append(Module("qkv_projection", linear(h, q + 2 * kv, config.qkv_bias), L))
    else:
        out += [Module("query_projection", linear(h, q, config.qkv_bias), L),
                Module("key_projection", linear(h, kv, config.qkv_bias), L),
                Module("value_projection", linear(h, kv, config.qkv_bias), L)]
    if config.qk_norm != "none":     # RMSNorm weights only (Qwen3, Gemma-3, OLMo-2)
        per_head = config.qk_norm == "head"
        out += [Module("query_norm", config.head_width if per_head else q, L),
                Module("key_norm", config.head_width if per_head else kv, L)]
    if not config.latent_attention:
        out.append(Module("attention_output_projection", linear(q, h, config.output_bias), L))
    if config.post_norms:
        out.append(Module("post_attention_norm", norm, L))
    if not config.shared_norm:
        out.append(Module("mlp_norm", norm, L))
    if config.dense_layers:         # DeepSeek's first layers: one dense (gated) MLP each
        fd, k = config.dense_ffn_hidden, config.dense_layers
        out += [Module("dense_mlp_gate_projection", linear(h, fd, config.mlp_bias), k),
                Module("dense_mlp_up_projection", linear(h, fd, config.mlp_bias), k),
                Module("dense_mlp_down_projection", linear(fd, h, config.mlp_bias), k)]
    if config.mixture_of_experts:
        n = config.sparse_layers   # the layers with experts
        copies = n * config.experts
        gate_name, up_name, down_name = EXPERT_MODULES
        out.append(Module("router", linear(h, config.experts, False), n))
        if config.gated_mlp:
            out.append(Module(gate_name, linear(h, f, config.mlp_bias), copies))
        out += [Module(up_name, linear(h, f, config.mlp_bias), copies),
                Module(down_name, linear(f, h, config.mlp_bias), copies)]
        if config.shared_expert_ffn:    # always active, beside the routed experts
            fs = config.shared_expert_ffn
            if config.gated_mlp:
                out.append(Module("shared_expert_gate_projection", linear(h, fs, config.mlp_bias), n))
            out += [Module("shared_expert_up_projection", linear(h, fs, config.mlp_bias), n),
                    Module("shared_expert_down_projection", linear(fs, h, config.mlp_bias), n)]
        if config.shared_expert_gate:
            out.append(Module("shared_expert_gate", linear(h, 1, False), n))
    else:
        if config.fused_gate_up:     # one h x 2f matrix (Phi-3's gate_up_proj)
            out.append(Module("mlp_gate_up_projection", linear(h, 2 * f, config.mlp_bias), L))
        else:
            if config.gated_mlp:
                out.append(Module("mlp_gate_projection", linear(h, f, config.mlp_bias), L))
            out.append(Module("mlp_up_projection", linear(h, f, config.mlp_bias), L))
        out.append(Module("mlp_down_projection", linear(f, h, config.mlp_bias), L))
    if config.post_norms:
        out.append(Module("post_mlp_norm", norm, L))
    out.append(Module("final_norm", norm))
    # The output projection (no bias in any preset; Phi-3.5-MoE has one). Tied: the embedding's
    # own matrix.
    out.append(Module("output_projection", v * h + (v if config.output_projection_bias else 0),
                      shared=config.tied_embeddings))
    return tuple(out)


def parameter_count(config: TransformerConfig | str) -> int:
    """Exact trainable parameters (a tied output projection counted once; no buffers)."""
    return sum(m.elements * m.count for m in modules(config) if not m.shared)


def active_parameter_count(config: TransformerConfig | str) -> int:
    """Parameters one token's forward pass uses: all but the experts it is not routed to.

    Embedding, attention, norms, the whole router, ``experts_per_token`` experts per layer and the
    output projection (Mixtral of Experts, Sec. 2.1; Megatron-LM's ``num_active_parameters``).
    Equal to :func:`parameter_count` for a dense model.
    """
    config = get_model(config)
    idle = config.experts - config.experts_per_token     # experts a token skips, per layer
    unused = sum(m.elements for m in modules(config) if m.name in EXPERT_MODULES)
    return parameter_count(config) - config.sparse_layers * idle * unused


def largest_layer(config: TransformerConfig | str, *, fused_experts: bool = False) -> int:
    """Elements of the largest single module (DeepSpeed's ``largest_layer_params``).

    ``fused_experts=True``: a layer's experts are one module (transformers 5's ``MixtralExperts``
    holds all of them in 3-D tensors), so that module counts every expert projection of a layer.
    """
    config = get_model(config)
    fused = check_flag(fused_experts, "fused_experts")
    found = modules(config)
    largest = max(m.elements for m in found)
    if fused and config.mixture_of_experts:
        largest = max(largest, config.experts * sum(m.elements for m in found if m.name in EXPERT_MODULES))
    return largest


def _llama(name, hidden, layers, heads, kv_heads, ffn_hidden, vocab, max_positions, source,
           **extra) -> TransformerConfig:
    return TransformerConfig(name, hidden, layers, heads, kv_heads, ffn_hidden, vocab, max_positions,
                             tied_embeddings=False, gated_mlp=True, norm="rmsnorm",
                             position_embedding="rotary", source=source, **extra)


# Each source names the configuration (Hugging Face config.json) and where the total is
# published; tests/core/catalogue/test_models.py checks parameter_count against each published total.
# Made (and so checked) on first use, ``MODELS`` of this module (PEP 562): a command that names
# no preset, `zerolib estimate --params 7B`, starts without building them.
@lru_cache(maxsize=1)
def _presets() -> Mapping[str, TransformerConfig]:
    return MappingProxyType({m.name: m for m in (
        TransformerConfig(
            "gpt2", hidden=768, layers=12, heads=12, kv_heads=12, ffn_hidden=3072, vocab=50257,
            max_positions=1024, tied_embeddings=True, gated_mlp=False, norm="layernorm",
            position_embedding="learned", qkv_bias=True, output_bias=True, mlp_bias=True,
            fused_qkv=True, dropout=True,
            source="GPT-2 small. Config: huggingface.co/openai-community/gpt2 config.json (n_embd 768, "
                   "n_layer 12, n_head 12, n_positions 1024, vocab 50257, tied, pdrop 0.1). Total "
                   "124,439,808: keras-team/keras-hub gpt2_presets.py, gpt2_base_en 'params'."),
        _llama("llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096,
               "Config: huggingface.co/meta-llama/Llama-2-7b-hf config.json. Total 6,738,415,616: "
               "keras-team/keras-hub llama_presets.py, llama2_7b_en 'params' (checkpoint totals "
               "that include the 32 x 64 rotary inv_freq buffers read 6,738,417,664)."),
        _llama("llama-2-13b", 5120, 40, 40, 40, 13824, 32000, 4096,
               "Config: huggingface.co/meta-llama/Llama-2-13b-hf config.json. Total 13,015,864,320: "
               "LlamaForCausalLM num_parameters() as quoted in public notes and the HarmBench "
               "classifier table (cais/HarmBench-Llama-2-13b-cls, BF16 parameters)."),
        _llama("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, 4096,
               "Config: huggingface.co/meta-llama/Llama-2-70b-hf config.json (GQA, 8 kv heads). "
               "Total 68,976,648,192: peft print_trainable_parameters 'all params' and "
               "Megatron-DeepSpeed TOTAL_PARAMS logs quoted in public repositories."),
        _llama("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 8192,
               "Meta-Llama-3-8B. Config: huggingface.co/meta-llama/Meta-Llama-3-8B config.json. "
               "Total 8,030,261,248: keras-team/keras-hub llama3_presets.py, llama3_8b_en 'params'."),
        _llama("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, 8192,
               "Meta-Llama-3-70B. Config: huggingface.co/meta-llama/Meta-Llama-3-70B config.json. "
               "Total 70,553,706,496: Hugging Face Hub safetensors parameter total as quoted in "
               "public code for the Llama-3 70B architecture."),
        _llama("mistral-7b-v0.1", 4096, 32, 32, 8, 14336, 32000, 32768,
               "Config: huggingface.co/mistralai/Mistral-7B-v0.1 config.json (sliding window "
               "4096 changes no parameter). Total 7,241,732,096: keras-team/keras-hub "
               "mistral_presets.py, mistral_7b_en 'params'."),
        _llama("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, 131072,
               "Config: huggingface.co/Qwen/Qwen2.5-7B config.json (q/k/v biases, untied). Total "
               "7,615,616,512: Hugging Face Hub safetensors total / GGUF general.parameter_count as "
               "quoted in public code; the model card rounds it to 7.61B (6.53B non-embedding).",
               qkv_bias=True),
        _llama("llama-3.1-405b", 16384, 126, 128, 8, 53248, 128256, 131072,
               "Meta-Llama-3.1-405B. Config: huggingface.co/meta-llama/Llama-3.1-405B config.json; "
               "meta-llama/llama-models models/llama3_1 sku_list.py (dim 16384, n_layers 126, n_heads "
               "128, n_kv_heads 8, vocab 128256); Llama 3 paper (arXiv 2407.21783) Table 3 (FFN "
               "53,248). Total 405,853,388,800: Hugging Face Hub API safetensors.total for "
               "meta-llama/Llama-3.1-405B (revision b906e4dc), as quoted in public code."),
        TransformerConfig(
            "gemma-2-9b", hidden=3584, layers=42, heads=16, kv_heads=8, ffn_hidden=14336, vocab=256000,
            max_positions=8192, tied_embeddings=True, gated_mlp=True, norm="rmsnorm",
            position_embedding="rotary", head_dim=256, post_norms=True,
            source="Config: huggingface.co/google/gemma-2-9b config.json; google/gemma_pytorch "
                   "gemma/config.py get_config_for_9b; Gemma 2 paper (arXiv 2408.00118) Table 1 (head "
                   "size 256, not 3584/16; 4 RMSNorms per layer; tied). Total 9,241,705,984: "
                   "keras-team/keras-hub gemma_presets.py, gemma2_9b_en 'params'. The paper's Table 2 "
                   "prints 9,242,164,736 from a padded 256,128-entry vocabulary (its non-embedding "
                   "8,324,201,984 matches)."),
        _llama("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, 32768,
               "Mixtral-8x7B-v0.1. Config: huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json "
               "(num_local_experts 8, num_experts_per_tok 2); Mixtral of Experts paper (arXiv "
               "2401.04088) Table 1. Total 46,702,792,704: keras-team/keras-hub mixtral_presets.py, "
               "mixtral_8x7b_en 'params'. Active 12,879,925,248 (embedding and output layer included) "
               "rounds to the 12.9B Mistral AI quotes; the paper says 13B active.",
               experts=8, experts_per_token=2),
    )})


def __getattr__(name: str):
    if name == "MODELS":
        return _presets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Other spellings people type.
ALIASES: Mapping[str, str] = MappingProxyType({
    "gpt2-small": "gpt2", "gpt-2": "gpt2",
    "meta-llama-3-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b",
    "mistral-7b": "mistral-7b-v0.1", "qwen2.5-7b-instruct": "qwen2.5-7b",
    "meta-llama-3.1-405b": "llama-3.1-405b", "gemma2-9b": "gemma-2-9b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
})


def get_model(model: str | TransformerConfig) -> TransformerConfig:
    """A preset by name (case-insensitive, a few aliases), or a TransformerConfig passed through."""
    if isinstance(model, TransformerConfig):
        return model
    if isinstance(model, str):
        key = model.strip().lower()
        key = ALIASES.get(key, key)
        if key in _presets():
            return _presets()[key]
    raise ValueError(f"model must be one of {', '.join(_presets())}, got {model!r}")
