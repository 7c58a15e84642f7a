"""Any decoder transformers can build, read from what it builds: exact to the parameter.

:func:`model_from_any_config` reads a ``config.json`` (a file, a model folder, a Hugging Face
cache folder or a dict, as :func:`zerolib.core.catalogue.hf_config.model_from_config` does).
Where zerolib's own reader knows the ``model_type`` it answers; for any other decoder,
:func:`model_from_transformers` builds the model with transformers on PyTorch's meta device
(``AutoModelForCausalLM.from_config`` under ``torch.device("meta")``: shapes, no storage, no
download, none of a model repository's own code) and reads what was built into a
:class:`~zerolib.core.catalogue.models.TransformerConfig`:

- the embedding (vocabulary x hidden), a learned position table, the output projection (absent
  from the parameters when tied; its bias, Phi-3.5-MoE's ``lm_head_bias``), the final norm and a
  norm after the embedding;
- each layer's attention projections (separate or one fused qkv; heads from the config, their
  width and the key/value heads from the shapes), their biases, norms on queries and keys (per
  head, or over the projection), the norms of the layer (one: attention and MLP side by side; two;
  four: after attention and after the MLP too) and their kind (a bias: LayerNorm; none: RMSNorm),
  the MLP (gated or not, fused gate and up, biases) or the experts (their count, width and router,
  a shared expert and its gate; dense first layers);
- every layer must be alike (but dense first layers before the sparse ones), every parameter
  must have a place, and the description's :func:`~zerolib.core.catalogue.models.parameter_count`
  must equal what transformers built, to the parameter: otherwise the config is refused in one
  line saying what is left over.

What is approximated is named in the result's ``source``: a LayerNorm without a bias (Cohere's)
counted as its weight, as an RMSNorm is; fields that scale activations but hold no parameter
(Granite's multipliers, Cohere's logit scale...). Hybrids (state-space, recurrent or
linear-attention layers: :data:`zerolib.core.catalogue.hf_config.HYBRIDS`, or found among the
modules built) are refused with what they are.

Bounded: the config is read as every config is (size, depth, values); before anything is built
its layer and expert counts and a first estimate of its size are checked
(:data:`MAX_BUILD_LAYERS`, :data:`MAX_BUILD_EXPERTS`, :data:`~zerolib.core.inputs.MAX_PARAMS`);
the build runs in a process of its own, stopped after ``time_limit`` seconds
(:data:`BUILD_SECONDS`). Without transformers (the validate extra) one line says which extra
reads it.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from zerolib.core.catalogue.hf_config import (
    EXTRA,
    NO_PARAMETER_FIELDS,
    READERS,
    check_decoder,
    config_name,
    model_from_config,
    read_config,
)
from zerolib.core.catalogue.models import MAX_MODEL_SIZE, TransformerConfig, parameter_count
from zerolib.core.inputs import MAX_PARAMS, echo

BUILD_SECONDS = 120.0     # a 61-layer, 256-expert model builds on the meta device in seconds
MAX_BUILD_LAYERS = 1_024  # published decoders have up to ~130 layers
MAX_BUILD_EXPERTS = 4_096  # ... and up to a few hundred routed experts per layer
MAX_BUILD_SECONDS = 600.0

# Where a config names its sizes (the first spelling present).
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "n_embed", "dim")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
_FFN_KEYS = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", "moe_intermediate_size")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_top_k", "top_k",
               "experts_per_token", "num_selected_experts", "router_topk", "moe_k")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
DEFAULT_MAX_POSITIONS = 4_096   # a config that names no context length: the sequence default
# Module names of what transformers' decoders build (the last part of a parameter's module).
_ATTENTION = {"self_attn", "attn", "attention", "self_attention"}
_MLP = {"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "feedforward"}
_SHARED = {"shared_expert", "shared_experts", "shared_mlp"}
_Q, _K, _V = {"q_proj", "query", "wq"}, {"k_proj", "key", "wk"}, {"v_proj", "value", "wv"}
_QKV = {"qkv_proj", "query_key_value", "c_attn", "wqkv", "w_pack", "qkv"}
_O = {"o_proj", "dense", "c_proj", "out_proj", "wo"}
_Q_NORM = {"q_norm", "q_layernorm", "query_layernorm", "q_ln"}
_K_NORM = {"k_norm", "k_layernorm", "key_layernorm", "k_ln"}
_GATE, _UP = {"gate_proj", "w1"}, {"up_proj", "w3", "c_fc", "fc1", "dense_h_to_4h", "fc_in"}
_DOWN = {"down_proj", "w2", "c_proj", "fc2", "dense_4h_to_h", "fc_out", "output_linear"}
_GATE_UP = {"gate_up_proj", "input_linear"}
_ROUTER = {"gate", "router", "wg"}
_EMBEDDING = {"embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings"}
_POSITION = {"embed_positions", "wpe", "position_embeddings"}
_HEAD = {"lm_head", "embed_out", "output"}
# Module classes of layers that are not attention and an MLP (hybrids transformers builds).
_HYBRID_MODULES = re.compile(r"Mamba|Mixer|GatedDeltaNet|DeltaAttention|LinearAttention|Lightning"
                             r"|Rglru|RecurrentBlock|ShortConv|Rwkv|xLSTM|Ssm|SSM")
# Config fields that scale activations or logits and hold no parameter.
_SCALES = re.compile(r"multiplier|scal(e|ing)$|logit_scale|clip_qkv|softcap|jitter")
_NOT_DROPOUT = {"classifier_dropout", "summary_first_dropout"}


@dataclass(frozen=True)
class Built:
    """What transformers built, as plain data: its parameters (name, shape), tied ones once
    (``named_parameters()``), their total, the classes of its modules and the resolved config."""

    model_type: str
    class_name: str
    total: int
    parameters: tuple
    module_classes: tuple
    config: Mapping
    versions: str = ""


def transformers_installed() -> bool:
    """Whether torch and transformers can be imported (found, not imported: importing them takes
    seconds)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def model_from_any_config(source, *, name: str | None = None, where: str = "config",
                          time_limit: float = BUILD_SECONDS) -> TransformerConfig:
    """The :class:`TransformerConfig` of a decoder's ``config.json``: zerolib's own reader for
    the architectures it knows (:data:`~zerolib.core.catalogue.hf_config.READERS`), else
    :func:`model_from_transformers`. ``source``, ``name`` and ``where`` as
    :func:`~zerolib.core.catalogue.hf_config.model_from_config` takes them."""
    data, where, file = read_config(source, where)
    if check_decoder(data, where) in READERS:
        return model_from_config(data, name=name or config_name(file, data), where=where)
    return _from_transformers(data, where, name or config_name(file, data), time_limit)


