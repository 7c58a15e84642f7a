"""A model of your own from its Hugging Face ``config.json``, offline and exact to the parameter.

:func:`model_from_config` reads a ``config.json`` file, a model directory holding one, or a
folder of a local Hugging Face cache (``models--ORG--NAME``, or its ``snapshots/HASH``) and
returns the catalogue's :class:`~zerolib.core.catalogue.models.TransformerConfig`, whose
:func:`~zerolib.core.catalogue.models.parameter_count` is what transformers' ``num_parameters()``
reports for the same config (tests/core/catalogue/test_hf_config.py builds each committed config
with transformers on the meta device and compares).

Each architecture is read as its transformers modeling file builds it (version 5), and a field
a config leaves out takes the default of that architecture's ``PretrainedConfig`` class (Gemma's
``tie_word_embeddings`` is True, Llama's False...). Three kinds of field are treated apart:

- fields that change no parameter (rotary scaling, sliding windows, soft-capping, partial
  rotary): named in the result's ``source``, so a reader sees they were read and left out;
- fields that change the architecture in a way a ``TransformerConfig`` cannot hold (cross
  attention in GPT-2, quantised weights, a vision tower): refused with one line naming the field,
  never approximated;
- encoders and encoder-decoders (BERT, T5, ...): refused, zerolib sizes decoder-only models;
- hybrids whose layers hold state-space models, recurrences or linear attention besides (or
  instead of) softmax attention (Jamba, Zamba, RecurrentGemma, Mamba...; :data:`HYBRIDS`):
  refused with a line saying what they are.

A decoder of another ``model_type`` is not read here: ``zerolib.crosscheck.transformers_model``
builds it with transformers (the validate extra) on PyTorch's meta device and reads what was
built; this module says so in one line when asked for one.

Every error is a ``ValueError`` naming the file (or ``config`` for a dict) and the field.
What is read is bounded before it is parsed: a file of at most :data:`MAX_CONFIG_BYTES` (a
regular file: a named pipe or a device is refused unread), JSON nested at most
:data:`MAX_CONFIG_DEPTH` levels and holding at most :data:`MAX_CONFIG_FIELDS` values
(:func:`config_from_text`), so that no input makes the reader recurse, wait or run long.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from zerolib.core.catalogue.models import MAX_MODEL_SIZE, TransformerConfig
from zerolib.core.inputs import echo, read_small_file

CONFIG_FILE = "config.json"
# Bounds on what is read (a published config.json is 1-10 kB, nests 2-4 levels (a vision
# tower's config inside the model's) and holds 30-300 values): far above any real config,
# small enough that a hostile file is refused in milliseconds.
MAX_CONFIG_BYTES = 1_000_000
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_FIELDS = 10_000

# Fields read and deliberately left out because no parameter depends on them.
NO_PARAMETER_FIELDS = (
    "rope_scaling", "rope_theta", "rope_parameters", "rope_local_base_freq", "partial_rotary_factor",
    "rotary_pct", "rotary_emb_base", "original_max_position_embeddings", "sliding_window",
    "use_sliding_window", "max_window_layers", "sliding_window_pattern", "layer_types",
    "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
    "use_parallel_residual", "pretraining_tp", "cache_implementation",
)
# Decoder-free model types (encoders, encoder-decoders) people may hand over by mistake.
ENCODER_TYPES = frozenset({
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2",
    "modernbert", "mpnet", "camembert", "t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian",
    "whisper", "longt5", "led", "prophetnet", "encoder-decoder", "switch_transformers",
})
# Hybrids: layers that are not (only) softmax attention and an MLP, which a TransformerConfig
# cannot describe; each named with what it is (from its transformers 5.24.0 modeling file).
_MAMBA = "state-space (Mamba) layers"
HYBRIDS = {
    "jamba": f"Jamba interleaves {_MAMBA} with attention layers (one in eight) and experts",
    "zamba": f"Zamba is a stack of {_MAMBA} with a shared attention block every few layers",
    "zamba2": "Zamba2 is a stack of Mamba-2 layers with shared attention blocks",
    "bamba": "Bamba interleaves Mamba-2 layers with a few attention layers",
    "falcon_h1": "Falcon-H1 runs attention and Mamba-2 heads side by side in every layer",
    "granitemoehybrid": "Granite 4.0's hybrid interleaves Mamba-2 layers with attention layers",
    "nemotron_h": "Nemotron-H interleaves Mamba-2 layers with a few attention layers",
    "recurrent_gemma": "RecurrentGemma (Griffin) has recurrent blocks (a gated linear recurrence, "
                       "RG-LRU) with local attention every third layer",
    "mamba": f"Mamba is made of {_MAMBA} alone, no attention",
    "mamba2": "Mamba-2 is made of state-space layers alone, no attention",
    "falcon_mamba": f"Falcon Mamba is made of {_MAMBA} alone, no attention",
    "rwkv": "RWKV is a recurrent model whose time mixing is a linear attention",
    "xlstm": "xLSTM is a recurrent model of LSTM cells with matrix memory, no attention",
    "minimax": "MiniMax-Text-01 interleaves lightning (linear) attention layers with softmax "
               "attention every eighth layer",
    "qwen3_next": "Qwen3-Next interleaves Gated DeltaNet (linear attention) layers with gated "
                  "softmax attention",
    "qwen3_5": "Qwen3.5 interleaves Gated DeltaNet (linear attention) layers with softmax attention",
    "qwen3_5_text": "Qwen3.5 interleaves Gated DeltaNet (linear attention) layers with softmax "
                    "attention",
    "qwen3_5_moe": "Qwen3.5-MoE interleaves Gated DeltaNet (linear attention) layers with softmax "
                   "attention",
    "olmo_hybrid": "OLMo Hybrid interleaves Gated DeltaNet (linear attention) layers with attention",
    "kimi_linear": "Kimi Linear interleaves delta-rule linear attention layers with latent attention",
    "lfm2": "LFM2 interleaves short gated convolutions with a few attention layers",
    "lfm2_moe": "LFM2-MoE interleaves short gated convolutions with a few attention layers",
}
EXTRA = "validate"    # the extra that installs transformers: pip install 'zerolib[validate]'


class _Fields:
    """One config's fields, read with errors that name the file and the field."""

    def __init__(self, data: Mapping, where: str):
        self.data, self.where = data, where

    def fail(self, message: str):
        raise ValueError(f"{self.where}: {message}")

    def whole(self, key: str, default=None, *, minimum: int = 1) -> int:
        """A whole-number field; absent or null, ``default`` (None: the field is required)."""
        value = self.data.get(key)
        if value is None:
            if default is None:
                self.fail(f"missing field {key}")
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_MODEL_SIZE:
            self.fail(f"field {key} must be a whole number from {minimum} to {MAX_MODEL_SIZE:,}, "
                      f"got {echo(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            value = default
        if not isinstance(value, bool):
            self.fail(f"field {key} must be true or false, got {echo(value)}")
        return value

    def first(self, *keys: str):
        """The first of several spellings present (GPT-2's n_embd is hidden_size elsewhere)."""
        for key in keys:
            if self.data.get(key) is not None:
                return key
        return keys[0]

    def refuse_if(self, key: str, present, why: str):
        if present:
            self.fail(f"field {key} ({echo(self.data.get(key))}): {why}; zerolib cannot express it")

    def dropout(self, *keys: str) -> bool:
        for key in keys:
            value = self.data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                self.fail(f"field {key} must be a number, got {echo(value)}")
        return any((self.data.get(key) or 0) > 0 for key in keys)


def _attention(r: _Fields, hidden: int, heads_key: str = "num_attention_heads",
               kv_key: str | None = "num_key_value_heads", head_dim_default=None):
    """heads, kv_heads and head_dim (None when hidden / heads), checked against each other."""
    heads = r.whole(heads_key)
    kv_heads = heads if kv_key is None or r.data.get(kv_key) is None else r.whole(kv_key)
    if heads % kv_heads:
        r.fail(f"field {kv_key} ({kv_heads}) must divide {heads_key} ({heads})")
    head_dim = r.data.get("head_dim", head_dim_default)
    if head_dim is None:
        if hidden % heads:
            r.fail(f"field head_dim is missing and hidden size {hidden} is not a multiple of "
                   f"{heads_key} ({heads}): the heads do not tile it")
        return heads, kv_heads, None
    head_dim = r.whole("head_dim", head_dim)
    return heads, kv_heads, None if head_dim * heads == hidden else head_dim


def _experts(r: _Fields, experts_key: str, per_token_key: str, experts_default, per_token_default):
    experts = r.whole(experts_key, experts_default)
    per_token = r.whole(per_token_key, per_token_default)
    if per_token > experts:
        r.fail(f"field {per_token_key} ({per_token}) must be at most {experts_key} ({experts})")
    return experts, per_token


def _llama_like(r: _Fields, *, tie_default: bool, qkv_bias: bool | None = None,
                attention_bias_key: str | None = "attention_bias", head_dim_default=None,
                **extra) -> dict:
    hidden = r.whole("hidden_size")
    heads, kv_heads, head_dim = _attention(r, hidden, head_dim_default=head_dim_default)
    attention_bias = False if attention_bias_key is None else r.flag(attention_bias_key, False)
    return dict(hidden=hidden, layers=r.whole("num_hidden_layers"), heads=heads, kv_heads=kv_heads,
                ffn_hidden=r.whole("intermediate_size"), vocab=r.whole("vocab_size"),
                max_positions=r.whole("max_position_embeddings", extra.pop("max_positions_default", 2048)),
                tied_embeddings=r.flag("tie_word_embeddings", tie_default), gated_mlp=True,
                norm="rmsnorm", position_embedding="rotary",
                qkv_bias=attention_bias if qkv_bias is None else qkv_bias, output_bias=attention_bias,
                mlp_bias=r.flag("mlp_bias", False) if "mlp_bias" in extra.pop("bias_fields", ()) else False,
                dropout=r.dropout("attention_dropout"), head_dim=head_dim, **extra)


def _llama(r):    # LlamaConfig: attention_bias on q, k, v and o; mlp_bias on the three MLP matrices
    return _llama_like(r, tie_default=False, bias_fields=("mlp_bias",))


def _mistral(r):  # MistralConfig: no biases (Linear(..., bias=False) throughout)
    return _llama_like(r, tie_default=False, attention_bias_key=None, max_positions_default=4096 * 32)


def _mixtral(r):  # MixtralConfig: num_local_experts 8, num_experts_per_tok 2 by default
    experts, per_token = _experts(r, "num_local_experts", "num_experts_per_tok", 8, 2)
    return _llama_like(r, tie_default=False, attention_bias_key=None, max_positions_default=4096 * 32,
                       experts=experts, experts_per_token=per_token)


def _qwen2(r):    # Qwen2Attention: q, k, v with bias, o without; no head_dim field
    return _llama_like(r, tie_default=False, qkv_bias=True, attention_bias_key=None,
                       max_positions_default=32768)


def _gemma(r):    # GemmaConfig: head_dim 256, tied; attention_bias on q, k, v and o
    return _llama_like(r, tie_default=True, head_dim_default=256, max_positions_default=8192)


def _gemma2(r):   # Gemma2: four RMSNorms per layer (post-attention, pre/post-feedforward)
    return _llama_like(r, tie_default=True, head_dim_default=256, max_positions_default=8192,
                       post_norms=True)


def _phi3(r):     # Phi3: one qkv_proj and one gate_up_proj module, no biases
    return _llama_like(r, tie_default=False, attention_bias_key=None, max_positions_default=4096,
                       fused_qkv=True, fused_gate_up=True)


def _gpt2(r):     # GPT2LMHeadModel: c_attn (fused, bias), c_proj, c_fc; learned positions; tied
    r.refuse_if("add_cross_attention", r.data.get("add_cross_attention"),
                "cross-attention layers belong to an encoder-decoder")
    hidden = r.whole(r.first("n_embd", "hidden_size"))
    heads, _, _ = _attention(r, hidden, heads_key=r.first("n_head", "num_attention_heads"), kv_key=None)
    inner = r.data.get("n_inner")
    return dict(hidden=hidden, layers=r.whole(r.first("n_layer", "num_hidden_layers")), heads=heads,
                kv_heads=heads, ffn_hidden=4 * hidden if inner is None else r.whole("n_inner"),
                vocab=r.whole("vocab_size", 50257),
                max_positions=r.whole(r.first("n_positions", "max_position_embeddings"), 1024),
                tied_embeddings=r.flag("tie_word_embeddings", True), gated_mlp=False, norm="layernorm",
                position_embedding="learned", qkv_bias=True, output_bias=True, mlp_bias=True,
                fused_qkv=True, dropout=r.dropout("resid_pdrop", "embd_pdrop", "attn_pdrop"))


def _gpt_neox(r):  # GPTNeoX: query_key_value and dense with attention_bias (default True), MLP biased
    hidden = r.whole("hidden_size")
    heads, _, _ = _attention(r, hidden, kv_key=None)
    bias = r.flag("attention_bias", True)
    return dict(hidden=hidden, layers=r.whole("num_hidden_layers"), heads=heads, kv_heads=heads,
                ffn_hidden=r.whole("intermediate_size"), vocab=r.whole("vocab_size"),
                max_positions=r.whole("max_position_embeddings", 2048),
                tied_embeddings=r.flag("tie_word_embeddings", False), gated_mlp=False,
                norm="layernorm", position_embedding="rotary", qkv_bias=bias, output_bias=bias,
                mlp_bias=True, fused_qkv=True,
                dropout=r.dropout("hidden_dropout", "attention_dropout"))


def _qwen3(r):    # Qwen3: q_norm and k_norm of head_dim; attention_bias on q, k, v and o
    return _llama_like(r, tie_default=False, head_dim_default=128, max_positions_default=32768,
                       qk_norm="head")


def _gemma3_text(r):  # Gemma3TextModel: Gemma-2's four norms plus q_norm and k_norm of head_dim
    return _llama_like(r, tie_default=True, head_dim_default=256, max_positions_default=131072,
                       post_norms=True, qk_norm="head")


def _olmo2(r):    # Olmo2: norms after attention and the MLP (two per layer), q_norm/k_norm whole
    return _llama_like(r, tie_default=False, max_positions_default=2048, qk_norm="projection")


def _sparse_everywhere(r: _Fields):
    """Qwen-MoE makes layer i sparse unless listed in mlp_only_layers or (i + 1) is not a
    multiple of decoder_sparse_step; zerolib's layers are all alike, so every one must be."""
    r.refuse_if("mlp_only_layers", r.data.get("mlp_only_layers"),
                "dense layers among sparse ones (zerolib's layers are all alike)")
    step = r.whole("decoder_sparse_step", 1)
    r.refuse_if("decoder_sparse_step", step != 1,
                "dense layers among sparse ones (zerolib's layers are all alike)")


def _qwen2_moe(r):  # Qwen2MoeSparseMoeBlock: routed experts, a shared expert and its sigmoid gate
    _sparse_everywhere(r)
    experts, per_token = _experts(r, "num_experts", "num_experts_per_tok", 60, 4)
    fields = _llama_like(r, tie_default=False, qkv_bias=r.flag("qkv_bias", True),
                         attention_bias_key=None, max_positions_default=32768,
                         experts=experts, experts_per_token=per_token,
                         shared_expert_ffn=r.whole("shared_expert_intermediate_size", 5632),
                         shared_expert_gate=True)
    fields["ffn_hidden"] = r.whole("moe_intermediate_size", 1408)   # each routed expert's width
    return fields


def _qwen3_moe(r):  # Qwen3MoeSparseMoeBlock: routed experts only; q_norm and k_norm of head_dim
    _sparse_everywhere(r)
    experts, per_token = _experts(r, "num_experts", "num_experts_per_tok", 128, 8)
    fields = _llama_like(r, tie_default=False, head_dim_default=128, max_positions_default=32768,
                         qk_norm="head", experts=experts, experts_per_token=per_token)
    fields["ffn_hidden"] = r.whole("moe_intermediate_size", 768)
    return fields


def _bloom(r):    # Bloom: fused biased qkv, a LayerNorm after the embedding, ALiBi, MLP 4h, tied
    hidden = r.whole(r.first("hidden_size", "n_embed"))
    heads, _, _ = _attention(r, hidden, heads_key=r.first("n_head", "num_attention_heads"), kv_key=None)
    return dict(hidden=hidden, layers=r.whole(r.first("n_layer", "num_hidden_layers")), heads=heads,
                kv_heads=heads, ffn_hidden=4 * hidden, vocab=r.whole("vocab_size", 250880),
                max_positions=r.whole("seq_length", 2048),
                tied_embeddings=r.flag("tie_word_embeddings", True), gated_mlp=False,
                norm="layernorm", position_embedding="alibi", qkv_bias=True, output_bias=True,
                mlp_bias=True, fused_qkv=True, embedding_norm=True,
                dropout=r.dropout("hidden_dropout", "attention_dropout"))


def _falcon(r):   # Falcon: fused qkv (multi-query or grouped), parallel attention, GeLU MLP
    hidden = r.whole("hidden_size")
    heads_key = r.first("num_attention_heads", "n_head")
    heads = r.whole(heads_key)
    new = r.flag("new_decoder_architecture", False)
    if new:
        kv_heads = r.whole("num_kv_heads") if r.data.get("num_kv_heads") is not None else heads
    else:
        kv_heads = 1 if r.flag("multi_query", True) else heads
    if heads % kv_heads:
        r.fail(f"field num_kv_heads ({kv_heads}) must divide {heads_key} ({heads})")
    if hidden % heads:
        r.fail(f"hidden size {hidden} is not a multiple of {heads_key} ({heads}): the heads do "
               f"not tile it")
    parallel = r.flag("parallel_attn", True)
    norms = r.data.get("num_ln_in_parallel_attn")
    one_norm = parallel and (norms == 1 or (norms is None and not new))
    bias = r.flag("bias", False)
    return dict(hidden=hidden, layers=r.whole(r.first("num_hidden_layers", "n_layer")), heads=heads,
                kv_heads=kv_heads, ffn_hidden=r.whole("ffn_hidden_size", 4 * hidden),
                vocab=r.whole("vocab_size", 65024), max_positions=r.whole("max_position_embeddings", 2048),
                tied_embeddings=r.flag("tie_word_embeddings", True), gated_mlp=False,
                norm="layernorm", position_embedding="alibi" if r.flag("alibi", False) else "rotary",
                qkv_bias=bias, output_bias=bias, mlp_bias=bias, fused_qkv=True, shared_norm=one_norm,
                dropout=r.dropout("hidden_dropout", "attention_dropout"))


def _deepseek(r):  # DeepseekV2/V3: latent attention, routed and shared experts, first dense layers
    r.refuse_if("moe_layer_freq", r.whole("moe_layer_freq", 1) != 1,
                "dense layers between the sparse ones (zerolib keeps the dense layers first)")
    r.refuse_if("mlp_bias", r.flag("mlp_bias", False), "biases on the dense and shared MLPs but "
                "not on the routed experts")
    hidden = r.whole("hidden_size")
    heads = r.whole("num_attention_heads")
    experts, per_token = _experts(r, "n_routed_experts", "num_experts_per_tok", None, None)
    layers = r.whole("num_hidden_layers")
    dense = r.whole("first_k_dense_replace", 0, minimum=0)
    if dense >= layers:
        r.fail(f"field first_k_dense_replace ({dense}) must be below num_hidden_layers ({layers})")
    moe_width = r.whole("moe_intermediate_size")
    # Absent, the config class's default 1536 (DeepseekV2Config, DeepseekV3Config); null: queries
    # are projected directly (DeepSeek-V2-Lite).
    q_rank = 0 if "q_lora_rank" in r.data and r.data["q_lora_rank"] is None else r.whole(
        "q_lora_rank", 1536)
    bias = r.flag("attention_bias", False)
    return dict(hidden=hidden, layers=layers, heads=heads, kv_heads=heads, ffn_hidden=moe_width,
                vocab=r.whole("vocab_size"), max_positions=r.whole("max_position_embeddings", 2048),
                tied_embeddings=r.flag("tie_word_embeddings", False), gated_mlp=True, norm="rmsnorm",
                position_embedding="rotary", qkv_bias=bias, output_bias=bias,
                head_dim=r.whole("qk_nope_head_dim"), kv_lora_rank=r.whole("kv_lora_rank"),
                q_lora_rank=q_rank, rope_head_dim=r.whole("qk_rope_head_dim"),
                v_head_dim=r.whole("v_head_dim"), experts=experts, experts_per_token=per_token,
                shared_expert_ffn=r.whole("n_shared_experts", 0, minimum=0) * moe_width,
                dense_layers=dense, dense_ffn_hidden=r.whole("intermediate_size") if dense else 0,
                dropout=r.dropout("attention_dropout"))


READERS = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "gemma": _gemma,
    "gemma2": _gemma2, "phi3": _phi3, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "qwen3": _qwen3,
    "gemma3_text": _gemma3_text, "olmo2": _olmo2, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe,
    "bloom": _bloom, "falcon": _falcon, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
}
# Fields whose parameters transformers does not build, so neither does zerolib (named in source).
NOT_BUILT_FIELDS = ("num_nextn_predict_layers",)


