"""Saved activations of shipped transformer blocks (Hugging Face ``transformers``) beside the
formula, every byte attributed.

``shipped_run`` runs one block of GPT-2 and of Llama as ``transformers`` ships them, inside a
one-layer model on the CPU, and lists each distinct storage autograd saves while the block runs,
with the module that was running and the op that saved it. Here, in plain Python, each case's
expected list is written out from the implementation: per saved tensor, what it is, the terms of
``zerolib.core.memory.activations.layer_activation_terms`` it stands for and, where the implementation
saves more than a careful one (Korthikanti et al., MLSys 2023, Sec. 4.1), the mechanism and its size,
worked out from the shapes alone. The comparison pairs each measured storage with the next
expected item of the same module and op; whatever is left over on either side is unexplained.

What the blocks save beyond the formula:

- GPT-2's default GELU (``gelu_new``) is a Python expression, ``0.5 * x * (1 + tanh(c * (x +
  0.044715 * x**3)))``: autograd keeps ``x`` (for ``pow``), ``tanh(...)``, ``0.5 * x`` and ``1 +
  tanh(...)``, three f-wide tensors more than a fused GELU, which keeps its input only.
- ``use_cache`` defaults to True, also in training, so K and V pass through a KV cache that copies
  them; attention saves those copies. At micro-batch 1 merging the batch and head dimensions of Q
  is a view, so the saved Q keeps ``c_attn``'s whole fused Q|K|V output alive, K and V thirds
  included. With ``use_cache=False`` Q, K and V are all views of that output and nothing is extra;
  at micro-batch 2 they are copies either way.
- On the CPU, LayerNorm keeps its per-token mean and 1/std in the activation dtype and
  ``F.dropout`` saves its noise in the activation dtype (``explain_activations`` names both).
- Llama's RMSNorm is a Python expression too: it upcasts its input to fp32 (saved for ``pow`` and
  the multiply), saves the per-token 1/rms in fp32, and the normalised input before the weight.
- Rotary embeddings save the cos and sin tables; eager attention repeats key/value heads to every
  query head (``repeat_kv``) and takes the softmax in fp32, saving it and its 16-bit copy.

Plain Python (pandas): the run itself is ``shipped_run``.
"""
from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import pandas as pd

from zerolib.core.catalogue.models import get_model
from zerolib.core.inputs import check_positive_int
from zerolib.core.memory.activations import ActivationOptions, layer_activation_terms, layer_shape
from zerolib.crosscheck.validation.effects import MECHANISMS, Effect, describe
from zerolib.crosscheck.validation.effects import keys as effect_keys

ELEMENT_BYTES = 2  # the blocks run in bf16
MASK_BYTES = 1     # the formula's dropout masks (Table 2)
FP32_BYTES = 4
MICRO_BATCHES = (1, 2)
NOT_SAVED = "(not saved by the block)"
UNEXPECTED = "(not expected)"


@dataclass(frozen=True)
class ShippedBlock:
    """One transformer block as shipped, and the setting it runs in (sizes in elements)."""

    name: str
    model: str            # "gpt2" or "llama": which transformers model class
    description: str
    attention: str        # transformers' attn_implementation: "eager" or "sdpa"
    use_cache: bool       # True is the models' default
    seq_len: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden: int
    gated_mlp: bool
    dropout: bool         # trains with dropout (GPT-2: 0.1 everywhere; Llama: none)

    @property
    def flash_attention(self) -> bool:
        return self.attention == "sdpa"

    def formula_terms(self, micro_batch: int) -> dict[str, int]:
        """zerolib's per-term bytes for this block (Korthikanti et al. Sec. 4.1 / Table 2)."""
        shape = layer_shape(self.hidden, self.heads, ffn_hidden=self.ffn_hidden,
                            gated_mlp=self.gated_mlp, kv_heads=self.kv_heads, head_dim=self.head_dim)
        return dict(layer_activation_terms(shape, self.seq_len, micro_batch, options=ActivationOptions(
            flash_attention=self.flash_attention, element_bytes=ELEMENT_BYTES,
            mask_bytes=MASK_BYTES, dropout=self.dropout)))