def model_from_transformers(source, *, name: str | None = None, where: str = "config",
                            time_limit: float = BUILD_SECONDS) -> TransformerConfig:
    """The :class:`TransformerConfig` of what transformers builds from a ``config.json`` on the
    meta device (see the module doc), whatever its ``model_type``; a ``ValueError`` naming
    ``where`` for a config it cannot build or zerolib cannot express, or one that takes longer
    than ``time_limit`` seconds to build."""
    data, where, file = read_config(source, where)
    check_decoder(data, where)
    return _from_transformers(data, where, name or config_name(file, data), time_limit)


def _from_transformers(data: dict, where: str, name: str, time_limit: float) -> TransformerConfig:
    model_type = data["model_type"]
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) \
            or not 0 < time_limit <= MAX_BUILD_SECONDS:
        raise ValueError(f"time_limit must be seconds in (0, {MAX_BUILD_SECONDS:g}], got {echo(time_limit)}")
    if not transformers_installed():
        raise ValueError(f"{where}: field model_type: {echo(model_type)} is read by building it with "
                         f"transformers, which is not installed: pip install 'zerolib[{EXTRA}]'")
    check_build_size(data, where)
    try:
        built = build(data, time_limit)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    return config_from_built(built, name=name, where=where)


def _first(data: Mapping, keys) -> tuple[str | None, object]:
    for key in keys:
        if data.get(key) is not None:
            return key, data[key]
    return None, None


