"""The Hugging Face Ultra-Scale Playbook's memory numbers, as a named convention.

Source: "The Ultra-Scale Playbook: Training LLMs on GPU Clusters" (Tazi, Mom, Zhao, Nguyen,
Mekkouri, Werra, Wolf; Hugging Face, 2025), the Space ``nanotron/ultrascale-playbook``, read
from its public mirror ``vinjn/nanotron-ultrascale-playbook`` at commit
e3bcfc5c0b177d5f259a65465ddf0f880c71577f. Three transcriptions in ``data/`` (described in
``data/ultrascale_playbook.md``):

- ``ultrascale_playbook_memory_table.csv``: the text's table of model-state memory for 1B to
  405B parameters, "FP32 or BF16 w/o FP32 grad acc" and "BF16 w/ FP32 grad acc";
- ``ultrascale_playbook_model_memory.csv``: the plotted data of "Memory Usage vs Sequence Length
  for Different Model Sizes" (``assets/data/benchmarks/dp_ourjourney_memoryusage.html``);
- ``ultrascale_playbook_zero_figure.csv``: the plotted data of "Memory Usage for 8B Model",
  panels DP=8 and DP=8 ZeRO-1/2/3 (``assets/data/benchmarks/zero3_memoryusage.html``).

The conventions, worked out from the numbers (each reproduces every value below exactly):

- The text's table counts 16 or 20 bytes per parameter in decimal GB: 2 + 2 + 12 (or 4 + 4 + 8
  in fp32), and 2 + (2 + 4) + 12 with fp32 gradient accumulation.
- The plots count **Adam's two moments only**, 8 bytes per parameter: no fp32 master copy, so
  12 bytes in all, not the text's 16 (the text's own k = 12 says otherwise); parameters and
  gradients in bf16.
- The plots' "GB" are GiB (2**30 bytes), and their parameter counts are Llama-3's architecture
  without the RMSNorm weights (Llama-3.1-8B: 8,030,261,248 - 65 x 4,096 = 8,029,995,008).
- Activations are 34 x seq x hidden x layers bytes (micro-batch 1): Korthikanti et al.'s GPT
  block with selective recomputation, applied to Llama's sizes (zerolib:
  ``layer_activation_bytes(..., recompute="selective")`` x layers).
- The ZeRO figure rounds each unsharded value to a whole GiB first (14.957 -> 15, 59.83 -> 60)
  and then divides by N_d = 8 where the stage shards it (15 / 8 = 1.875, 60 / 8 = 7.5).
"""
from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig, get_model, modules, parameter_count
from zerolib.core.memory.accounting import PARTITIONED, Layout, get_layout, model_state
from zerolib.core.memory.activations import (
    ActivationOptions,
    layer_activation_bytes,
    model_activation_terms,
)
from zerolib.core.units import GB, GiB
from zerolib.crosscheck.conventions.common import Printed, exact, frame, read_transcription, row
from zerolib.crosscheck.paper import PrintRule

SOURCE = "Ultra-Scale Playbook"
TABLE_CSV = "ultrascale_playbook_memory_table.csv"
MODEL_CSV = "ultrascale_playbook_model_memory.csv"
ZERO_CSV = "ultrascale_playbook_zero_figure.csv"

# The plots: bf16 parameters and gradients, Adam's moments in fp32, no master copy.
PLOT_LAYOUT = Layout("playbook-plots", {
    "parameters": (("bf16 parameters", 2),),
    "gradients": (("bf16 gradients", 2),),
    "optimizer": (("fp32 Adam momentum", 4), ("fp32 Adam variance", 4)),
}, "Ultra-Scale Playbook plots: bf16 parameters and gradients, Adam moments (no fp32 master)")
# The text's table: its two columns.
TABLE_LAYOUTS: Mapping[str, Layout] = MappingProxyType({
    "FP32 or BF16 w/o FP32 grad acc": get_layout("mixed-adam"),
    "BF16 w/ FP32 grad acc": Layout("bf16-fp32-grad-acc", {
        "parameters": (("bf16 parameters", 2),),
        "gradients": (("bf16 gradients", 2), ("fp32 gradient accumulation", 4)),
        "optimizer": (("fp32 master parameters", 4), ("fp32 momentum", 4), ("fp32 variance", 4)),
    }, "bf16 with fp32 gradient accumulation (Ultra-Scale Playbook, 20 B)"),
})
CHAPTER_LAYOUT = "mixed-adam"

