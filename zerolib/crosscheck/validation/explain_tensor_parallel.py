"""The tensor-parallel run beside zerolib's numbers, every difference worked out by hand.

Parameters: each rank's local shards, per zerolib module name, against
:func:`zerolib.core.memory.model_parallel.split_table` (column- and row-parallel matrices split t
ways, norms whole, vocabulary rows ceil(V / t) on the most-loaded rank). One mechanism:

- ``uneven-vocabulary-shard``: DTensor's ``Shard(0)`` cuts the vocabulary rows like
  ``torch.chunk`` (chunks of ceil(V / t), the last ones short), so a rank past the most-loaded
  one holds fewer rows than zerolib's most-loaded count;
- ``padded-shard-storage``: ``distribute_tensor`` pads a short shard to the chunk size and keeps
  a narrower view of that storage, so the memory it holds is the most-loaded rank's after all.

Activations: each tensor autograd saves in one decoder block, against
:func:`zerolib.core.memory.activations.layer_activation_terms` (Korthikanti et al.'s (MLSys 2023) terms for a
Llama block: norms and projection inputs whole on every rank, the rest split t ways, K and V
at kv_heads / t heads, flash attention, no dropout). Mechanisms, all sized from the shapes:

- ``rmsnorm-fp32-input``: PyTorch's CPU ``rms_norm`` upcasts its 16-bit input to fp32 and saves
  that copy (4 bytes per element where the formula counts the 2-byte input);
- ``rmsnorm-normalized-copy``: it multiplies the weight in fp32 and saves the normalised fp32
  values for the weight's gradient; a fused kernel (Megatron-LM's, Apex's) recomputes them;
- ``rmsnorm-statistics``: it saves one fp32 1/rms per token, which Table 2 leaves out;
- ``flash-output-copy``: ``scaled_dot_product_attention`` saves its output per head, and
  merging the heads for the output projection copies it (also seen in the GPT block run).

Plain Python: the run itself is ``tensor_parallel_run``.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.memory.activations import ActivationOptions, layer_activation_terms, layer_shape
from zerolib.core.memory.model_parallel import parameters_per_gpu, split_table, vocabulary_rows
from zerolib.crosscheck.validation.effects import Effect, describe
from zerolib.crosscheck.validation.effects import keys as effect_keys
from zerolib.crosscheck.validation.setups import fsdp_rows

ELEMENT_BYTES = 2          # bf16 weights and activations
NORM_STATISTIC_BYTES = 4   # rms_norm computes in fp32

# Heads 8 and key/value heads 4 split over 2 and 4 ranks; a vocabulary of 250 does not divide
# by 4 (chunks of 63 rows: 63, 63, 63, 61); 2 layers so a layer's parameters repeat.
TINY_LLAMA = TransformerConfig(
    "tiny-llama", hidden=64, layers=2, heads=8, kv_heads=4, ffn_hidden=160, vocab=250,
    max_positions=32, tied_embeddings=False, gated_mlp=True, norm="rmsnorm",
    position_embedding="rotary", source="zerolib's tensor-parallel validation model")


@dataclass(frozen=True)
class RunShape:
    seq_len: int = 32
    micro_batch: int = 2


SHAPE = RunShape()
MODULE_KINDS = ("parameters", "activations")

# Block labels in forward order, with the formula terms each saved storage stands for.
LABEL_TERMS = {
    "attention norm input (fp32 copy)": ("attention_norm_input",),
    "attention norm 1/rms (fp32)": (),
    "attention norm normalised (fp32)": (),
    "QKV projection input": ("qkv_input",),
    "query (rotated)": ("query",),
    "key (rotated)": ("key",),
    "value": ("value",),
    "flash output": (),
    "flash log-sum-exp": ("flash_logsumexp",),
    "output projection input": ("attention_output_projection_input",),
    "MLP norm input (fp32 copy)": ("mlp_norm_input",),
    "MLP norm 1/rms (fp32)": (),
    "MLP norm normalised (fp32)": (),
    "MLP input": ("mlp_input",),
    "gate projection output": ("mlp_gate_projection",),
    "SiLU output": ("mlp_activation_output",),
    "up projection output": ("mlp_up_projection",),
    "down projection input": ("mlp_down_projection_input",),
}
NOT_SAVED = "(not saved by PyTorch)"


def formula_terms(workers: int) -> dict[str, int]:
    """zerolib's per-term bytes for one block on one of ``workers`` tensor-parallel ranks."""
    c = TINY_LLAMA
    shape = layer_shape(c.hidden, c.heads, ffn_hidden=c.ffn_hidden, gated_mlp=True,
                        kv_heads=c.kv_heads)
    return dict(layer_activation_terms(shape, SHAPE.seq_len, SHAPE.micro_batch, workers,
                                       ActivationOptions(flash_attention=True,
                                                         element_bytes=ELEMENT_BYTES, dropout=False)))


def parameter_formula(workers: int) -> dict[str, int]:
    """Bytes of each module kind (all layers) on the most-loaded of ``workers`` ranks."""
    table = split_table(TINY_LLAMA, workers)
    return {row.module: ELEMENT_BYTES * row.elements_per_gpu * row.count for row in table.itertuples()}


def parameter_effects(module: str, workers: int, rank: int) -> tuple[Effect, ...]:
    """What a rank's shard of ``module`` holds beyond (or short of) the most-loaded count."""
    table = split_table(TINY_LLAMA, workers).set_index("module")
    if table.at[module, "split"] != "vocabulary":
        return ()
    held, padded = fsdp_rows(TINY_LLAMA.vocab, workers, rank)   # torch.chunk's rule, as Shard(0)
    most = int(vocabulary_rows(TINY_LLAMA.vocab, workers))
    row_bytes = TINY_LLAMA.hidden * ELEMENT_BYTES
    return (Effect("uneven-vocabulary-shard",
                   f"Shard(0) cuts {TINY_LLAMA.vocab} vocabulary rows in chunks of {most}: rank "
                   f"{rank} of {workers} holds {held}", (held - most) * row_bytes),
            Effect("padded-shard-storage",
                   f"distribute_tensor pads the short shard to {padded} rows and keeps a "
                   f"{held}-row view of that storage", (padded - held) * row_bytes))