def check_build_size(data: Mapping, where: str) -> None:
    """ValueError, before anything is built, for a config whose layers, experts or first
    estimate of parameters are beyond any decoder zerolib sizes (each size a whole number where
    given)."""
    sizes = {}
    for keys, bound in ((_LAYER_KEYS, MAX_BUILD_LAYERS), (_EXPERT_KEYS, MAX_BUILD_EXPERTS),
                        (_HIDDEN_KEYS, MAX_MODEL_SIZE), (_FFN_KEYS, MAX_MODEL_SIZE),
                        (("vocab_size",), MAX_MODEL_SIZE)):
        key, value = _first(data, keys)
        if key is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bound:
            raise ValueError(f"{where}: field {key} must be a whole number from 0 to {bound:,} to be "
                             f"built, got {echo(value)}")
        sizes[keys[0]] = value
    h, f = sizes.get(_HIDDEN_KEYS[0], 0), sizes.get(_FFN_KEYS[0], 0)
    estimate = (sizes.get(_LAYER_KEYS[0], 0) * (4 * h * h + 3 * h * f * max(sizes.get(_EXPERT_KEYS[0], 1), 1))
                + 2 * sizes.get("vocab_size", 0) * h)
    if estimate > MAX_PARAMS:
        raise ValueError(f"{where}: about {estimate:.2g} parameters (layers x (4 h^2 + 3 h f x experts) "
                         f"+ 2 vocab x h); zerolib sizes models of at most {MAX_PARAMS:.0e}")


def build(data: Mapping, time_limit: float = BUILD_SECONDS) -> Built:
    """Build ``data`` (a config's fields) with transformers on the meta device in a Python
    process of its own (``python -m zerolib.crosscheck.transformers_model``: the config in on
    stdin, what was built out on stdout as JSON), stopped after ``time_limit`` seconds; what was
    built as :class:`Built`."""
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(dict(data)),
                              capture_output=True, text=True, timeout=time_limit, check=False)
    except subprocess.TimeoutExpired:    # a ValueError: a reader's bound, said in one line
        raise ValueError(f"transformers took longer than {time_limit:g} s to build model_type "
                         f"{data.get('model_type')!r} on the meta device (a bound of this reader)") from None
    try:
        result = json.loads(done.stdout)
    except ValueError:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1][:300]
        raise ValueError(f"the build's process ended without an answer (exit code "
                         f"{done.returncode}: {last})") from None
    if "error" in result:
        raise ValueError(result["error"])
    result["parameters"] = tuple((name, tuple(shape)) for name, shape in result["parameters"])
    result["module_classes"] = tuple(result["module_classes"])
    return Built(**result)


def main() -> None:
    """The build's process: a config's fields in on stdin, :func:`summary_of` (or the error, in
    one line) out on stdout."""
    data = json.loads(sys.stdin.read())
    try:
        out = summary_of(data)
    except Exception as error:   # noqa: BLE001 - the parent reports it as one line
        text = " ".join(str(error).split())[:300]
        out = {"error": f"transformers cannot build model_type {data.get('model_type')!r}: "
                        f"{type(error).__name__}: {text}"}
    sys.stdout.write(json.dumps(out))


def summary_of(data: Mapping) -> dict:
    """Build ``data`` with transformers on the meta device in this process; what was built as
    :class:`Built`'s fields (plain data)."""
    import warnings

    import torch
    import transformers
    from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    model_type = data["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise LookupError(f"transformers {transformers.__version__} has no model_type {model_type!r} "
                          f"(a model repository's own code is not run)")
    fields = {key: value for key, value in data.items() if key not in ("auto_map", "model_type")}
    config = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    owners = {name: type(module).__name__ for name, module in model.named_modules()}
    parameters = tuple((name, _shape(p.shape, owners.get(name.rpartition(".")[0], "")))
                       for name, p in model.named_parameters())
    plain = {key: value for key, value in config.to_dict().items()
             if value is None or isinstance(value, (bool, int, float, str))}
    for key in ("head_dim", "num_key_value_heads", "num_attention_heads", "tie_word_embeddings"):
        value = getattr(config, key, None)
        if value is None or isinstance(value, (bool, int, float, str)):
            plain.setdefault(key, value)
    return {"model_type": model_type, "class_name": type(model).__name__,
            "total": sum(_numel(shape) for _, shape in parameters), "parameters": parameters,
            "module_classes": tuple(sorted({type(m).__name__ for m in model.modules()})),
            "config": plain, "versions": f"transformers {transformers.__version__}, torch "
                                          f"{torch.__version__.split('+')[0]}"}