def hub_cache() -> Path:
    """The local Hugging Face Hub cache, where huggingface_hub keeps it: HF_HUB_CACHE, else
    HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "huggingface" / "hub"


def _config_file(path: Path) -> Path:
    """config.json of a file, a model directory, a Hugging Face cache folder, or a Hub name
    (ORG/NAME) already in the local cache (read offline: nothing is downloaded)."""
    if path.is_file() or (path.exists() and not path.is_dir()):
        return path     # a regular file, or a pipe or device that the reader refuses unread
    if not path.exists():
        if len(path.parts) == 2 and not path.is_absolute():     # ORG/NAME: the local Hub cache
            cached = hub_cache() / f"models--{path.parts[0]}--{path.parts[1]}"
            if cached.is_dir():
                return _config_file(cached)
            raise ValueError(f"{path}: no such file or directory (nor, as a Hub name, in the local "
                             f"cache {hub_cache()})")
        raise ValueError(f"{path}: no such file or directory")
    if (path / CONFIG_FILE).is_file():
        return path / CONFIG_FILE
    snapshots = path / "snapshots"
    if path.name.startswith("models--") and snapshots.is_dir():
        ref = path / "refs" / "main"
        commit = read_small_file(ref, "a commit hash", 1024).strip() if ref.is_file() else ""
        if commit and "/" not in commit and (snapshots / commit / CONFIG_FILE).is_file():
            return snapshots / commit / CONFIG_FILE
        found = sorted(snapshots.glob(f"*/{CONFIG_FILE}"))
        if len(found) == 1:
            return found[0]
        if found:
            raise ValueError(f"{path}: {len(found)} snapshots hold a {CONFIG_FILE} and refs/main "
                             f"names none of them; pass one snapshots/HASH folder")
    raise ValueError(f"{path}: directory without {CONFIG_FILE}")


def config_name(path: Path | None, data: Mapping) -> str:
    """The name a model read from ``path`` (or a dict, ``path`` None) goes by: the cache's
    ORG/NAME, else the folder's name, else the config's ``_name_or_path`` or model_type."""
    if path is not None:
        for part in reversed(path.parts):
            if part.startswith("models--"):    # the cache's models--ORG--NAME
                return part[len("models--"):].replace("--", "/")
        folder = path.parent.name if path.name == CONFIG_FILE else path.stem
        if folder and folder != "snapshots":
            return folder
    given = name_or_path(data)
    return given or str(data.get("model_type"))


def name_or_path(data: Mapping) -> str:
    """The config's ``_name_or_path`` (what transformers records on saving it: a Hub name such as
    ``Qwen/Qwen2.5-14B``, or a folder), cut to its last two parts and 100 characters; "" when
    absent."""
    given = data.get("_name_or_path")
    if not isinstance(given, str):
        return ""
    given = "/".join(given.strip().replace("\\", "/").rstrip("/").split("/")[-2:])
    return given if given.isprintable() and len(given) <= 100 else ""


# A JSON string (its closing quote optional, so an unterminated one ends the scan) and the colon
# that makes it a key, or a bracket.
_JSON_TOKENS = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*"?)(\s*:)?|[\[\]{}]')


def _too_deep(text: str) -> str | None:
    """None when ``text`` nests at most :data:`MAX_CONFIG_DEPTH` levels; else the top-level key
    under which it goes deeper ("" when the text is not an object). Scanned, not parsed: a
    parser recurses once per level."""
    depth, key = 0, ""
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token[0] == '"':
            if depth == 1 and match.group(2):
                key = match.group(1)
        elif token in "[{":
            depth += 1
            if depth > MAX_CONFIG_DEPTH:
                return key
        else:
            depth -= 1
    return None


def _key_words(key) -> str:
    if isinstance(key, str) and key.startswith('"'):
        try:
            key = json.loads(key)
        except ValueError:
            key = key.strip('"')
    return f"field {echo(key) if not isinstance(key, str) or not key.isprintable() or len(key) > 40 else key}"


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON number")


def check_config_shape(data: Mapping, where: str, what: str = "a config.json") -> None:
    """ValueError unless ``data`` nests at most :data:`MAX_CONFIG_DEPTH` levels and holds at
    most :data:`MAX_CONFIG_FIELDS` values (walked without recursion: a Python dict may nest
    without end, or hold itself)."""
    count = 0
    stack = [(data, 1, None)]
    while stack:
        node, depth, top = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise ValueError(f"{where}: {_key_words(top)} nests more than {MAX_CONFIG_DEPTH} "
                             f"levels deep; {what} nests a few")
        items = node.items() if isinstance(node, Mapping) else enumerate(node)
        for key, child in items:
            count += 1
            if count > MAX_CONFIG_FIELDS:
                raise ValueError(f"{where}: more than {MAX_CONFIG_FIELDS:,} values (the last read "
                                 f"in {_key_words(key if top is None else top)}); {what} "
                                 f"holds a few hundred")
            if isinstance(child, (Mapping, list, tuple)):
                stack.append((child, depth + 1, key if top is None else top))


def config_from_text(text: str, where: str, what: str = "a config.json") -> dict:
    """The JSON object of a config.json's text, bounded (see the module doc): a ValueError naming
    ``where`` and, where one is to blame, the field, for text that is too long, nested too deep,
    not JSON, not an object, or holding too many values."""
    if not isinstance(text, str):
        raise TypeError(f"{where}: {what}'s text must be a string, got {type(text).__name__}")
    if len(text) > MAX_CONFIG_BYTES:
        raise ValueError(f"{where}: {len(text):,} characters; {what} is read up to "
                         f"{MAX_CONFIG_BYTES:,} bytes")
    deep = _too_deep(text)
    if deep is not None:
        field = _key_words(deep) if deep else "the text"
        raise ValueError(f"{where}: {field} nests more than {MAX_CONFIG_DEPTH} levels deep; "
                         f"{what} nests a few")
    try:
        data = json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: malformed JSON (line {error.lineno}, column {error.colno}: "
                         f"{error.msg})") from None
    except (ValueError, RecursionError) as error:   # a number of more than 4,300 digits...
        raise ValueError(f"{where}: malformed JSON ({' '.join(str(error).split())[:100]})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: {what} holds one JSON object, got {type(data).__name__}")
    check_config_shape(data, where, what)
    return data


def read_config(source, where: str = "config") -> tuple[dict, str, Path | None]:
    """(fields, where, file) of a config.json path, directory, cache folder or mapping
    (``where`` names a mapping in messages)."""
    if isinstance(source, Mapping):
        check_config_shape(source, where)
        return dict(source), where, None
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"config must be a path to a config.json, a model directory or a dict, "
                        f"got {type(source).__name__}")
    file = _config_file(Path(source).expanduser())
    text = read_small_file(file, "a config.json", MAX_CONFIG_BYTES)
    return config_from_text(text, str(file)), str(file), file


def check_decoder(data: Mapping, where: str) -> str:
    """The ``model_type`` of a config that may describe a decoder zerolib sizes; a ValueError
    naming ``where`` and the field for a missing or bad model_type, an encoder or
    encoder-decoder, a hybrid (:data:`HYBRIDS`), quantised weights or a vision tower."""
    r = _Fields(data, where)
    model_type = data.get("model_type")
    if model_type is None:
        r.fail("missing field model_type")
    if not isinstance(model_type, str):
        r.fail(f"field model_type must be a string such as \"llama\", got {echo(model_type)}")
    if r.flag("is_encoder_decoder", False):
        r.fail(f"field is_encoder_decoder: model_type {echo(model_type)} is an encoder-decoder; zerolib "
               f"sizes decoder-only models")
    if model_type in ENCODER_TYPES:
        r.fail(f"field model_type: {echo(model_type)} is an encoder or encoder-decoder; zerolib sizes "
               f"decoder-only models")
    if model_type in HYBRIDS:
        r.fail(f"field model_type: {echo(model_type)} is a hybrid, not a transformer of attention "
               f"and MLP layers: {HYBRIDS[model_type]}; zerolib cannot express it")
    for key, why in (("quantization_config", "quantised weights are not the 16-bit parameters a "
                      "training layout counts"),
                     ("vision_config", "a vision tower's parameters are not a decoder's")):
        r.refuse_if(key, key in data, why)
    return model_type


def model_from_config(source, *, name: str | None = None, where: str = "config") -> TransformerConfig:
    """The :class:`TransformerConfig` a Hugging Face ``config.json`` describes, exact to the parameter.

    ``source``: a path to a ``config.json``, a directory holding one, a local Hugging Face cache
    folder (``models--ORG--NAME`` or its ``snapshots/HASH``), a Hub name ``ORG/NAME`` already in
    the local cache (:func:`hub_cache`; offline, nothing is downloaded), or the config as a dict. ``name``
    overrides the name read from the path (the cache's ORG/NAME, else the folder's name);
    ``where`` is what messages call a dict (an uploaded file's name, say). The architectures of
    :data:`READERS` only; ``zerolib.crosscheck.transformers_model.model_from_any_config`` reads
    any decoder transformers builds.
    """
    data, where, file = read_config(source, where)
    model_type = check_decoder(data, where)
    r = _Fields(data, where)
    if model_type not in READERS:
        r.fail(f"field model_type: {echo(model_type)} is not one zerolib reads natively (it reads "
               f"{', '.join(sorted(READERS))}); any other decoder is built with transformers: "
               f"zerolib estimate --config and zl.model_from_any_config read it where the "
               f"{EXTRA} extra is installed (pip install 'zerolib[{EXTRA}]')")
    fields = READERS[model_type](r)
    ignored = [key for key in NO_PARAMETER_FIELDS if data.get(key) not in (None, False)]
    source_text = f"read from {where} (model_type {model_type})"
    if ignored:
        source_text += f"; fields that change no parameter: {', '.join(ignored)}"
    not_built = [key for key in NOT_BUILT_FIELDS if data.get(key)]
    if not_built:   # DeepSeek-V3's multi-token prediction layer: in the checkpoint, not the model
        source_text += (f"; not built by transformers and not counted: "
                        f"{', '.join(f'{key} {data[key]}' for key in not_built)}")
    try:
        return TransformerConfig(name or config_name(file, data), source=source_text, **fields)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None