def activation_effects(label: str, workers: int) -> tuple[Effect, ...]:
    """What PyTorch on the CPU saves for ``label`` beyond (or short of) the formula's terms."""
    s, b, h = SHAPE.seq_len, SHAPE.micro_batch, TINY_LLAMA.hidden
    tokens = s * b
    if label.endswith("input (fp32 copy)"):
        return (Effect("rmsnorm-fp32-input", "rms_norm upcasts its bf16 input and saves the fp32 "
                       "copy: 4 bytes per element where Table 2 counts 2", 2 * tokens * h),)
    if label.endswith("normalised (fp32)"):
        return (Effect("rmsnorm-normalized-copy", "rms_norm multiplies the weight in fp32 and saves "
                       "the normalised fp32 values (s*b*h x 4 B) for the weight gradient",
                       4 * tokens * h),)
    if label.endswith("1/rms (fp32)"):
        return (Effect("rmsnorm-statistics", "rms_norm saves one fp32 1/rms per token (s*b x 4 B)",
                       NORM_STATISTIC_BYTES * tokens),)
    if label == "flash output":
        return (Effect("flash-output-copy", "scaled_dot_product_attention saves its output per "
                       "head (this rank's heads), and merging them for the output projection "
                       "copies it", ELEMENT_BYTES * tokens * h // workers),)
    return ()


def _row(kind, workers, rank, item, terms, measured, formula, dtype, shape, tensors, extras):
    explained = sum(effect.bytes for effect in extras)
    unexplained = measured - formula - explained
    known = item in LABEL_TERMS or item == NOT_SAVED or kind == "parameters"
    return {"kind": kind, "workers": workers, "rank": rank, "item": item, "terms": terms,
            "saved_dtype": dtype, "shape": shape, "tensors": tensors, "measured_bytes": measured,
            "formula_bytes": formula, "difference_bytes": measured - formula,
            "explained_bytes": explained, "unexplained_bytes": unexplained,
            "effects": effect_keys(extras),
            "explanation": describe(extras, unexplained, extra=(
                () if known else ("a saved tensor the block does not label",)))}


MEASURED_COLUMNS = ["kind", "workers", "rank", "item", "saved_dtype", "shape", "tensors",
                    "measured_bytes"]


def compare_tensor_parallel(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per module kind (parameters) and per saved storage (activations, plus any formula
    term PyTorch did not save), per rank, in model order."""
    rows = []
    for (workers, rank), group in measured.groupby(["workers", "rank"], sort=True):
        params = parameter_formula(int(workers))
        for record in group[group["kind"] == "parameters"].to_dict("records"):
            module = record["item"]
            split = split_table(TINY_LLAMA, int(workers)).set_index("module").at[module, "split"]
            rows.append(_row("parameters", int(workers), int(rank), module, split,
                             int(record["measured_bytes"]), params[module], record["saved_dtype"],
                             record["shape"], int(record["tensors"]),
                             parameter_effects(module, int(workers), int(rank))))
        terms = formula_terms(int(workers))
        covered = set()
        for record in group[group["kind"] == "activations"].to_dict("records"):
            label = record["item"]
            names = LABEL_TERMS.get(label, ())
            covered.update(names)
            rows.append(_row("activations", int(workers), int(rank), label, "+".join(names),
                             int(record["measured_bytes"]), sum(terms[n] for n in names),
                             record["saved_dtype"], record["shape"], 1,
                             activation_effects(label, int(workers))))
        for term, size in terms.items():
            if size and term not in covered:
                rows.append(_row("activations", int(workers), int(rank), NOT_SAVED, term, 0, size,
                                 "", "", 0, ()))
    frame = pd.DataFrame(rows)
    modules = [piece for piece in split_table(TINY_LLAMA).module]
    order = {label: index for index, label in enumerate([*modules, *LABEL_TERMS, NOT_SAVED])}
    frame["_kind"] = frame["kind"].map(MODULE_KINDS.index)
    frame["_item"] = frame["item"].map(lambda label: order.get(label, len(order)))
    frame = frame.sort_values(["workers", "rank", "_kind", "_item", "item", "terms"], kind="stable")
    return frame.drop(columns=["_kind", "_item"]).reset_index(drop=True)


def totals(compared: pd.DataFrame) -> pd.DataFrame:
    """Per run, rank and kind: measured and formula totals and what stays unexplained; for
    parameters ``formula_bytes`` is zerolib's ``parameters_per_gpu`` x 2 bytes."""
    columns = ["measured_bytes", "formula_bytes", "explained_bytes", "unexplained_bytes"]
    frame = compared.groupby(["workers", "rank", "kind"], sort=False)[columns].sum().reset_index()
    per_gpu = {w: ELEMENT_BYTES * int(parameters_per_gpu(TINY_LLAMA, int(w))) for w in frame["workers"].unique()}
    mismatch = frame[(frame["kind"] == "parameters")
                     & (frame["formula_bytes"] != frame["workers"].map(per_gpu))]
    if len(mismatch):      # the per-module rows must add up to the per-GPU count
        raise ValueError(f"per-module parameter formulas do not add up to parameters_per_gpu: {mismatch}")
    frame["relative_difference"] = (frame["measured_bytes"] - frame["formula_bytes"]) / frame["formula_bytes"]
    return frame