_GPT2 = dict(model="gpt2", seq_len=64, hidden=64, heads=4, kv_heads=4, head_dim=16, ffn_hidden=256,
             gated_mlp=False, dropout=True, attention="eager")
# Llama with 4 heads of 32 on a hidden size of 64 (twice hidden / heads) and 2 key/value heads:
# the head width and grouped-query attention both enter the terms.
_LLAMA = dict(model="llama", seq_len=64, hidden=64, heads=4, kv_heads=2, head_dim=32, ffn_hidden=160,
              gated_mlp=True, dropout=False, use_cache=True)
BLOCKS: Mapping[str, ShippedBlock] = MappingProxyType({block.name: block for block in (
    ShippedBlock("gpt2", description="GPT2Model's block as shipped: gelu_new, dropout 0.1, "
                 "use_cache default (True); eager attention", use_cache=True, **_GPT2),
    ShippedBlock("gpt2-no-cache", description="the same with use_cache=False",
                 use_cache=False, **_GPT2),
    ShippedBlock("llama-eager", description="LlamaModel's decoder layer as shipped (RMSNorm, "
                 "rotary, SwiGLU, grouped-query attention), eager attention", attention="eager",
                 **_LLAMA),
    ShippedBlock("llama-sdpa", description="the same with the default attention, sdpa (the CPU "
                 "flash kernel)", attention="sdpa", **_LLAMA),
)})


def case_name(block: str, micro_batch: int) -> str:
    return f"{block}-b{micro_batch}"


CASES = tuple((name, b) for name in BLOCKS for b in MICRO_BATCHES)


@dataclass(frozen=True)
class Expected:
    """One storage the block saves: where (module, op.attribute), what, the formula terms it
    stands for and the mechanism (a key of ``effects.MECHANISMS``) that makes it differ."""

    module: str
    saved_by: str
    item: str
    terms: tuple[str, ...] = ()
    mechanism: str = ""


def _gpt2_items(block: ShippedBlock, b: int) -> list[Expected]:
    one_view = b == 1 and not block.use_cache   # Q, K and V all views of c_attn's output
    items = [
        Expected("ln_1", "NativeLayerNormBackward0.input", "attention norm input (the block's input)",
                 ("attention_norm_input",)),
        Expected("ln_1", "NativeLayerNormBackward0.result1", "attention norm mean", (), "norm-statistics"),
        Expected("ln_1", "NativeLayerNormBackward0.result2", "attention norm 1/std", (), "norm-statistics"),
        Expected("attn.c_attn", "AddmmBackward0.mat1", "QKV projection input", ("qkv_input",)),
    ]
    if one_view:
        items.append(Expected("attn", "BmmBackward0.mat2", "Q, K, V: views of c_attn's fused output",
                              ("query", "key", "value")))
    else:
        items += [Expected("attn", "BmmBackward0.mat2", "K, transposed for QK^T", ("key",)),
                  Expected("attn", "BmmBackward0.self",
                           "Q: view of c_attn's fused output" if b == 1 else "Q", ("query",),
                           "fused-qkv-view")]
    items += [Expected("attn", "SoftmaxBackward0.result", "softmax output", ("softmax_output",)),
              Expected("attn", "MulBackward0.other", "attention dropout noise",
                       ("attention_dropout_mask",), "dropout-noise")]
    if not one_view:
        items.append(Expected("attn", "BmmBackward0.mat2", "V", ("value",)))
    items += [
        Expected("attn", "BmmBackward0.self", "attention dropout output", ("attention_dropout_output",)),
        Expected("attn.c_proj", "AddmmBackward0.mat1", "output projection input",
                 ("attention_output_projection_input",)),
        Expected("attn.resid_dropout", "MulBackward0.other", "attention output dropout noise",
                 ("attention_dropout_mask_after_projection",), "dropout-noise"),
        Expected("ln_2", "NativeLayerNormBackward0.input", "MLP norm input", ("mlp_norm_input",)),
        Expected("ln_2", "NativeLayerNormBackward0.result1", "MLP norm mean", (), "norm-statistics"),
        Expected("ln_2", "NativeLayerNormBackward0.result2", "MLP norm 1/std", (), "norm-statistics"),
        Expected("mlp.c_fc", "AddmmBackward0.mat1", "MLP input", ("mlp_input",)),
        Expected("mlp.act", "PowBackward0.self", "GELU input (c_fc output)", ("mlp_activation_input",)),
        Expected("mlp.act", "TanhBackward0.result", "GELU: tanh(...)", (), "python-gelu"),
        Expected("mlp.act", "MulBackward0.other", "GELU: 1 + tanh(...)", (), "python-gelu"),
        Expected("mlp.act", "MulBackward0.self", "GELU: 0.5 x", (), "python-gelu"),
        Expected("mlp.c_proj", "AddmmBackward0.mat1", "GELU output (down projection input)",
                 ("mlp_down_projection_input",)),
        Expected("mlp.dropout", "MulBackward0.other", "MLP dropout noise", ("mlp_dropout_mask",),
                 "dropout-noise"),
    ]
    return items