def _shape(shape, owner: str) -> tuple[int, ...]:
    """A parameter's shape as nn.Linear has it (out, in): transformers' Conv1D (GPT-2's) keeps
    its weight as (in, out)."""
    shape = tuple(int(n) for n in shape)
    return shape[::-1] if owner == "Conv1D" and len(shape) == 2 else shape


def _numel(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


class _Refused(ValueError):
    pass


@dataclass
class _Layer:
    """One layer read from its parameters."""

    norms: dict      # module -> elements (weight + bias) and whether it has a bias
    attention: dict  # q, k, v, qkv, o -> (out, in, bias); q_norm, k_norm -> elements
    mlp: dict        # gate, up, down, gate_up -> (out, in, bias)
    experts: dict    # gate_up, gate, up, down -> shape; "count"; biases
    router: tuple | None
    shared: dict     # the shared expert's gate, up, down, gate_up
    shared_gate: tuple | None


def _split(name: str) -> tuple[list[str], str]:
    parts = name.split(".")
    return parts[:-1], parts[-1]


_LAYER = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


def config_from_built(built: Built, *, name: str, where: str = "config") -> TransformerConfig:
    """The :class:`TransformerConfig` of what transformers built (see the module doc): a
    ``ValueError`` naming ``where`` and what cannot be expressed."""
    try:
        return _read(built, name, where)
    except _Refused as error:
        raise ValueError(f"{where}: {error} ({built.class_name}, built by "
                         f"{built.versions or 'transformers'})") from None


def _read(built: Built, name: str, where: str) -> TransformerConfig:
    c = built.config
    hybrid = sorted(m for m in built.module_classes if _HYBRID_MODULES.search(m))
    if hybrid:
        raise _Refused(f"model_type {built.model_type!r} is a hybrid, not a transformer of attention "
                       f"and MLP layers: transformers builds {', '.join(hybrid[:4])}; zerolib cannot "
                       f"express it")
    layers: dict[int, dict] = {}
    outside: dict[str, tuple] = {}
    prefix = None
    for param, shape in built.parameters:
        match = _LAYER.match(param)
        if match and (prefix is None or match.group(1) == prefix):
            prefix = match.group(1)
            layers.setdefault(int(match.group(2)), {})[match.group(3)] = tuple(shape)
        else:
            outside[param] = tuple(shape)
    if not layers:
        raise _Refused("no layers found among the parameters")
    count = len(layers)
    if sorted(layers) != list(range(count)):
        raise _Refused(f"layers numbered {sorted(layers)[:5]}...: not 0 to {count - 1}")
    embedding, position, head, head_bias, final_norm, embedding_norm = _outside(outside)
    vocab, hidden = embedding
    read = [_layer(index, layers[index], hidden) for index in range(count)]
    notes: list[str] = []
    heads_key, heads = _first(c, _HEAD_KEYS)
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        raise _Refused("the config names no attention heads (num_attention_heads)")
    attention = _attention(read[0], hidden, heads)
    norms = _norms(read[0], built, notes)
    dense = [layer for layer in read if not layer.experts]
    sparse = [layer for layer in read if layer.experts]
    first_sparse = next((i for i, layer in enumerate(read) if layer.experts), count)
    if any(not layer.experts for layer in read[first_sparse:]):
        raise _Refused("dense layers between the sparse ones (zerolib keeps the dense layers first)")
    for index, layer in enumerate(read[1:], 1):
        if (layer.norms, layer.attention) != (read[0].norms, read[0].attention):
            raise _Refused(f"layer {index}'s attention or norms differ from layer 0's (zerolib's "
                           f"layers are all alike)")
    fields = dict(hidden=hidden, layers=count, vocab=vocab, heads=heads, **attention, **norms)
    if sparse:
        fields.update(_experts(sparse, c, hidden))
        if dense:
            dense_mlp = _dense_mlp(dense, hidden)
            if dense_mlp["gated_mlp"] != fields["gated_mlp"] or dense_mlp["mlp_bias"] != fields["mlp_bias"]:
                raise _Refused("the dense first layers' MLP is not of the experts' kind")
            fields.update(dense_layers=len(dense), dense_ffn_hidden=dense_mlp["ffn_hidden"])
    else:
        fields.update(_dense_mlp(dense, hidden))
    if head is not None and head != (vocab, hidden):
        raise _Refused(f"an output projection of {head} where the embedding is {(vocab, hidden)}")
    if head_bias is not None and head is None:
        raise _Refused("a bias on a tied output projection")
    fields.update(tied_embeddings=head is None, output_projection_bias=head_bias is not None,
                  embedding_norm=embedding_norm, dropout=_dropout(c))
    if final_norm is None:
        raise _Refused("no final norm among the parameters")
    if (final_norm[1] == 2 * hidden) != (fields["norm"] == "layernorm"):
        raise _Refused("the final norm is not of the layers' kind")
    if position is not None:
        fields.update(position_embedding="learned", max_positions=position[0])
        if position[1] != hidden:
            raise _Refused(f"a position table of {position} for a hidden size of {hidden}")
    else:
        rotary = any("Rotary" in m for m in built.module_classes)
        fields["position_embedding"] = "rotary" if rotary else "alibi" if c.get("alibi") else "none"
        key, value = _first(c, _POSITION_KEYS)
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_MODEL_SIZE:
            fields["max_positions"] = value
        else:
            fields["max_positions"] = DEFAULT_MAX_POSITIONS
            notes.append(f"no context length in the config: {DEFAULT_MAX_POSITIONS:,} taken")
    scales = sorted(key for key, value in c.items() if _SCALES.search(key) and value not in (None, False, 0, 1, 1.0))
    unread = [key for key in NO_PARAMETER_FIELDS if c.get(key) not in (None, False)]
    if scales or unread:
        notes.append(f"fields that change no parameter: {', '.join([*unread, *scales])}")
    source = (f"built by {built.versions or 'transformers'} on the meta device from {where} (model_type "
              f"{built.model_type}, {built.class_name}: {built.total:,} parameters)"
              + "".join(f"; {note}" for note in notes))
    try:
        config = TransformerConfig(name, source=source, **fields)
    except (TypeError, ValueError) as error:
        raise _Refused(str(error)) from None
    counted = parameter_count(config)
    if counted != built.total:
        raise _Refused(f"transformers builds {built.total:,} parameters; read as zerolib's "
                       f"description they are {counted:,} ({counted - built.total:+,}): zerolib "
                       f"cannot express this architecture exactly")
    return config


def _outside(outside: Mapping[str, tuple]):
    embedding = position = head = head_bias = final_norm = None
    embedding_norm = False
    for param, shape in outside.items():
        path, leaf = _split(param)
        module = path[-1] if path else leaf
        if module in _EMBEDDING and leaf == "weight" and len(shape) == 2:
            embedding = shape
        elif module in _POSITION and leaf == "weight" and len(shape) == 2:
            position = shape
        elif module in _HEAD and len(path) == 1:
            if leaf == "weight":
                head = shape
            else:
                head_bias = shape
        elif _is_norm(module):
            if "emb" in module:
                embedding_norm = True
            elif final_norm is not None and final_norm[0] != module:
                raise _Refused(f"two norms outside the layers ({final_norm[0]}, {module})")
            else:
                final_norm = (module, (final_norm[1] if final_norm else 0) + _numel(shape))
        else:
            raise _Refused(f"transformers builds {param} {shape}, which zerolib's description has "
                           f"no place for")
    if embedding is None:
        raise _Refused("no token embedding among the parameters")
    return embedding, position, head, head_bias, final_norm, embedding_norm


def _is_norm(module: str) -> bool:
    return "norm" in module or re.fullmatch(r"ln(_\w+)?", module) is not None


def _layer(index: int, params: Mapping[str, tuple], hidden: int) -> _Layer:
    layer = _Layer(norms={}, attention={}, mlp={}, experts={}, router=None, shared={}, shared_gate=None)
    expert_ids: set[str] = set()
    for suffix, shape in params.items():
        path, leaf = _split(suffix)
        if "experts" in path:
            at = path.index("experts")
            rest = path[at + 1:]
            if rest and rest[0].isdigit():       # one module per expert
                expert_ids.add(rest[0])
                rest = rest[1:]
                if not rest:
                    raise _Refused(f"layer {index}: {suffix} {shape} has no place")
                key = (rest[-1], leaf)
                layer.experts.setdefault(key, shape)
            else:                                 # the experts as 3-D tensors (transformers 5)
                layer.experts[("fused", leaf)] = shape
            continue
        path = [part.lower() for part in path]
        module = path[-1] if path else leaf
        parents = set(path[:-1])
        if parents & _SHARED or module in _SHARED:
            if module in {"shared_expert_gate"}:
                layer.shared_gate = shape
            else:
                layer.shared.setdefault(module, {})[leaf] = shape
        elif module == "shared_expert_gate":
            layer.shared_gate = shape
        elif parents & _ATTENTION or (module in _ATTENTION):
            if module in _Q_NORM or module in _K_NORM:
                key = "q_norm" if module in _Q_NORM else "k_norm"
                layer.attention[key] = layer.attention.get(key, 0) + _numel(shape)
            elif module in _Q | _K | _V | _QKV | _O:
                role = ("q" if module in _Q else "k" if module in _K else "v" if module in _V
                        else "qkv" if module in _QKV else "o")
                layer.attention.setdefault(role, {})[leaf] = shape
            else:
                raise _Refused(f"layer {index}: transformers builds {suffix} {shape}, which zerolib's "
                               f"description has no place for")
        elif _is_norm(module):
            entry = layer.norms.setdefault(module, [0, False])
            entry[0] += _numel(shape)
            entry[1] = entry[1] or leaf == "bias"
        elif parents & _MLP or module in _MLP or (not parents and module in _GATE | _UP | _DOWN | _GATE_UP):
            if module in _ROUTER and len(shape) == 2:
                if leaf != "weight":
                    raise _Refused(f"layer {index}: a router bias ({suffix}): zerolib cannot express it")
                layer.router = shape
            elif module in _GATE | _UP | _DOWN | _GATE_UP:
                role = ("gate_up" if module in _GATE_UP else "gate" if module in _GATE
                        else "up" if module in _UP else "down")
                layer.mlp.setdefault(role, {})[leaf] = shape
            elif path[-2:] == ["router", "layer"]:
                layer.router = shape
            else:
                raise _Refused(f"layer {index}: transformers builds {suffix} {shape}, which zerolib's "
                               f"description has no place for")
        else:
            raise _Refused(f"layer {index}: transformers builds {suffix} {shape}, which zerolib's "
                           f"description has no place for")
    if expert_ids:
        layer.experts["count"] = len(expert_ids)
    layer.norms = {module: tuple(value) for module, value in layer.norms.items()}
    return layer


def _out_in(entry: Mapping) -> tuple[int, int, bool]:
    weight = entry.get("weight")
    if weight is None or len(weight) != 2:
        raise _Refused(f"a projection without a 2-D weight ({dict(entry)})")
    return weight[0], weight[1], "bias" in entry


def _attention(layer: _Layer, hidden: int, heads: int) -> dict:
    a = layer.attention
    if "o" not in a:
        raise _Refused("no attention output projection in the layers")
    if "qkv" in a:
        out, _, bias = _out_in(a["qkv"])
        o_out, q_width, o_bias = _out_in(a["o"])
        kv2 = out - q_width
        if kv2 <= 0 or kv2 % 2:
            raise _Refused(f"a fused qkv of {out} rows beside a query width of {q_width}")
        kv_width, fused = kv2 // 2, True
    elif {"q", "k", "v"} <= set(a):
        q_width, _, bias = _out_in(a["q"])
        kv_width, _, k_bias = _out_in(a["k"])
        v_width, _, v_bias = _out_in(a["v"])
        o_out, o_in, o_bias = _out_in(a["o"])
        if v_width != kv_width or o_in != q_width or not bias == k_bias == v_bias:
            raise _Refused("queries, keys and values of different widths or biases")
        fused = False
    else:
        raise _Refused(f"attention of {', '.join(sorted(a))}: not queries, keys and values")
    if o_out != hidden or q_width % heads:
        raise _Refused(f"an attention of {q_width} query rows over {heads} heads in a hidden size of {hidden}")
    head_dim = q_width // heads
    if kv_width % head_dim:
        raise _Refused(f"keys {kv_width} wide are not whole heads of {head_dim}")
    out = dict(kv_heads=kv_width // head_dim, qkv_bias=bias, output_bias=o_bias, fused_qkv=fused,
               head_dim=None if head_dim * heads == hidden else head_dim)
    q_norm, k_norm = a.get("q_norm"), a.get("k_norm")
    if (q_norm is None) != (k_norm is None):
        raise _Refused("a norm on queries without one on keys (or the other way round)")
    if q_norm is None:
        out["qk_norm"] = "none"
    elif (q_norm, k_norm) == (head_dim, head_dim):
        out["qk_norm"] = "head"
    elif (q_norm, k_norm) == (q_width, kv_width):
        out["qk_norm"] = "projection"
    else:
        raise _Refused(f"query and key norms of {q_norm} and {k_norm} elements")
    return out


def _norms(layer: _Layer, built: Built, notes: list[str]) -> dict:
    found = list(layer.norms.values())
    if not found:
        raise _Refused("layers whose norms hold no parameters (a LayerNorm without weights)")
    if len(found) not in (1, 2, 4):
        raise _Refused(f"{len(found)} norms per layer ({', '.join(layer.norms)}); zerolib describes 1, 2 or 4")
    biased = {bias for _, bias in found}
    if len(biased) > 1:
        raise _Refused("norms with and without biases in one layer")
    layernorm = biased == {True}
    if not layernorm and any("LayerNorm" in m and "RMS" not in m for m in built.module_classes) \
            and not any("RMSNorm" in m for m in built.module_classes):
        notes.append("its LayerNorm without a bias counted as its weight, as an RMSNorm is")
    if len(found) == 1:
        notes.append("attention and MLP side by side after one norm (as Falcon-7B's)")
    return dict(norm="layernorm" if layernorm else "rmsnorm", post_norms=len(found) == 4,
                shared_norm=len(found) == 1)


def _mlp_of(entries: Mapping, hidden: int, what: str) -> dict:
    """ffn width, gated, fused gate and up, bias of an MLP's projections (2-D weights)."""
    if "down" not in entries:
        raise _Refused(f"{what} without a down projection")
    down_out, f, bias = _out_in(entries["down"])
    if down_out != hidden:
        raise _Refused(f"{what}'s down projection of {down_out} rows in a hidden size of {hidden}")
    biases = {_out_in(e)[2] for e in entries.values()}
    if len(biases) > 1:
        raise _Refused(f"{what}'s projections with and without biases")
    if "gate_up" in entries:
        out, _, _ = _out_in(entries["gate_up"])
        if out != 2 * f or set(entries) != {"gate_up", "down"}:
            raise _Refused(f"{what}'s fused gate and up of {out} rows for a width of {f}")
        return dict(ffn_hidden=f, gated_mlp=True, fused_gate_up=True, mlp_bias=bias)
    if "up" not in entries or any(_out_in(entries[k])[0] != f for k in entries if k != "down"):
        raise _Refused(f"{what} of {', '.join(sorted(entries))} of different widths")
    return dict(ffn_hidden=f, gated_mlp="gate" in entries, fused_gate_up=False, mlp_bias=bias)


def _dense_mlp(layers: list[_Layer], hidden: int) -> dict:
    first = layers[0].mlp
    if any(layer.mlp != first for layer in layers[1:]):
        raise _Refused("the layers' MLPs differ (zerolib's layers are all alike)")
    if any(layer.router or layer.shared or layer.shared_gate for layer in layers):
        raise _Refused("a router or shared expert without experts")
    return _mlp_of(first, hidden, "the MLP")


def _experts(layers: list[_Layer], c: Mapping, hidden: int) -> dict:
    first = layers[0]
    for layer in layers[1:]:
        if (layer.experts, layer.router, layer.shared, layer.shared_gate, layer.mlp) != (
                first.experts, first.router, first.shared, first.shared_gate, first.mlp):
            raise _Refused("the sparse layers differ (zerolib's layers are all alike)")
    if first.mlp:
        raise _Refused("a dense MLP beside the experts in one layer")
    if first.router is None:
        raise _Refused("experts without a router")
    experts, router_in = first.router
    if router_in != hidden:
        raise _Refused(f"a router of {first.router}")
    e = first.experts
    if "count" in e:     # one module per expert: the dense MLP's names
        if e["count"] != experts:
            raise _Refused(f"{e['count']} experts beside a router for {experts}")
        per: dict = {}
        for (module, leaf), shape in ((k, v) for k, v in e.items() if k != "count"):
            role = ("gate_up" if module in _GATE_UP else "gate" if module in _GATE
                    else "up" if module in _UP else "down" if module in _DOWN else None)
            if role is None:
                raise _Refused(f"an expert's {module} has no place")
            per.setdefault(role, {})[leaf] = shape
        mlp = _mlp_of(per, hidden, "each expert")
    else:
        mlp = _fused_experts({leaf: shape for (_, leaf), shape in e.items()}, experts, hidden)
    key, per_token = _first(c, _TOP_K_KEYS)
    if not isinstance(per_token, int) or isinstance(per_token, bool) or not 1 <= per_token <= experts:
        raise _Refused(f"the config does not say how many of its {experts} experts a token uses "
                       f"({', '.join(_TOP_K_KEYS[:2])}...)")
    out = dict(experts=experts, experts_per_token=per_token, **mlp)
    if first.shared:
        shared = _mlp_of({("gate_up" if m in _GATE_UP else "gate" if m in _GATE else "up" if m in _UP
                           else "down"): entry for m, entry in first.shared.items()}, hidden, "the shared expert")
        if (shared["gated_mlp"], shared["mlp_bias"]) != (mlp["gated_mlp"], mlp["mlp_bias"]):
            raise _Refused("a shared expert not of the routed experts' kind")
        out["shared_expert_ffn"] = shared["ffn_hidden"]
    if first.shared_gate is not None:
        if first.shared_gate != (1, hidden) or not first.shared:
            raise _Refused(f"a shared expert gate of {first.shared_gate}")
        out["shared_expert_gate"] = True
    out["fused_gate_up"] = False    # each expert's gate and up count as separate modules here
    return out


def _fused_experts(tensors: Mapping[str, tuple], experts: int, hidden: int) -> dict:
    """transformers 5's experts: gate_up_proj (E, 2f, h) or (E, h, 2f), down_proj (E, h, f) or
    (E, f, h), or gate_proj / up_proj apart; their biases ``*_bias`` (E, rows)."""
    weights = {k: v for k, v in tensors.items() if not k.endswith("bias")}
    biases = {k[:-len("_bias")].rstrip("_"): v for k, v in tensors.items() if k.endswith("bias")}
    if "down_proj" not in weights or any(len(s) != 3 or s[0] != experts for s in weights.values()):
        raise _Refused(f"experts of {dict(tensors)} for {experts} experts")
    down = weights["down_proj"]
    if hidden not in down[1:]:
        raise _Refused(f"an experts' down projection of {down} in a hidden size of {hidden}")
    f = down[2] if down[1] == hidden else down[1]
    if "gate_up_proj" in weights:
        gated = set(weights) == {"gate_up_proj", "down_proj"}
        if not gated or 2 * f not in weights["gate_up_proj"][1:] or hidden not in weights["gate_up_proj"][1:]:
            raise _Refused(f"experts of {dict(weights)}")
    else:
        gated = "gate_proj" in weights
        if "up_proj" not in weights or set(weights) - {"gate_proj", "up_proj", "down_proj"}:
            raise _Refused(f"experts of {dict(weights)}")
    if biases and set(biases) != set(weights):
        raise _Refused("experts' projections with and without biases")
    return dict(ffn_hidden=f, gated_mlp=gated, mlp_bias=bool(biases))


def _dropout(c: Mapping) -> bool:
    for key, value in c.items():
        if ("dropout" in key or key.endswith("pdrop")) and key not in _NOT_DROPOUT \
                and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return True
    return False


if __name__ == "__main__":
    main()
