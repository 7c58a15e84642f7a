"""The shard explorer: who holds which partition of parameters, gradients and optimizer state,
for a chosen stage, GPU count, model size, layout and unit.

The figure is one panel of :func:`zerolib.chapter.charts.shards.draw_shards` (the published
``shards-by-stage`` figure draws four of them), redrawn in place by
:func:`~zerolib.chapter.charts.shards.update_shards`. :func:`summary_html` and
:func:`stages_html` are pure (tested without widgets).
"""
from __future__ import annotations

import html

import pandas as pd

from zerolib.chapter.charts.shards import draw_shards, legend_handles, update_shards
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    Explorer,
    LayoutControls,
    unit_label,
    widgets,
)
from zerolib.chapter.explorers.gpu_count import MODEL_SIZES
from zerolib.chapter.style import gpus_text, layout_summary, style
from zerolib.core.memory.accounting import CATEGORIES, PARTITIONED, STAGES, STRATEGY_NAMES, Layout
from zerolib.core.memory.tables import shard_table
from zerolib.core.units import UNITS, check_unit, format_count

FIGSIZE = (8.0, 5.6)   # inches: 640 x 448 pixels at the explorers' dpi
# Margins (inches; left, right, bottom, top): the band names, the GPU names and the legend
# below, the two-line title above.
MARGINS = (1.05, 0.2, 1.0, 0.75)
GPU_RANGE = (2, 16)     # columns that stay readable, one per GPU
STAGE_WORDS = {0: "0: plain DP", 1: "1", 2: "2", 3: "3"}
CATEGORY_WORDS = {"parameters": "parameters", "gradients": "gradients",
                  "optimizer": "optimizer state"}


def panel_title(table: pd.DataFrame, stage: int, unit: str) -> str:
    """The figure's title: the stage, the model, the GPUs and the unit of the column labels."""
    params, gpus = int(table["params"].iloc[0]), int(table["gpus"].iloc[0])
    return (f"{STRATEGY_NAMES[stage]}\n{format_count(params)} parameters on {gpus_text(gpus)}; "
            f"bytes per GPU in {unit} over each column")


def _stage_rows(table: pd.DataFrame, stage: int) -> pd.DataFrame:
    rows = table[table["stage"] == stage].reset_index(drop=True)
    if rows.empty:
        raise ValueError(f"stage must be one of {', '.join(map(str, STAGES))}, got {stage!r}")
    rows.attrs.update(table.attrs)
    return rows


def summary_html(table: pd.DataFrame, stage: int, unit: str) -> str:
    """The lines above the figure: the model and layout, then one GPU's bytes at ``stage``,
    category by category, and what the stage partitions."""
    rows = _stage_rows(table, stage)
    label = unit_label(unit)
    gpu = rows[rows["gpu"] == 0].set_index("category")
    parts = " + ".join(f"{CATEGORY_WORDS[c]} {label(gpu.at[c, 'bytes'])}" for c in CATEGORIES)
    total = label(int(gpu["bytes"].sum()))
    split = [CATEGORY_WORDS[c] for c in PARTITIONED[stage]]
    gpus = int(rows["gpus"].iloc[0])
    words = " and ".join(split) if len(split) < 3 else f"{split[0]}, {split[1]} and {split[2]}"
    partitioned = (f"each GPU holds 1/{gpus} of the {words}, the partition it owns"
                   if split else "every GPU holds everything")
    return (f"<p><b>{format_count(int(rows['params'].iloc[0]))} parameters</b> on "
            f"{gpus_text(gpus)}, {html.escape(layout_summary(table.attrs['layout']))}."
            f"<br>{html.escape(STRATEGY_NAMES[stage])}: {html.escape(partitioned)}. "
            f"Per GPU: {html.escape(parts)} = <b>{html.escape(total)}</b>.</p>")


