"""The GPU-count explorer: per-GPU model state against GPU count for a chosen model size,
layout, device and unit, with the fewest GPUs per strategy.

:func:`summary_html` and :func:`fewest_gpus_html` are pure (tested without widgets); the
explorer writes what they return into its HTML widgets.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from zerolib.chapter.charts.gpu_count import (
    FIGSIZE,
    MARGINS,
    draw_memory_vs_gpu_count,
    update_memory_vs_gpu_count,
)
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    Explorer,
    LayoutControls,
    device_and_unit,
    in_unit,
    widgets,
)
from zerolib.chapter.fast_png import text_blocks
from zerolib.chapter.style import device_label, gpus_text, layout_summary
from zerolib.core.catalogue.devices import Device, capacity_text
from zerolib.core.inputs import MAX_GPUS
from zerolib.core.memory.accounting import STAGES, STRATEGY_NAMES, Layout, model_state
from zerolib.core.memory.tables import fewest_gpus_table, memory_table, show_never
from zerolib.core.units import format_count

# Model sizes a reader can pick (parameters). The chapter's five, plus common sizes around them.
MODEL_SIZES = tuple(int(n) for n in (
    125e6, 350e6, 1e9, 1.3e9, 3e9, 7e9, 8e9, 13e9, 30e9, 34e9, 65e9, 70e9, 175e9, 405e9, 1e12))
GPU_RANGE_STEPS = tuple(2**k for k in range(11))  # 1, 2, 4, ..., 1024


def summary_html(table: pd.DataFrame, device: Device, unit: str) -> str:
    """The lines above the figure: the model, the GPU range, the layout, the values at the
    largest GPU count, the reference line."""
    layout = table.attrs["layout"]
    params = int(table["params"].iloc[0])
    gpus = np.unique(table["gpus"].to_numpy())
    last = table[table["gpus"] == gpus[-1]]
    values = "; ".join(f"{STRATEGY_NAMES[int(row.stage)]}: {in_unit(row.total, unit)}"
                       for row in last.itertuples())
    span = gpus_text(gpus[0]) if len(gpus) == 1 else f"{gpus[0]} to {gpus[-1]} GPUs"
    return (f"<p><b>{format_count(params)} parameters</b> on {span}, "
            f"{html.escape(layout_summary(layout))}. "
            f"<br>Per GPU at {gpus[-1]} GPU{'s' if gpus[-1] != 1 else ''}: {html.escape(values)}. "
            f"<br>Reference line: {html.escape(device_label(device, unit))}.</p>")


def fewest_gpus_html(params: int, layout: Layout, device: Device, unit: str) -> str:
    """Per strategy, the fewest GPUs whose model state fits ``device``, and the bytes there."""
    fewest = fewest_gpus_table(params, layout, device, STAGES, max_gpus=MAX_GPUS)
    rows = []
    for row in fewest.itertuples():
        stage = int(row.stage)
        if pd.isna(row.fewest_gpus):
            floor = model_state(params, MAX_GPUS, stage, layout).total
            cell, per_gpu = show_never(row.fewest_gpus), f"at least {in_unit(floor, unit)} at any GPU count"
        else:
            n = int(row.fewest_gpus)
            cell = str(n)
            per_gpu = in_unit(model_state(params, n, stage, layout).total, unit)
        rows.append(f"<tr><td>{html.escape(STRATEGY_NAMES[stage])}</td>"
                    f"<td style='text-align:right'>{cell}</td><td style='text-align:right'>"
                    f"{html.escape(per_gpu)}</td></tr>")
    return (
        f"<table><caption>Fewest GPUs at which each strategy's model state fits the "
        f"{html.escape(device.label)} "
        f"({html.escape(capacity_text(device, unit))}), "
        f"{format_count(params)} parameters</caption>"
        "<thead><tr><th>Strategy</th><th>Fewest GPUs</th><th class='prose'>Model state per GPU there</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>")


class GpuCountExplorer(Explorer):
    """Per-GPU model state against GPU count for a chosen model size, layout, device and unit.

    Controls: ``params`` (model size), ``gpus`` (GPU-count range, powers of two), ``layout`` and
    ``parameters_bytes``/``gradients_bytes``/``optimizer_bytes``, ``device``, ``unit``. The table
    lists, per strategy, the fewest GPUs at which it fits the chosen device.
    """

    PANEL = (
        ("Model and GPUs", ("params", "gpus")),
        ("Bytes per parameter", ("layout", "parameters_bytes", "gradients_bytes", "optimizer_bytes")),
        ("Device", ("device", "unit", "capacity")),
    )

    def __init__(self, params: int = 7 * 10**9, gpus: tuple[int, int] = (1, 64),
                 layout: str | Layout = "mixed-adam", device: str = "a100-80gb",
                 unit: str = "GB", dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = widgets()
        if params not in MODEL_SIZES:
            raise ValueError(f"params must be one of {', '.join(format_count(p) for p in MODEL_SIZES)}")
        low, high = gpus
        if low not in GPU_RANGE_STEPS or high not in GPU_RANGE_STEPS or low > high:
            raise ValueError(f"gpus must be a (low, high) pair from {GPU_RANGE_STEPS}")
        self._layout = LayoutControls(layout, self.redraw, self.reporting)
        self._fewest_key = None
        self.controls = {
            "params": w.SelectionSlider(options=[(format_count(p), p) for p in MODEL_SIZES],
                                        value=params, description="Model size",
                                        continuous_update=True),
            "gpus": w.SelectionRangeSlider(options=[(str(n), n) for n in GPU_RANGE_STEPS],
                                           value=(low, high), description="GPUs",
                                           continuous_update=True),
            **self._layout.controls,
            **device_and_unit(device, unit),
        }
        self.data = self._table()
        self._start(FIGSIZE, MARGINS, text_blocks,
                    lambda ax: draw_memory_vs_gpu_count(ax, self.data, self.device, self.unit))
        self.widget = self._box()

    # Current settings, read from the controls.
    @property
    def params(self) -> int:
        return int(self.controls["params"].value)

    @property
    def gpus(self) -> np.ndarray:
        low, high = self.controls["gpus"].value
        return np.arange(low, high + 1)

    @property
    def layout(self) -> Layout:
        return self._layout.current()

    def _table(self):
        return memory_table(self.params, self.gpus, STAGES, self.layout)

    def _update(self) -> bool:
        self.data = self._table()
        update_memory_vs_gpu_count(self.artists, self.data, self.device, self.unit)
        self._describe()
        return True

    def _describe(self):
        device, unit, layout = self.device, self.unit, self.data.attrs["layout"]
        self.summary.value = summary_html(self.data, device, unit)
        key = (self.params, layout.widths(), device, unit)   # the whole device: its label too
        if key != self._fewest_key:   # the GPU range does not change this table
            self._fewest_key, self.table.value = key, fewest_gpus_html(self.params, layout,
                                                                       device, unit)