def _rms_norm(module: str, what: str, term: str) -> list[Expected]:
    return [Expected(module, "PowBackward0.self", f"{what} norm input, upcast to fp32", (term,),
                     "rmsnorm-fp32-input"),
            Expected(module, "RsqrtBackward0.result", f"{what} norm 1/rms", (), "rmsnorm-statistics"),
            Expected(module, "MulBackward0.other", f"{what} norm output before the weight", (),
                     "rmsnorm-weight-input")]


def _llama_items(block: ShippedBlock, b: int) -> list[Expected]:
    items = [*_rms_norm("input_layernorm", "attention", "attention_norm_input"),
             Expected("self_attn.q_proj", "MmBackward0.self", "QKV projection input", ("qkv_input",)),
             Expected("self_attn", "MulBackward0.other", "rotary cos table", (), "rotary-cos-sin"),
             Expected("self_attn", "MulBackward0.other", "rotary sin table", (), "rotary-cos-sin")]
    if block.attention == "eager":
        items += [
            Expected("self_attn", "BmmBackward0.mat2", "K, repeated to every query head, transposed",
                     ("key",), "repeat-kv"),
            Expected("self_attn", "BmmBackward0.self", "Q after rotary", ("query",)),
            Expected("self_attn", "SoftmaxBackward0.result", "softmax output (fp32)", ("softmax_output",),
                     "softmax-fp32"),
            Expected("self_attn", "BmmBackward0.mat2", "V, repeated to every query head", ("value",),
                     "repeat-kv"),
            Expected("self_attn", "BmmBackward0.self", "softmax output cast to bf16", (),
                     "softmax-downcast-copy"),
            Expected("self_attn.o_proj", "MmBackward0.self", "output projection input",
                     ("attention_output_projection_input",)),
        ]
    else:
        flash = "ScaledDotProductFlashAttentionForCpuBackward0"
        items += [
            Expected("self_attn", f"{flash}.key", "K after rotary", ("key",)),
            Expected("self_attn", f"{flash}.query", "Q after rotary", ("query",)),
            Expected("self_attn", f"{flash}.value", "V", ("value",)),
            Expected("self_attn", f"{flash}.logsumexp", "flash log-sum-exp", ("flash_logsumexp",)),
            Expected("self_attn", f"{flash}.output", "attention output (also the output projection's input)",
                     ("attention_output_projection_input",)),
        ]
    items += [*_rms_norm("post_attention_layernorm", "MLP", "mlp_norm_input"),
              Expected("mlp.gate_proj", "MmBackward0.self", "MLP input", ("mlp_input",)),
              Expected("mlp.act_fn", "SiluBackward0.self", "gate projection (SiLU input)",
                       ("mlp_gate_projection",)),
              Expected("mlp", "MulBackward0.other", "up projection", ("mlp_up_projection",)),
              Expected("mlp", "MulBackward0.self", "SiLU output", ("mlp_activation_output",)),
              Expected("mlp.down_proj", "MmBackward0.self", "down projection input (SiLU x up)",
                       ("mlp_down_projection_input",))]
    return items


