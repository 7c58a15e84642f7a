"""Saved activations of a real GPT block beside Korthikanti et al.'s terms, worked out by hand.

Each tensor autograd saves (one distinct storage, labelled by ``block.GPTBlock``) is matched to
the terms of ``zerolib.core.memory.activations.layer_activation_terms`` it stands for. Where PyTorch on the
CPU saves something the paper's list does not, the size of that extra follows from the shapes
alone (``expected_extras``):

- LayerNorm saves each token's mean and 1/std (s*b values each; in the activation dtype on the
  CPU), which Table 2 leaves out;
- F.dropout on the CPU multiplies by a noise tensor (0 or 1/(1-p)) in the activation dtype and
  saves it, where the paper assumes a 1-byte mask (``torch.native_dropout``, which CUDA's
  F.dropout runs, saves a bool mask);
- scaled_dot_product_attention saves its output in the per-head (b, a, s, d) layout and merging
  the heads for the output projection copies it, so those values are stored twice.

Plain Python: the run itself is ``activation_run``.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from zerolib.core.memory.activations import ActivationOptions, layer_activation_terms, layer_shape
from zerolib.crosscheck.validation.effects import Effect, describe
from zerolib.crosscheck.validation.effects import keys as effect_keys

MASK_BYTES = 1  # torch.native_dropout's bool mask; the paper's 1-byte masks


@dataclass(frozen=True)
class BlockShape:
    seq_len: int = 64
    micro_batch: int = 2
    hidden: int = 64
    heads: int = 4


@dataclass(frozen=True)
class ActivationCase:
    """One measured configuration of the block."""

    name: str
    description: str
    dtype: str = "bf16"                 # "bf16" (the paper's 2 bytes) or "fp32"
    dropout_kernel: str = "native"      # see block.GPTBlock
    attention: str = "explicit"         # "explicit" or "sdpa" (flash kernel)
    recompute: str = "none"             # "none", "selective" or "full"

    @property
    def element_bytes(self) -> int:
        return {"bf16": 2, "fp32": 4}[self.dtype]

    @property
    def flash_attention(self) -> bool:
        return self.attention == "sdpa"

    def formula_terms(self, shape: BlockShape) -> dict[str, int]:
        """zerolib's per-term bytes for this case (Korthikanti et al. Sec. 4.1 / Table 2)."""
        return dict(layer_activation_terms(
            layer_shape(shape.hidden, shape.heads), shape.seq_len, shape.micro_batch,
            options=ActivationOptions(recompute=self.recompute, flash_attention=self.flash_attention,
                                      element_bytes=self.element_bytes, mask_bytes=MASK_BYTES,
                                      dropout=True)))


SHAPE = BlockShape()
CASES = (
    ActivationCase("table2", "bf16, bool dropout masks (torch.native_dropout): Table 2's setting"),
    ActivationCase("cpu-dropout", "bf16, F.dropout as the CPU runs it (noise in bf16)",
                   dropout_kernel="functional"),
    ActivationCase("fp32", "fp32 activations, bool dropout masks", dtype="fp32"),
    ActivationCase("selective", "bf16, attention core recomputed (checkpoint)",
                   recompute="selective"),
    ActivationCase("full", "bf16, whole block recomputed (checkpoint)", recompute="full"),
    ActivationCase("flash", "bf16, scaled_dot_product_attention (CPU flash kernel, no "
                   "attention dropout)", attention="sdpa"),
)
CASE_NAMES = tuple(case.name for case in CASES)

# Block labels in forward order, with the formula terms each saved storage stands for.
LABEL_TERMS = {
    "block input": ("attention_norm_input",),   # ("layer_input",) under full recomputation
    "attention norm mean": (),
    "attention norm 1/std": (),
    "QKV projection input": ("qkv_input",),
    "Q, K, V (per-head layout)": ("query", "key", "value"),
    "softmax output": ("softmax_output",),
    "attention dropout mask": ("attention_dropout_mask",),
    "attention dropout output": ("attention_dropout_output",),
    "flash log-sum-exp": ("flash_logsumexp",),
    "flash output": (),
    "output projection input": ("attention_output_projection_input",),
    "attention output dropout mask": ("attention_dropout_mask_after_projection",),
    "MLP norm input": ("mlp_norm_input",),
    "MLP norm mean": (),
    "MLP norm 1/std": (),
    "MLP input": ("mlp_input",),
    "GeLU input": ("mlp_activation_input",),
    "GeLU output": ("mlp_down_projection_input",),
    "MLP dropout mask": ("mlp_dropout_mask",),
}
NOT_SAVED = "(not saved by PyTorch)"


