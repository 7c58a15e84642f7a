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
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from zerolib.core.inputs import check_positive_int

NORMS = ("layernorm", "rmsnorm")            # layernorm: weight + bias; rmsnorm: weight only
POSITION_EMBEDDINGS = ("learned", "rotary")  # rotary has no parameters
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

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError("name must be a non-empty string")
        for name in ("hidden", "layers", "heads", "kv_heads", "ffn_hidden", "vocab", "max_positions"):
            if not isinstance(getattr(self, name), int):   # whole numbers, not 4096.0
                raise TypeError(f"{name} must be a positive whole number, got {getattr(self, name)!r}")
            check_positive_int(getattr(self, name), name, MAX_MODEL_SIZE)
        for name in ("tied_embeddings", "gated_mlp", "qkv_bias", "output_bias", "mlp_bias",
                     "fused_qkv", "dropout"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding must be one of {', '.join(POSITION_EMBEDDINGS)}, "
                             f"got {self.position_embedding!r}")
        if not isinstance(self.source, str):
            raise TypeError("source must be a string")

    def __deepcopy__(self, memo) -> TransformerConfig:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """Width of the key (or value) projection: kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

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


def modules(config: TransformerConfig) -> tuple[Module, ...]:
    """Every parameter-holding module, in model order, with its own element count."""
    h, f, v = config.hidden, config.ffn_hidden, config.vocab
    q, kv = config.hidden, config.kv_hidden  # query width a * head_dim = h
    norm = 2 * h if config.norm == "layernorm" else h
    L = config.layers

    def linear(n_in, n_out, bias):
        return n_in * n_out + (n_out if bias else 0)

    out = [Module("embedding", v * h)]
    if config.position_embedding == "learned":
        out.append(Module("position_embedding", config.max_positions * h))
    out.append(Module("attention_norm", norm, L))
    if config.fused_qkv:
        out.append(Module("qkv_projection", linear(h, q + 2 * kv, config.qkv_bias), L))
    else:
        out += [Module("query_projection", linear(h, q, config.qkv_bias), L),
                Module("key_projection", linear(h, kv, config.qkv_bias), L),
                Module("value_projection", linear(h, kv, config.qkv_bias), L)]
    out.append(Module("attention_output_projection", linear(q, h, config.output_bias), L))
    out.append(Module("mlp_norm", norm, L))
    if config.gated_mlp:
        out += [Module("mlp_gate_projection", linear(h, f, config.mlp_bias), L),
                Module("mlp_up_projection", linear(h, f, config.mlp_bias), L),
                Module("mlp_down_projection", linear(f, h, config.mlp_bias), L)]
    else:
        out += [Module("mlp_up_projection", linear(h, f, config.mlp_bias), L),
                Module("mlp_down_projection", linear(f, h, config.mlp_bias), L)]
    out.append(Module("final_norm", norm))
    # The output projection (no bias in any preset). Tied: the embedding's own matrix.
    out.append(Module("output_projection", v * h, shared=config.tied_embeddings))
    return tuple(out)


def parameter_count(config: TransformerConfig | str) -> int:
    """Exact trainable parameters (a tied output projection counted once; no buffers)."""
    return sum(m.elements * m.count for m in modules(get_model(config)) if not m.shared)


def largest_layer(config: TransformerConfig | str) -> int:
    """Elements of the largest single module (DeepSpeed's ``largest_layer_params``)."""
    return max(m.elements for m in modules(get_model(config)))


def _llama(name, hidden, layers, heads, kv_heads, ffn_hidden, vocab, max_positions, source,
           **extra) -> TransformerConfig:
    return TransformerConfig(name, hidden, layers, heads, kv_heads, ffn_hidden, vocab, max_positions,
                             tied_embeddings=False, gated_mlp=True, norm="rmsnorm",
                             position_embedding="rotary", source=source, **extra)


# Each source names the configuration (Hugging Face config.json) and where the total is
# published; tests/test_models.py checks parameter_count against each published total.
MODELS: Mapping[str, TransformerConfig] = MappingProxyType({m.name: m for m in (
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
)})

# Other spellings people type.
ALIASES: Mapping[str, str] = MappingProxyType({
    "gpt2-small": "gpt2", "gpt-2": "gpt2",
    "meta-llama-3-8b": "llama-3-8b", "meta-llama-3-70b": "llama-3-70b",
    "mistral-7b": "mistral-7b-v0.1", "qwen2.5-7b-instruct": "qwen2.5-7b",
})


def get_model(model: str | TransformerConfig) -> TransformerConfig:
    """A preset by name (case-insensitive, a few aliases), or a TransformerConfig passed through."""
    if isinstance(model, TransformerConfig):
        return model
    if isinstance(model, str):
        key = model.strip().lower()
        key = ALIASES.get(key, key)
        if key in MODELS:
            return MODELS[key]
    raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