def stages_html(table: pd.DataFrame, unit: str) -> str:
    """Per stage, one GPU's bytes by category and in all, at the explorer's setting."""
    label = unit_label(unit)
    first = table[table["gpu"] == 0]
    rows = []
    for stage in sorted(set(first["stage"])):
        held = first[first["stage"] == stage].set_index("category")["bytes"]
        cells = "".join(f"<td style='text-align:right'>{html.escape(label(held[c]))}</td>"
                        for c in CATEGORIES)
        rows.append(f"<tr><td>{html.escape(STRATEGY_NAMES[int(stage)])}</td>{cells}"
                    f"<td style='text-align:right'><b>{html.escape(label(int(held.sum())))}</b>"
                    "</td></tr>")
    gpus = int(table["gpus"].iloc[0])
    return (f"<table><caption>Bytes one GPU holds under each strategy, "
            f"{format_count(int(table['params'].iloc[0]))} parameters on {gpus_text(gpus)}"
            "</caption><thead><tr><th>Strategy</th><th>Parameters</th><th>Gradients</th>"
            "<th>Optimizer state</th><th>Per GPU</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


class ShardExplorer(Explorer):
    """Who holds which partition, live: one column per GPU, parameters, gradients and optimizer
    state as blocks, each GPU's own partition coloured.

    Controls: ``stage`` (0-3), ``gpus`` (2 to 16), ``params`` (model size), ``layout`` and
    ``parameters_bytes``/``gradients_bytes``/``optimizer_bytes``, ``unit``. The table lists one
    GPU's bytes under every strategy at that setting.
    """

    PANEL = (
        ("Model, GPUs and stage", ("params", "gpus", "stage")),
        ("Bytes per parameter", ("layout", "parameters_bytes", "gradients_bytes", "optimizer_bytes")),
        ("Unit", ("unit",)),
    )

    def __init__(self, stage: int = 1, gpus: int = 4, params: int = 7 * 10**9,
                 layout: str | Layout = "mixed-adam", unit: str = "GB",
                 dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = widgets()
        if stage not in STAGES or isinstance(stage, bool):
            raise ValueError(f"stage must be one of {', '.join(map(str, STAGES))}, got {stage!r}")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not GPU_RANGE[0] <= gpus <= GPU_RANGE[1]:
            raise ValueError(f"gpus must be a whole number from {GPU_RANGE[0]} to {GPU_RANGE[1]}, "
                             f"got {gpus!r}")
        if params not in MODEL_SIZES:
            raise ValueError(f"params must be one of {', '.join(format_count(p) for p in MODEL_SIZES)}")
        check_unit(unit)
        self._layout = LayoutControls(layout, self.redraw, self.reporting)
        self.controls = {
            "params": w.SelectionSlider(options=[(format_count(p), p) for p in MODEL_SIZES],
                                        value=params, description="Model size",
                                        continuous_update=True),
            "gpus": w.IntSlider(value=gpus, min=GPU_RANGE[0], max=GPU_RANGE[1], step=1,
                                description="GPUs", continuous_update=True),
            "stage": w.ToggleButtons(options=[(STAGE_WORDS[s], s) for s in STAGES], value=stage,
                                     description="ZeRO stage"),
            **self._layout.controls,
            "unit": w.ToggleButtons(options=list(UNITS), value=unit, description="Unit",
                                    style={"button_width": "60px"}),
        }
        self.data = self._table()
        self._start(FIGSIZE, MARGINS, lambda artists: [artists.ax.title, artists.legend],
                    self._draw)
        self.widget = self._box()

    def _draw(self, ax):
        artists = draw_shards(ax, _stage_rows(self.data, self.stage), self.unit,
                              panel_title(self.data, self.stage, self.unit))
        with style():
            artists.legend = ax.legend(handles=legend_handles(("not held",)),
                                       loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2,
                                       frameon=False, fontsize=9.5)
        return artists

    # Current settings, read from the controls.
    @property
    def params(self) -> int:
        return int(self.controls["params"].value)

    @property
    def gpus(self) -> int:
        return self.controls["gpus"].value

    @property
    def stage(self) -> int:
        return self.controls["stage"].value

    @property
    def layout(self) -> Layout:
        return self._layout.current()

    def _table(self) -> pd.DataFrame:
        return shard_table(self.params, self.gpus, STAGES, self.layout)

    def _update(self) -> bool:
        check_unit(self.unit)
        data = self._table()
        rows = _stage_rows(data, self.stage)
        self.data = data
        update_shards(self.artists, rows, self.unit, panel_title(data, self.stage, self.unit))
        self._describe()
        return True

    def _describe(self):
        self.summary.value = summary_html(self.data, self.stage, self.unit)
        self.table.value = stages_html(self.data, self.unit)