def terms_for(label: str, case: ActivationCase) -> tuple[str, ...]:
    if label == "block input" and case.recompute == "full":
        return ("layer_input",)
    return LABEL_TERMS.get(label, ())


def expected_extras(label: str, case: ActivationCase, shape: BlockShape,
                    formula_bytes: int) -> tuple[Effect, ...]:
    """What PyTorch on the CPU saves for ``label`` beyond (or short of) the formula's terms."""
    e, s, b, h = case.element_bytes, shape.seq_len, shape.micro_batch, shape.hidden
    if label.endswith(("norm mean", "norm 1/std")):
        return (Effect("norm-statistics",
                       "LayerNorm saves one statistic per token (s*b values, in the activation "
                       "dtype on the CPU; fp32 on CUDA), which Table 2 leaves out", s * b * e),)
    if label.endswith("dropout mask") and case.dropout_kernel == "functional":
        elements = formula_bytes // MASK_BYTES
        return (Effect("dropout-noise",
                       f"F.dropout on the CPU saves its scaled noise in the activation dtype "
                       f"({e} B per element), not a {MASK_BYTES}-byte mask as "
                       f"torch.native_dropout (CUDA's kernel) does", (e - MASK_BYTES) * elements),)
    if label == "flash output":
        return (Effect("flash-output-copy",
                       "scaled_dot_product_attention saves its output in the per-head "
                       "(b, a, s, d) layout, and merging heads for the projection copies it: "
                       "the same values are stored twice", e * s * b * h),)
    return ()


def _row(case, shape, label, terms, formula, measured, dtype, tensor_shape, extras):
    explained = sum(effect.bytes for effect in extras)
    unexplained = measured - formula - explained
    unknown = label not in LABEL_TERMS and label != NOT_SAVED
    return {"case": case.name, "dtype": case.dtype, "element_bytes": case.element_bytes,
            "dropout_kernel": case.dropout_kernel, "attention": case.attention,
            "recompute": case.recompute, "seq_len": shape.seq_len,
            "micro_batch": shape.micro_batch, "hidden": shape.hidden, "heads": shape.heads,
            "item": label, "terms": "+".join(terms), "saved_dtype": dtype,
            "saved_shape": tensor_shape, "measured_bytes": measured, "formula_bytes": formula,
            "difference_bytes": measured - formula, "explained_bytes": explained,
            "unexplained_bytes": unexplained, "effects": effect_keys(extras),
            "explanation": describe(extras, unexplained, extra=(
                ("a saved tensor the block does not label",) if unknown else ()))}


def compare_activations(measured: pd.DataFrame, shape: BlockShape = SHAPE) -> pd.DataFrame:
    """One row per saved storage (and per formula term PyTorch did not save), per case.

    ``measured`` has the columns of ``activation_run.measure_activations``: case, item,
    saved_dtype, saved_shape, measured_bytes. Rows follow the block's forward order.
    """
    cases = {case.name: case for case in CASES}
    rows = []
    for name, group in measured.groupby("case", sort=False):
        case = cases[name]
        terms = case.formula_terms(shape)
        covered = set()
        for record in group.to_dict("records"):
            label = record["item"]
            names = terms_for(label, case)
            covered.update(names)
            formula = sum(terms[n] for n in names)
            rows.append(_row(case, shape, label, names, formula, int(record["measured_bytes"]),
                             record["saved_dtype"], record["saved_shape"],
                             expected_extras(label, case, shape, formula)))
        for term, size in terms.items():
            if size and term not in covered:
                rows.append(_row(case, shape, NOT_SAVED, (term,), size, 0, "", "", ()))
    frame = pd.DataFrame(rows)
    labels = [*LABEL_TERMS, NOT_SAVED]
    rank = {label: index for index, label in enumerate(labels)}
    frame["_case"] = frame["case"].map(CASE_NAMES.index)
    frame["_item"] = frame["item"].map(lambda label: rank.get(label, len(labels)))
    frame = frame.sort_values(["_case", "_item", "item", "terms"], kind="stable")
    return frame.drop(columns=["_case", "_item"]).reset_index(drop=True)


def totals(compared: pd.DataFrame) -> pd.DataFrame:
    """Per case: measured and formula totals, their difference and what stays unexplained."""
    columns = ["measured_bytes", "formula_bytes", "explained_bytes", "unexplained_bytes"]
    keys = ["case", "dtype", "dropout_kernel", "attention", "recompute"]
    frame = compared.groupby(keys, sort=False)[columns].sum().reset_index()
    difference = frame["measured_bytes"] - frame["formula_bytes"]
    frame["relative_difference"] = difference / frame["formula_bytes"]
    return frame
