"""The ZeRO-Infinity paper's memory requirements for 0.1 to 100 trillion parameters.

Source: Rajbhandari, Ruwase, Rasley, Smith and He, "ZeRO-Infinity: Breaking the GPU Memory
Wall for Extreme Scale Deep Learning", SC21 (arXiv 2104.07857), Figure 2(a) "Memory
requirements for massive models": per model size (layers, hidden size, attention heads) the
model states (TB per model), the activations and the activation checkpoints (TB per node) and
the working memory per GPU of the model states and of the activations (GB). Transcribed in
``data/zero_infinity_figure2a.csv`` (see ``data/zero_infinity.md``). Hidden sizes are printed
with K = 1,024 (the caption of the paper's Table 1).

The paper's convention, each part reproduced with zerolib's own functions:

- parameters: 12 x layers x hidden^2 (attention 4 h^2 + MLP 8 h^2 per block; embeddings,
  biases and norms left out), printed in decimal trillions;
- model states: 20 bytes per parameter, fp16 parameters and gradients plus fp32 parameters,
  gradients, momentum and variance (zerolib: stage 0 of a 2 + (2 + 4) + 12 layout), "TB" = TiB;
- activation checkpoints: one 16-bit checkpoint per block, 2 x batch x seq x hidden x layers,
  with 32 sequences of 1,024 tokens per node (zerolib: ``layer_activation_bytes`` with full
  recomputation, which keeps exactly the block's input), TiB per node;
- model-state working memory: the 16-bit parameters and gradients of the largest linear
  layer, hidden x 4 hidden elements at 2 + 2 bytes, GiB;
- activation working memory: the paper's own per-block formula, batch x seq x (16 x hidden +
  2 x heads x seq) bytes, at 4 sequences of 1,024 tokens per GPU, GiB; and the activations
  per node, 16 GPUs x layers x that, TiB.

Every printed value is the exact value rounded half up to two decimals, except one: the 0.10T
row's model-state working memory is printed 1.95 GB where 16 x 10,240^2 bytes is 1.5625 GiB (1.56);
1.95 is 1.25 x 1.5625, as if counted at 5 bytes per element instead of the other rows' 4.
The activation working memory is the paper's formula, not Korthikanti et al.'s: zerolib's count
of the same GPT block (34 x hidden + 5 x heads x seq bytes per token) is set beside it.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import pandas as pd

from zerolib.core.memory.accounting import Layout, model_state
from zerolib.core.memory.activations import layer_activation_bytes
from zerolib.core.units import GiB
from zerolib.crosscheck.conventions.common import Printed, exact, frame, read_transcription, row
from zerolib.crosscheck.paper import PrintRule

SOURCE = "ZeRO-Infinity paper"
CSV = "zero_infinity_figure2a.csv"
COLUMNS = ("params_t", "layers", "hidden_printed", "hidden", "attention_heads", "model_states_tb",
           "activations_tb_per_node", "activation_checkpoints_tb_per_node",
           "model_state_working_memory_gb", "activation_working_memory_gb")
TiB = 2**40
TRILLION = 10**12

# 20 bytes per parameter (the paper: fp16 parameters and gradients, fp32 parameters,
# gradients, momentum and variance). DeepSpeed's estimator counts the same 2 + 18.
LAYOUT = Layout("zero-infinity", {
    "parameters": (("fp16 parameters", 2),),
    "gradients": (("fp16 gradients", 2), ("fp32 gradients", 4)),
    "optimizer": (("fp32 parameters", 4), ("fp32 momentum", 4), ("fp32 variance", 4)),
}, "ZeRO-Infinity's model states: 2 + 2 + 4 + 4 + 4 + 4 = 20 bytes per parameter")
WORKING_LAYOUT = Layout.custom(2, 2, 0, "largest-layer")   # 16-bit parameters + gradients
CHAPTER_LAYOUT = "mixed-adam"
SEQ_LEN = 1024
CHECKPOINT_BATCH_PER_NODE = 32     # "batch size of 32 per node" behind the checkpoint column
WORKING_BATCH_PER_GPU = 4          # 4 x 1,024 tokens per GPU reproduce the working-memory column
GPUS_PER_NODE = 16                 # a DGX-2 (the paper's Fig. 2b)
TWO_DECIMALS = PrintRule("round", "0.01")

DIFFERENCES: Mapping[str, str] = MappingProxyType({
    "fp32-gradients": "the paper counts a 4-byte fp32 copy of the gradients (20 B per parameter); "
                      "the chapter's mixed-precision Adam has 16 B",
    "paper-activation-formula": "the paper's activation working memory counts 16 x hidden + 2 x "
                                "heads x seq bytes per token; zerolib counts Korthikanti et al.'s "
                                "34 x hidden + 5 x heads x seq for the same GPT block (Q, K, V, "
                                "the softmax output, dropout masks and outputs)",
    "printed-at-5-bytes": "printed 1.95 = 1.25 x 1.5625: the one cell inconsistent with the other "
                          "rows' 4 bytes per element of the largest layer",
})
FIGURE_ITEMS = ("parameters", "model states", "activations", "activation checkpoints",
         "model-state working memory", "activation working memory")


def load(data_dir=None) -> pd.DataFrame:
    return read_transcription(data_dir, CSV, COLUMNS, COLUMNS[5:] + ("params_t",),
                              "the ZeRO-Infinity Figure 2(a) values")


def paper_params(layers: int, hidden: int) -> int:
    """12 x layers x hidden^2."""
    return 12 * layers * hidden * hidden


def _paper_awm(hidden: int, heads: int) -> int:
    return WORKING_BATCH_PER_GPU * SEQ_LEN * (16 * hidden + 2 * heads * SEQ_LEN)


def values(layers: int, hidden: int, heads: int) -> dict[str, tuple]:
    """Per item: (bytes or count under the paper's convention, zerolib's chapter value, unit
    divisor, the paper's convention in words, named differences of the chapter value)."""
    params = paper_params(layers, hidden)
    states = int(model_state(params, 1, 0, LAYOUT).total)
    checkpoints = layers * layer_activation_bytes(SEQ_LEN, CHECKPOINT_BATCH_PER_NODE, hidden, heads,
                                                  recompute="full")
    largest = int(model_state(hidden * 4 * hidden, 1, 0, WORKING_LAYOUT).total)
    awm = _paper_awm(hidden, heads)
    korthikanti = layer_activation_bytes(SEQ_LEN, WORKING_BATCH_PER_GPU, hidden, heads)
    return {
        "parameters": (params, params, TRILLION, "12 x layers x hidden^2, decimal trillions", ""),
        "model states": (states, int(model_state(params, 1, 0, CHAPTER_LAYOUT).total), TiB,
                         "zerolib stage 0, layout zero-infinity (20 B), TiB", "fp32-gradients"),
        "activations": (GPUS_PER_NODE * layers * awm, GPUS_PER_NODE * layers * korthikanti, TiB,
                        "16 GPUs x layers x the activation working memory, TiB",
                        "paper-activation-formula"),
        "activation checkpoints": (checkpoints, checkpoints, TiB,
                                   "layers x layer_activation_bytes(1024, 32, full), TiB", ""),
        "model-state working memory": (largest, largest, GiB,
                                       "largest linear (hidden x 4 hidden) at 2 + 2 B, GiB", ""),
        "activation working memory": (awm, korthikanti, GiB,
                                      "4 x 1024 x (16 hidden + 2 heads x 1024) B, GiB",
                                      "paper-activation-formula"),
    }


_COLUMN_OF = dict(zip(FIGURE_ITEMS, ("params_t", "model_states_tb", "activations_tb_per_node",
                              "activation_checkpoints_tb_per_node",
                              "model_state_working_memory_gb", "activation_working_memory_gb")))
_UNITS = {TRILLION: "trillions", TiB: "TiB (labelled TB)", GiB: "GiB (labelled GB)"}


def comparison(data_dir=None) -> pd.DataFrame:
    """Every printed value of Figure 2(a): the paper's convention reproduced, and zerolib's own
    number beside it (30 rows)."""
    rows = []
    for record in load(data_dir).to_dict("records"):
        layers, hidden, heads = (int(record[c]) for c in ("layers", "hidden", "attention_heads"))
        for item, (value, chapter, unit, how, differs) in values(layers, hidden, heads).items():
            note = "printed-at-5-bytes" if item == "model-state working memory" else ""
            printed = Printed(SOURCE, item, f"{record['params_t']}T ({layers} layers, hidden "
                              f"{record['hidden_printed']}, {heads} heads)",
                              record[_COLUMN_OF[item]], _UNITS[unit], TWO_DECIMALS, note=note)
            rows.append(row(printed, exact(value, unit), how, exact(chapter, unit), differs))
    return frame(rows)


def figure_table(data_dir=None) -> pd.DataFrame:
    """Figure 2(a) laid out as printed, each value followed by zerolib's reproduction as
    printed (a mark where the two differ)."""
    table = comparison(data_dir)
    model = table["setting"].str.extract(r"^(\S+)T")[0]
    cells = [p if agrees else f"{p} (zerolib {r})" for p, r, agrees in
             zip(table["printed"], table["reproduced_as_printed"], table["agrees"])]
    wide = pd.DataFrame({"params [T]": model, "item": table["item"], "cell": cells}).pivot(
        index="params [T]", columns="item", values="cell")
    return wide.reindex(pd.unique(model))[[i for i in FIGURE_ITEMS if i != "parameters"]]
