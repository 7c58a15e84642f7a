"""The model-size explorer: per-GPU model state of several model sizes at one GPU count, as
grouped bars, with which strategy makes each model's state fit.

:func:`verdicts`, :func:`summary_html` and :func:`fits_table_html` are pure (tested without
widgets); they read the drawn table and judge **model state** against the device.
"""
from __future__ import annotations

import html

import pandas as pd

from zerolib.chapter.charts.model_size import (
    FIGSIZE,
    MARGINS,
    draw_memory_vs_model_size,
    update_memory_vs_model_size,
)
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    Explorer,
    LayoutControls,
    device_and_unit,
    in_unit,
    widgets,
)
from zerolib.chapter.explorers.gpu_count import MODEL_SIZES
from zerolib.chapter.fast_png import text_blocks
from zerolib.chapter.figures import DEFAULTS as PUBLISHED
from zerolib.chapter.style import device_label, layout_summary
from zerolib.core.catalogue.devices import Device, capacity_text
from zerolib.core.memory.accounting import STAGES, STRATEGY_NAMES, Layout
from zerolib.core.memory.tables import memory_table
from zerolib.core.units import format_count

CHAPTER_SIZES = PUBLISHED.model_sizes   # the five of the chapter's model-size figure


def first_fitting_stage(table: pd.DataFrame, device: Device) -> dict[int, int | None]:
    """Per model size in ``table``: the lowest stage whose model state fits, or None."""
    fitting = table[table["total"] <= device.capacity]
    first = fitting.groupby("params")["stage"].min()
    return {int(p): (int(first[p]) if p in first.index else None)
            for p in sorted(table["params"].unique())}


def fits_table_html(table: pd.DataFrame, device: Device, unit: str) -> str:
    """Per model and stage, the model state per GPU and whether it fits; the least partitioning
    that fits."""
    gpus = int(table["gpus"].iloc[0])
    first = first_fitting_stage(table, device)
    rows = []
    for params, group in table.groupby("params", sort=True):
        cells = [f"<td style='text-align:right'>{in_unit(total, unit)} "
                 f"({'state fits' if total <= device.capacity else 'too big'})</td>"
                 for total in group.sort_values("stage")["total"]]
        stage = first[int(params)]
        verdict = (STRATEGY_NAMES[stage] if stage is not None
                   else "none: add GPUs or pick a smaller layout")
        rows.append(f"<tr><td>{format_count(int(params))}</td>{''.join(cells)}"
                    f"<td>{html.escape(verdict)}</td></tr>")
    capacity = capacity_text(device, unit)
    headers = "".join(f"<th class='prose'>{html.escape(STRATEGY_NAMES[s])}</th>" for s in STAGES)
    return (f"<table class='prose-last'><caption>Per GPU on {gpus} GPU{'s' if gpus != 1 else ''} against the "
            f"{html.escape(device.label)} ({html.escape(capacity)})</caption>"
            f"<thead><tr><th>Model</th>{headers}<th class='prose'>Least partitioning whose model state fits</th>"
            "</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def summary_html(table: pd.DataFrame, device: Device, unit: str) -> str:
    """The lines above the figure: GPUs, layout, device, a verdict per model, the largest model
    under stage 3."""
    gpus = int(table["gpus"].iloc[0])
    first = first_fitting_stage(table, device)

    def verdict(params):
        stage = first[params]
        if stage is None:
            return f"{format_count(params)}: model state too big even with ZeRO stage 3"
        if stage == 0:
            return f"{format_count(params)}: model state fits even without ZeRO"
        return f"{format_count(params)}: model state needs ZeRO stage {stage} or higher"

    largest = max(first)
    stage3 = table[(table["params"] == largest) & (table["stage"] == 3)]["total"].iloc[0]
    return (f"<p><b>{gpus} GPU{'s' if gpus != 1 else ''}</b>, "
            f"{html.escape(layout_summary(table.attrs['layout']))}; "
            f"{html.escape(device_label(device, unit))}. "
            f"<br>{html.escape('; '.join(verdict(p) for p in first))}. "
            f"<br>{format_count(largest)} under ZeRO stage 3: {in_unit(stage3, unit)} of model state "
            "per GPU. Model state only: the peak adds activations and buffers (notebook 4).</p>")


class ModelSizeExplorer(Explorer):
    """Per-GPU model state of several model sizes at one GPU count, as grouped bars (log scale).

    Controls: ``gpus`` (1 to 1024), ``models`` (which sizes are shown), ``layout`` and
    ``parameters_bytes``/``gradients_bytes``/``optimizer_bytes``, ``device``, ``unit``. The table
    says which strategy makes which model's state fit the chosen device.
    """

    PANEL = (
        ("GPUs and models", ("gpus", "models")),
        ("Bytes per parameter", ("layout", "parameters_bytes", "gradients_bytes", "optimizer_bytes")),
        ("Device", ("device", "unit", "capacity")),
    )

    def __init__(self, gpus: int = 64, models=CHAPTER_SIZES, layout: str | Layout = "mixed-adam",
                 device: str = "a100-80gb", unit: str = "GB", dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = widgets()
        models = tuple(int(m) for m in models)
        if not models or any(m not in MODEL_SIZES for m in models):
            raise ValueError(f"models must be sizes from {', '.join(format_count(p) for p in MODEL_SIZES)}")
        self._layout = LayoutControls(layout, self.redraw, self.reporting)
        self.controls = {
            "gpus": w.IntSlider(value=gpus, min=1, max=1024, description="GPUs",
                                continuous_update=True),
            "models": w.SelectMultiple(options=[(format_count(p), p) for p in MODEL_SIZES],
                                       value=models, rows=6, description="Models"),
            **self._layout.controls,
            **device_and_unit(device, unit),
        }
        self.data = self._table()
        self._start(FIGSIZE, MARGINS, text_blocks,
                    lambda ax: draw_memory_vs_model_size(ax, self.data, self.device, self.unit))
        self.widget = self._box()

    @property
    def gpus(self) -> int:
        return int(self.controls["gpus"].value)

    @property
    def models(self) -> tuple[int, ...]:
        return tuple(sorted(int(m) for m in self.controls["models"].value))

    @property
    def layout(self) -> Layout:
        return self._layout.current()

    def _table(self):
        return memory_table(self.models, self.gpus, STAGES, self.layout)

    def _update(self) -> bool:
        if not self.models:
            # Nothing to draw: keep the last figure and say why.
            self.summary.value = "<p><b>Select at least one model size</b> to draw the bars.</p>"
            return False
        self.data = self._table()
        update_memory_vs_model_size(self.artists, self.data, self.device, self.unit)
        self._describe()
        return True

    def _describe(self):
        self.table.value = fits_table_html(self.data, self.device, self.unit)
        self.summary.value = summary_html(self.data, self.device, self.unit)