def expected_items(block: ShippedBlock, micro_batch: int) -> list[Expected]:
    """What the block saves, in forward order, as worked out from its code."""
    return (_gpt2_items if block.model == "gpt2" else _llama_items)(block, micro_batch)


def mechanism_bytes(key: str, block: ShippedBlock, b: int, formula_bytes: int) -> int:
    """Bytes a mechanism adds to one saved tensor, from the shapes alone."""
    e, s, h, a = ELEMENT_BYTES, block.seq_len, block.hidden, block.heads
    d, f, kv = block.head_dim, block.ffn_hidden, block.kv_heads
    sizes = {
        "norm-statistics": e * s * b,                       # one value per token
        "dropout-noise": (e - MASK_BYTES) * (formula_bytes // MASK_BYTES),
        # The K and V thirds of c_attn's output, kept alive by the view of Q.
        "fused-qkv-view": 2 * e * s * b * h if (b == 1 and block.use_cache) else 0,
        "python-gelu": e * s * b * f,
        "rmsnorm-fp32-input": (FP32_BYTES - e) * s * b * h,
        "rmsnorm-statistics": FP32_BYTES * s * b,
        "rmsnorm-weight-input": e * s * b * h,
        "rotary-cos-sin": e * s * d,                        # position ids: one row for the batch
        "repeat-kv": e * s * b * (a - kv) * d,
        "softmax-fp32": (FP32_BYTES - e) * a * s * s * b,
        "softmax-downcast-copy": e * a * s * s * b,
    }
    return sizes[key]


# Computed once per forward pass and saved by every layer: counted once for a whole model.
SHARED_BY_LAYERS = frozenset({"rotary-cos-sin"})


def at_shape(block: ShippedBlock, model, seq_len: int) -> ShippedBlock:
    """``block``'s implementation at the shape of ``model`` (a preset name or TransformerConfig of
    zerolib.core.catalogue.models): its hidden size, heads, key/value heads, head width and MLP width."""
    config = get_model(model)
    if config.gated_mlp != block.gated_mlp or config.experts:
        raise ValueError(f"model must have the MLP of the {block.name} block (gated: {block.gated_mlp}, "
                         f"no experts), got {config.name}")
    return replace(block, seq_len=check_positive_int(seq_len, "seq_len"), hidden=config.hidden,
                   heads=config.heads, kv_heads=config.kv_heads, head_dim=config.head_width,
                   ffn_hidden=config.ffn_hidden)


def extra_bytes(block: ShippedBlock, micro_batch: int) -> dict[str, int]:
    """Bytes each mechanism adds to one block's saved tensors beyond the formula (the sizes
    ``compare_shipped`` attributes, from the shapes alone), in ``effects.MECHANISMS`` order."""
    terms = block.formula_terms(micro_batch)
    found: dict[str, int] = {}
    for item in expected_items(block, micro_batch):
        if item.mechanism:
            formula = sum(terms[t] for t in item.terms)
            found[item.mechanism] = (found.get(item.mechanism, 0)
                                     + mechanism_bytes(item.mechanism, block, micro_batch, formula))
    return {key: found[key] for key in MECHANISMS if key in found}


def _effects(item: Expected, block: ShippedBlock, b: int, formula: int) -> tuple[Effect, ...]:
    if not item.mechanism:
        return ()
    return (Effect(item.mechanism, MECHANISMS[item.mechanism],
                   mechanism_bytes(item.mechanism, block, b, formula)),)


def _row(block, b, item, terms, formula, measured, record, effects):
    explained = sum(effect.bytes for effect in effects)
    unexplained = measured - formula - explained
    return {"case": case_name(block.name, b), "block": block.name, "model": block.model,
            "attention": block.attention, "use_cache": block.use_cache, "micro_batch": b,
            "seq_len": block.seq_len, "hidden": block.hidden, "heads": block.heads,
            "kv_heads": block.kv_heads, "head_dim": block.head_dim, "ffn_hidden": block.ffn_hidden,
            "module": record.get("module", ""), "saved_by": record.get("saved_by", ""),
            "item": item, "terms": "+".join(terms), "saved_dtype": record.get("saved_dtype", ""),
            "saved_shape": record.get("saved_shape", ""), "measured_bytes": measured,
            "formula_bytes": formula, "difference_bytes": measured - formula,
            "explained_bytes": explained, "unexplained_bytes": unexplained,
            "effects": effect_keys(effects), "explanation": describe(effects, unexplained)}


def compare_shipped(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per saved storage (and per expected one that was not saved), per case.

    ``measured`` has the columns of ``shipped_run.measure_shipped``: block, micro_batch, module,
    saved_by, saved_dtype, saved_shape, measured_bytes, in the order the block saved them. Each
    storage is paired with the next expected item of the same module and op.
    """
    rows = []
    for (name, b), group in measured.groupby(["block", "micro_batch"], sort=False):
        block, b = BLOCKS[name], int(b)
        terms = block.formula_terms(b)
        waiting: dict[tuple[str, str], deque] = defaultdict(deque)
        for item in expected_items(block, b):
            waiting[item.module, item.saved_by].append(item)
        for record in group.to_dict("records"):
            queue = waiting[record["module"], record["saved_by"]]
            measured_bytes = int(record["measured_bytes"])
            if not queue:
                rows.append(_row(block, b, UNEXPECTED, (), 0, measured_bytes, record, ()))
                continue
            item = queue.popleft()
            formula = sum(terms[t] for t in item.terms)
            rows.append(_row(block, b, item.item, item.terms, formula, measured_bytes, record,
                             _effects(item, block, b, formula)))
        for item in (i for queue in waiting.values() for i in queue):
            formula = sum(terms[t] for t in item.terms)
            rows.append(_row(block, b, f"{NOT_SAVED}: {item.item}", item.terms, formula, 0,
                             {"module": item.module, "saved_by": item.saved_by}, ()))
        covered = {t for item in expected_items(block, b) for t in item.terms}
        for term, size in terms.items():
            if size and term not in covered:
                rows.append(_row(block, b, NOT_SAVED, (term,), size, 0, {}, ()))
    return pd.DataFrame(rows)


def totals(compared: pd.DataFrame) -> pd.DataFrame:
    """Per case: measured and formula totals, the difference and what stays unexplained."""
    columns = ["measured_bytes", "formula_bytes", "explained_bytes", "unexplained_bytes"]
    keys = ["case", "block", "model", "attention", "use_cache", "micro_batch"]
    frame = compared.groupby(keys, sort=False)[columns].sum().reset_index()
    frame["relative_difference"] = (frame["measured_bytes"] - frame["formula_bytes"]) / frame["formula_bytes"]
    return frame


def mechanism_totals(compared: pd.DataFrame) -> pd.DataFrame:
    """Per case and mechanism: the bytes it adds (tidy; the cases' differences split up)."""
    rows = [{"case": row["case"], "mechanism": key, "bytes": row["explained_bytes"]}
            for row in compared.to_dict("records") for key in row["effects"].split()]
    frame = pd.DataFrame(rows, columns=["case", "mechanism", "bytes"])
    return frame.groupby(["case", "mechanism"], sort=False)["bytes"].sum().reset_index()