# Llama-3.2-1B, the plots' "1B model" (huggingface.co/meta-llama/Llama-3.2-1B config.json:
# hidden 2048, 16 layers, 32 heads, 8 key/value heads, MLP 8192, vocabulary 128,256, tied).
LLAMA_3_2_1B = TransformerConfig(
    "llama-3.2-1b", hidden=2048, layers=16, heads=32, kv_heads=8, ffn_hidden=8192, vocab=128256,
    max_positions=131072, tied_embeddings=True, gated_mlp=True,
    source="Config: huggingface.co/meta-llama/Llama-3.2-1B config.json.")
PLOT_MODELS: Mapping[str, TransformerConfig] = MappingProxyType({
    "1B": LLAMA_3_2_1B, "8B": get_model("llama-3-8b"), "70B": get_model("llama-3-70b")})

ZERO_COMPONENTS = MappingProxyType({"Model Parameters": "parameters", "Gradients": "gradients",
                                    "Optimizer States": "optimizer", "Activations": "activations"})
MODEL_COMPONENTS = MappingProxyType({"parameters": "parameters", "gradients": "gradients",
                                     "optimizer states": "optimizer", "activations": "activations"})
WHOLE_GIB = PrintRule("round", "1")   # the ZeRO figure's rounding before dividing by N_d

DIFFERENCES: Mapping[str, str] = MappingProxyType({
    "no-master-weights": "the plots count Adam's momentum and variance only (8 B per parameter); "
                         "the chapter adds the fp32 master parameters (12 B)",
    "norms-left-out": "the plots' parameter counts leave out the RMSNorm weights (65 x 4,096 for "
                      "Llama-3-8B)",
    "rounded-then-divided": "the ZeRO figure rounds the unsharded GiB to a whole number, then "
                            "divides by N_d",
    "gpt-block-activations": "the plots apply Korthikanti's GPT block with selective "
                             "recomputation (34 B per token per hidden unit per layer) to Llama; "
                             "the chapter counts Llama's own block (gated MLP, grouped "
                             "key/value heads, no dropout) with selective recomputation",
    "fp32-gradient-accumulation": "the table's second column adds a 4-byte fp32 gradient "
                                  "accumulator; the chapter's layout has none",
})


def load_table(data_dir=None) -> pd.DataFrame:
    return read_transcription(data_dir, TABLE_CSV, ("model", "params", "column", "printed"),
                              ("printed",), "the Ultra-Scale Playbook's memory table")


def load_model_memory(data_dir=None) -> pd.DataFrame:
    return read_transcription(data_dir, MODEL_CSV, ("panel", "model", "seq_len", "component",
                                                    "printed_gb"),
                              ("printed_gb",), "the Ultra-Scale Playbook's model-memory plot")


def load_zero_figure(data_dir=None) -> pd.DataFrame:
    return read_transcription(data_dir, ZERO_CSV, ("panel", "stage", "dp_degree", "seq_len",
                                                   "component", "printed_gb"),
                              ("printed_gb",), "the Ultra-Scale Playbook's ZeRO figure")


def plot_parameter_count(config: TransformerConfig | str) -> int:
    """The plots' count: the architecture's parameters without the norm weights."""
    return sum(m.elements * m.count for m in modules(get_model(config))
               if not m.shared and "norm" not in m.name)


def plot_activation_bytes(config: TransformerConfig | str, seq_len: int) -> int:
    """34 x seq x hidden bytes per layer (GPT block, selective recomputation, micro-batch 1)."""
    config = get_model(config)
    return config.layers * layer_activation_bytes(seq_len, 1, config.hidden, config.heads,
                                                  recompute="selective", dropout=True)


def chapter_activation_bytes(config: TransformerConfig | str, seq_len: int) -> int:
    """zerolib's own count for the model's block (selective recomputation, micro-batch 1), all
    layers; without the logits and the final norm's and projection's inputs."""
    terms = model_activation_terms(get_model(config), seq_len, 1,
                                   options=ActivationOptions(recompute="selective"))
    return terms["transformer_layers"]


def _plot_bytes(config, component: str, seq_len: int, layout, stage: int = 0, gpus: int = 1) -> int:
    if component == "activations":
        return plot_activation_bytes(config, seq_len)
    return int(getattr(model_state(plot_parameter_count(config), gpus, stage, layout), component))


def _chapter_bytes(config, component: str, seq_len: int, stage: int = 0, gpus: int = 1) -> int:
    if component == "activations":
        return chapter_activation_bytes(config, seq_len)
    return int(getattr(model_state(parameter_count(config), gpus, stage, CHAPTER_LAYOUT), component))


def _plot_differences(component: str) -> str:
    return {"parameters": "norms-left-out", "gradients": "norms-left-out",
            "optimizer": "norms-left-out no-master-weights",
            "activations": "gpt-block-activations"}[component]


