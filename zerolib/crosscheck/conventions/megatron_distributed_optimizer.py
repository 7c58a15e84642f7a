"""Megatron-LM's distributed optimizer: its table of bytes per parameter, as a named convention.

Source: NVIDIA Megatron-LM, ``docs/user-guide/features/dist_optimizer.md`` (read at commit
1a8ab71f78274ac14274a34ea834f1c98d463c9f; the same numbers since ``docs/distrib_optimizer.md``
of 2022 and in the README's "Distributed Optimizer" section until August 2025): "the theoretical
number of bytes per parameter ... (where d is the data parallel size)", for three (parameter,
gradient) dtype pairs, without and with the distributed optimizer. Transcribed in
``data/megatron_distributed_optimizer.csv`` (see ``data/megatron_distributed_optimizer.md``).
The code says the same for its default: ``megatron/training/theoretical_memory_usage.py``,
``18 if not args.use_distributed_optimizer else 6 + (12 / data_parallel_size)``.

The convention, in zerolib's terms: the distributed optimizer is ZeRO stage 1 over the d
data-parallel ranks (it shards "all optimizer state that does not overlap with the model state";
parameters and model gradients stay replicated), with one layout per dtype pair:

- fp16 parameters and gradients: 2 + 2 replicated; fp32 main parameters, fp32 main gradients
  and Adam's two moments, 4 + 4 + 4 + 4 = 16 sharded. The fp32 main gradients are a separate
  copy, sharded with the optimizer state: Megatron's 20, the ZeRO paper's 16 + 4.
- bf16 parameters with fp32 gradients: the fp32 main-gradient buffer *is* the model's gradient
  ("the grads in this case are not distributed"): 2 + 4 replicated, 12 sharded: zerolib's
  ``bf16-fp32-grads`` layout.
- fp32 parameters and gradients: the parameters are their own main copy: 4 + 4 replicated,
  Adam's 8 sharded: zerolib's ``fp32-adam`` layout.

zerolib reproduces every cell exactly, for any d that divides the parameter count (the
formula shares exactly 1/d; zerolib gives the most-loaded rank ceil(P / d) elements).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType

import pandas as pd

from zerolib.core.memory.accounting import Layout, get_layout, model_state
from zerolib.crosscheck.conventions.common import Printed, exact, frame, read_transcription, row

SOURCE = "Megatron-LM distributed optimizer"
CSV = "megatron_distributed_optimizer.csv"
COLUMNS = ("row_label", "param_dtype", "grad_dtype", "column", "printed")
NON_DISTRIBUTED, DISTRIBUTED = "Non-distributed optim", "Distributed optim"
STAGE = {NON_DISTRIBUTED: 0, DISTRIBUTED: 1}   # the ZeRO stage each column is

# Megatron's fp16 case in zerolib's terms (the other two are zerolib presets).
FP16_LAYOUT = Layout("megatron-fp16", {
    "parameters": (("fp16 parameters", 2),),
    "gradients": (("fp16 gradients", 2),),
    "optimizer": (("fp32 main parameters", 4), ("fp32 main gradients", 4),
                  ("fp32 exp_avg", 4), ("fp32 exp_avg_sq", 4)),
}, "Megatron-LM, fp16 parameters and gradients (fp32 main gradients sharded with Adam)")
DTYPE_LAYOUTS: Mapping[tuple[str, str], Layout] = MappingProxyType({
    ("fp16", "fp16"): FP16_LAYOUT,
    ("bf16", "fp32"): get_layout("bf16-fp32-grads"),
    ("fp32", "fp32"): get_layout("fp32-adam"),
})
CHAPTER_LAYOUT = "mixed-adam"

# Why the chapter's 2 + 2 + 12 differs from each row (key -> what it is).
DIFFERENCES: Mapping[str, str] = MappingProxyType({
    "fp32-main-gradients": "fp16 training: Megatron keeps a separate fp32 copy of the gradients "
                           "(4 B) and shards it with the optimizer state; the ZeRO paper's 16 B "
                           "have no fp32 gradients",
    "fp32-gradients": "bf16 training: the gradients themselves are fp32 (4 B, not 2), replicated "
                      "like the parameters",
    "fp32-parameters": "fp32 training: 4-byte parameters serve as the main copy, so the "
                       "optimizer state is Adam's 8 B only (4 + 4 replicated, 8 sharded, "
                       "against 2 + 2 and 12)",
})
_CHAPTER_DIFFERENCE = {("fp16", "fp16"): "fp32-main-gradients",
                       ("bf16", "fp32"): "fp32-gradients",
                       ("fp32", "fp32"): "fp32-parameters"}
DATA_PARALLEL = (1, 2, 4, 8, 16, 64, 512, 4096)   # d values the comparison evaluates
# A parameter count every d above divides (2**12 x 5**12), so the formula's exact 1/d applies.
PARAMS = 10**12

_FORMULA = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*/\s*d\s*$")


def load(data_dir=None):
    """The six printed cells, as transcribed."""
    return read_transcription(data_dir, CSV, COLUMNS, ("printed",), "the Megatron-LM table")


def parse_cell(text: str) -> tuple[int, int]:
    """(replicated, sharded) bytes per parameter of a printed cell: '20' -> (20, 0),
    '6 + 12/d' -> (6, 12)."""
    match = _FORMULA.match(text)
    if match:
        return int(match[1]), int(match[2])
    if text.strip().isdigit():
        return int(text), 0
    raise ValueError(f"{CSV}: cannot read the cell {text!r} (expected 'A' or 'A + B/d')")


def comparison(data_dir=None, data_parallel=DATA_PARALLEL):
    """Every printed cell at each ``d``: Megatron's bytes per parameter beside zerolib's (stage 0
    or 1 of the row's layout) and the chapter's mixed-adam, with the difference named."""
    rows = []
    for cell in load(data_dir).to_dict("records"):
        key = (cell["param_dtype"], cell["grad_dtype"])
        if key not in DTYPE_LAYOUTS:
            raise ValueError(f"{CSV}: no layout for {key}")
        replicated, sharded = parse_cell(cell["printed"])
        stage = STAGE[cell["column"]]
        for d in data_parallel:
            ours = int(model_state(PARAMS, d, stage, DTYPE_LAYOUTS[key]).total)
            chapter = int(model_state(PARAMS, d, stage, CHAPTER_LAYOUT).total)
            printed_value = replicated + Fraction(sharded, d)
            printed = Printed(SOURCE, "bytes per parameter",
                              f"{cell['row_label'].replace('`', '')}, {cell['column']}, d = {d}",
                              cell["printed"], "bytes per parameter",
                              value=exact(printed_value.numerator, printed_value.denominator))
            rows.append(row(
                printed, exact(ours, PARAMS),
                f"zerolib stage {stage}, layout {DTYPE_LAYOUTS[key].name} "
                f"({' + '.join(f'{w:g}' for w in DTYPE_LAYOUTS[key].widths())} B)",
                exact(chapter, PARAMS), _CHAPTER_DIFFERENCE[key]))
    return frame(rows)


def table(data_dir=None):
    """The table as the source prints it, with zerolib's (replicated, sharded) bytes beside."""
    records = []
    for cell in load(data_dir).to_dict("records"):
        layout = DTYPE_LAYOUTS[(cell["param_dtype"], cell["grad_dtype"])]
        p, g, o = layout.widths()
        zerolib = f"{p + g + o:g}" if STAGE[cell["column"]] == 0 else f"{p + g:g} + {o:g}/d"
        records.append({"parameters, gradients": cell["row_label"].replace("`", ""),
                        "column": cell["column"], "Megatron-LM prints": cell["printed"],
                        "zerolib": zerolib, "zerolib layout": layout.name})
    wide = pd.DataFrame(records).pivot(index="parameters, gradients", columns="column",
                                       values=["Megatron-LM prints", "zerolib"])
    order = list(dict.fromkeys(r["parameters, gradients"] for r in records))
    columns = [(column, what) for column in (NON_DISTRIBUTED, DISTRIBUTED)
               for what in ("Megatron-LM prints", "zerolib")]
    return wide.reindex(order).swaplevel(0, 1, axis=1)[columns].rename_axis(columns=["", ""])