def table_comparison(data_dir=None) -> pd.DataFrame:
    """The text's table: decimal GB of 16 or 20 bytes per parameter, exact."""
    rows = []
    for cell in load_table(data_dir).to_dict("records"):
        layout = TABLE_LAYOUTS[cell["column"]]
        params = int(cell["params"])
        total = int(model_state(params, 1, 0, layout).total)
        chapter = int(model_state(params, 1, 0, CHAPTER_LAYOUT).total)
        printed = cell["printed"].removesuffix(" GB")
        shown = Printed(SOURCE, "model state", f"memory table, {cell['model']}, {cell['column']}",
                        printed, "GB (10^9 B)")
        rows.append(row(shown, exact(total, GB),
                        f"zerolib stage 0, layout {layout.name} ({layout.total:g} B), GB",
                        exact(chapter, GB),
                        "" if layout.name == CHAPTER_LAYOUT else "fp32-gradient-accumulation"))
    return frame(rows)


def model_memory_comparison(data_dir=None) -> pd.DataFrame:
    """The model-size plot (no parallelism): exact GiB of the plots' convention."""
    rows = []
    for cell in load_model_memory(data_dir).to_dict("records"):
        config, component = PLOT_MODELS[cell["model"]], MODEL_COMPONENTS[cell["component"]]
        seq = int(cell["seq_len"])
        shown = Printed(SOURCE, component, f"model-size plot, {cell['panel']}, seq {seq}",
                        cell["printed_gb"], "GiB (labelled GB)")
        rows.append(row(
            shown, exact(_plot_bytes(config, component, seq, PLOT_LAYOUT), GiB),
            f"{config.name} without norm weights, layout {PLOT_LAYOUT.name}, GiB",
            exact(_chapter_bytes(config, component, seq), GiB), _plot_differences(component)))
    return frame(rows)


def zero_figure_value(config, component: str, seq_len: int, stage: int, dp_degree: int) -> Decimal:
    """What the ZeRO figure plots (GiB): the unsharded value rounded to a whole GiB, divided by
    N_d where the stage shards the category; activations as they are."""
    unsharded = exact(_plot_bytes(config, component, seq_len, PLOT_LAYOUT), GiB)
    if component == "activations":
        return unsharded
    whole = WHOLE_GIB.apply(unsharded)
    return whole / dp_degree if component in PARTITIONED[stage] else whole


def zero_figure_comparison(data_dir=None) -> pd.DataFrame:
    """The ZeRO figure (8B, N_d = 8): every plotted value against the plots' convention, the
    exact value zerolib gives under it, and the chapter's own number."""
    config = PLOT_MODELS["8B"]
    rows, exact_values = [], []
    for cell in load_zero_figure(data_dir).to_dict("records"):
        component = ZERO_COMPONENTS[cell["component"]]
        stage, dp, seq = int(cell["stage"]), int(cell["dp_degree"]), int(cell["seq_len"])
        plotted = zero_figure_value(config, component, seq, stage, dp)
        exact_values.append(float(exact(_plot_bytes(config, component, seq, PLOT_LAYOUT, stage,
                                                     dp), GiB)))
        differs = _plot_differences(component)
        if component != "activations":
            differs += " rounded-then-divided"
        shown = Printed(SOURCE, component, f"ZeRO figure, {cell['panel']}, seq {seq}",
                        cell["printed_gb"], "GiB (labelled GB)")
        rows.append(row(
            shown, plotted,
            f"{config.name} without norm weights, layout {PLOT_LAYOUT.name}, whole GiB / N_d",
            exact(_chapter_bytes(config, component, seq, stage, dp), GiB), differs))
    # Beside the plotted value: zerolib's exact bytes under the plots' convention, unrounded.
    return frame(rows).assign(exact=exact_values)


def comparison(data_dir=None) -> pd.DataFrame:
    """All three transcriptions, one row per printed value."""
    return pd.concat([table_comparison(data_dir), model_memory_comparison(data_dir),
                      zero_figure_comparison(data_dir).drop(columns="exact")], ignore_index=True)


def zero_figure_panels(data_dir=None) -> pd.DataFrame:
    """The ZeRO figure at sequence length 4,096 as a small table: per panel and component,
    the plotted GiB, zerolib under the plots' convention (exact), and the chapter's GiB."""
    table = zero_figure_comparison(data_dir)
    table = table[table["setting"].str.endswith("seq 4096")]
    panel = table["setting"].str.extract(r"ZeRO figure, (.*), seq")[0]
    return pd.DataFrame({"panel": panel, "component": table["item"],
                         "plotted [GiB]": table["printed"],
                         "plots' convention, exact [GiB]": table["exact"],
                         "as plotted": table["reproduced_as_printed"],
                         "chapter [GiB]": table["chapter"].round(3)}).reset_index(drop=True)
