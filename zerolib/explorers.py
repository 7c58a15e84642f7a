"""Live explorers for the notebooks: ipywidgets controls that redraw the chapter's figures in place.

Each explorer exposes ``.widget`` (what a notebook displays), ``.controls`` (name -> ipywidgets
control), ``.figure`` (one pyplot-free matplotlib Figure, kept for the explorer's lifetime) and
``.data`` (the tidy DataFrame currently drawn). A control change recomputes ``.data`` with
zerolib, changes the existing artists through :mod:`zerolib.plotting`'s update functions and
writes freshly rendered PNG bytes into an ``ipywidgets.Image``. No ``display()``, ``interact`` or
``Output`` widget is involved, so the widget state a notebook saves holds the image and strict
nbval passes.
"""
from __future__ import annotations

import html

import numpy as np
import pandas as pd

from . import plotting
from .accounting import LAYOUTS, STAGES, STRATEGY_NAMES, Layout, get_layout, model_state
from .curves import fewest_gpus_table, memory_table
from .devices import DEVICES, get_device
from .feasibility import fits
from .inputs import MAX_GPUS
from .units import UNITS, check_unit, format_count

EXPLORER_DPI = 80   # 640 x 448 pixels for the GPU-count figure: readable, quick to redraw
CUSTOM = "custom"   # the layout dropdown's entry for bytes set with the sliders

# Model sizes a reader can pick (parameters). The chapter's five, plus common sizes around them.
MODEL_SIZES = tuple(int(n) for n in (
    125e6, 350e6, 1e9, 1.3e9, 3e9, 7e9, 8e9, 13e9, 30e9, 34e9, 65e9, 70e9, 175e9, 405e9, 1e12))
CHAPTER_SIZES = (10**9, 7 * 10**9, 13 * 10**9, 30 * 10**9, 70 * 10**9)
GPU_RANGE_STEPS = tuple(2**k for k in range(11))  # 1, 2, 4, ..., 1024


def _widgets():
    import ipywidgets
    return ipywidgets


def _gb(n_bytes, unit: str) -> str:
    return f"{plotting.format_value(float(n_bytes) / check_unit(unit))} {unit}"


class _LayoutControls:
    """A layout dropdown and three bytes-per-parameter sliders kept in step with each other.

    Picking a preset sets the sliders to its widths; moving a slider away from the preset's
    widths switches the dropdown to "custom".
    """

    def __init__(self, layout: "str | Layout", on_change):
        w = _widgets()
        layout = get_layout(layout)
        options = [(f"{name} ({get_layout(name).total:g} bytes/param)", name) for name in LAYOUTS]
        options.append(("custom (bytes per category below)", CUSTOM))
        self.layout = w.Dropdown(options=options,
                                 value=layout.name if layout.name in LAYOUTS else CUSTOM,
                                 description="Layout", style={"description_width": "initial"})
        self.sliders = {
            category: w.FloatSlider(value=width, min=0, max=32, step=0.5, readout_format=".1f",
                                    description=f"{category} bytes/param",
                                    style={"description_width": "initial"},
                                    layout=w.Layout(width="320px"))
            for category, width in zip(("parameters", "gradients", "optimizer"), layout.widths())}
        self._on_change = on_change
        self._syncing = False
        self.layout.observe(self._preset_changed, names="value")
        for slider in self.sliders.values():
            slider.observe(self._slider_changed, names="value")

    @property
    def controls(self) -> dict:
        return {"layout": self.layout,
                **{f"{category}_bytes": slider for category, slider in self.sliders.items()}}

    def current(self) -> Layout:
        if self.layout.value != CUSTOM:
            return LAYOUTS[self.layout.value]
        return Layout.custom(*(slider.value for slider in self.sliders.values()))

    def _preset_changed(self, change):
        if self._syncing:
            return
        if change["new"] != CUSTOM:
            self._syncing = True
            try:
                for slider, width in zip(self.sliders.values(), LAYOUTS[change["new"]].widths()):
                    slider.value = width
            finally:
                self._syncing = False
        self._on_change()

    def _slider_changed(self, _change):
        if self._syncing:
            return
        widths = tuple(slider.value for slider in self.sliders.values())
        if self.layout.value != CUSTOM and LAYOUTS[self.layout.value].widths() != widths:
            self._syncing = True
            try:
                self.layout.value = CUSTOM
            finally:
                self._syncing = False
        self._on_change()


class _Explorer:
    """Shared machinery: the image, the text widgets, observing the controls, redrawing."""

    def __init__(self, dpi: float):
        w = _widgets()
        self.dpi = dpi
        self.image = w.Image(format="png")
        self.summary = w.HTML()
        self.table = w.HTML()
        self.redraws = 0

    def _watch(self):
        for name, control in self.controls.items():
            if name not in ("layout", "parameters_bytes", "gradients_bytes", "optimizer_bytes"):
                control.observe(lambda _change: self.redraw(), names="value")

    def _png(self) -> bytes:
        return self._renderer.render()

    def redraw(self):
        """Recompute ``.data`` from the controls and redraw the same figure in place."""
        if self._update():
            self.image.value = self._png()
            self.redraws += 1

    def _box(self, rows):
        w = _widgets()
        return w.VBox([*rows, self.summary, self.image, self.table])


class GpuCountExplorer(_Explorer):
    """Per-GPU memory against GPU count for a chosen model size, layout, device and unit.

    Controls: ``params`` (model size), ``gpus`` (GPU-count range, powers of two), ``layout`` and
    ``parameters_bytes``/``gradients_bytes``/``optimizer_bytes``, ``device``, ``unit``. The table
    lists, per strategy, the fewest GPUs at which it fits the chosen device.
    """

    def __init__(self, params: int = 7 * 10**9, gpus: tuple[int, int] = (1, 64),
                 layout: "str | Layout" = "mixed-adam", device: str = "a100-80gb",
                 unit: str = "GB", dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = _widgets()
        if params not in MODEL_SIZES:
            raise ValueError(f"params must be one of {', '.join(format_count(p) for p in MODEL_SIZES)}")
        low, high = gpus
        if low not in GPU_RANGE_STEPS or high not in GPU_RANGE_STEPS or low > high:
            raise ValueError(f"gpus must be a (low, high) pair from {GPU_RANGE_STEPS}")
        get_device(device)
        check_unit(unit)
        self._layout = _LayoutControls(layout, self.redraw)
        self._fewest_key = None
        self.controls = {
            "params": w.SelectionSlider(options=[(format_count(p), p) for p in MODEL_SIZES],
                                        value=params, description="Model size",
                                        continuous_update=True),
            "gpus": w.SelectionRangeSlider(options=[(str(n), n) for n in GPU_RANGE_STEPS],
                                           value=(low, high), description="GPUs",
                                           continuous_update=True),
            **self._layout.controls,
            "device": w.Dropdown(options=[(d.label, d.name) for d in DEVICES.values()],
                                 value=get_device(device).name, description="Device"),
            "unit": w.ToggleButtons(options=list(UNITS), value=unit, description="Unit",
                                    style={"button_width": "60px"}),
        }
        self.figure = plotting.new_figure(plotting.GPU_COUNT_FIGSIZE, dpi)
        ax = plotting.add_axes(self.figure, "gpu_count")
        self.data = self._table()
        self.artists = plotting.draw_memory_vs_gpu_count(ax, self.data, self.device, self.unit,
                                                         self.layout)
        self._renderer = plotting.IncrementalPng(self.figure, plotting.text_blocks(self.artists))
        self._describe()
        self.image.value = self._png()
        self._watch()
        c = self.controls
        self.widget = self._box([
            w.HBox([c["params"], c["gpus"]]),
            w.HBox([c["layout"], c["device"], c["unit"]]),
            w.HBox([c["parameters_bytes"], c["gradients_bytes"], c["optimizer_bytes"]]),
        ])

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

    @property
    def device(self):
        return get_device(self.controls["device"].value)

    @property
    def unit(self) -> str:
        return self.controls["unit"].value

    def _table(self):
        return memory_table(self.params, self.gpus, STAGES, self.layout)

    def _update(self) -> bool:
        self.data = self._table()
        plotting.update_memory_vs_gpu_count(self.artists, self.data, self.device, self.unit,
                                            self.layout)
        self._describe()
        return True

    def _describe(self):
        unit, device, gpus = self.unit, self.device, self.gpus
        last = self.data[self.data["gpus"] == gpus[-1]]
        values = "; ".join(f"{STRATEGY_NAMES[int(row.stage)]}: {_gb(row.total, unit)}"
                           for row in last.itertuples())
        span = f"{gpus[0]} GPU" if len(gpus) == 1 else f"{gpus[0]} to {gpus[-1]} GPUs"
        self.summary.value = (
            f"<p><b>{format_count(self.params)} parameters</b> on {span}, "
            f"{html.escape(plotting.layout_summary(self.layout))}. "
            f"<br>Per GPU at {gpus[-1]} GPU{'s' if gpus[-1] != 1 else ''}: {html.escape(values)}. "
            f"<br>Reference line: {html.escape(plotting.device_label(device, unit))}.</p>")
        key = (self.params, self.layout.widths(), device.name, unit)
        if key != self._fewest_key:   # the GPU range does not change this table
            self._fewest_key, self.table.value = key, self._fewest_html(device, unit)

    def _fewest_html(self, device, unit) -> str:
        fewest = fewest_gpus_table(self.params, self.layout, device, STAGES, max_gpus=MAX_GPUS)
        rows = []
        for row in fewest.itertuples():
            stage = int(row.stage)
            if pd.isna(row.fewest_gpus):
                floor = model_state(self.params, MAX_GPUS, stage, self.layout).total
                cell, per_gpu = "never", f"at least {_gb(floor, unit)} at any GPU count"
            else:
                n = int(row.fewest_gpus)
                cell = str(n)
                per_gpu = _gb(model_state(self.params, n, stage, self.layout).total, unit)
            rows.append(f"<tr><td>{html.escape(STRATEGY_NAMES[stage])}</td>"
                        f"<td style='text-align:right'>{cell}</td><td style='text-align:right'>"
                        f"{html.escape(per_gpu)}</td></tr>")
        return (
            f"<table><caption>Fewest GPUs at which each strategy fits the {html.escape(device.label)} "
            f"({html.escape(plotting.device_label(device, unit).split(': ', 1)[1])}), "
            f"{format_count(self.params)} parameters</caption>"
            "<thead><tr><th>Strategy</th><th>Fewest GPUs</th><th>Per GPU there</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


class ModelSizeExplorer(_Explorer):
    """Per-GPU memory of several model sizes at one GPU count, as grouped bars (log scale).

    Controls: ``gpus`` (1 to 1024), ``models`` (which sizes are shown), ``layout`` and
    ``parameters_bytes``/``gradients_bytes``/``optimizer_bytes``, ``device``, ``unit``. The table
    says which strategy makes which model fit the chosen device.
    """

    def __init__(self, gpus: int = 64, models=CHAPTER_SIZES, layout: "str | Layout" = "mixed-adam",
                 device: str = "a100-80gb", unit: str = "GB", dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = _widgets()
        models = tuple(int(m) for m in models)
        if not models or any(m not in MODEL_SIZES for m in models):
            raise ValueError(f"models must be sizes from {', '.join(format_count(p) for p in MODEL_SIZES)}")
        get_device(device)
        check_unit(unit)
        self._layout = _LayoutControls(layout, self.redraw)
        self.controls = {
            "gpus": w.IntSlider(value=gpus, min=1, max=1024, description="GPUs",
                                continuous_update=True),
            "models": w.SelectMultiple(options=[(format_count(p), p) for p in MODEL_SIZES],
                                       value=models, rows=6, description="Models"),
            **self._layout.controls,
            "device": w.Dropdown(options=[(d.label, d.name) for d in DEVICES.values()],
                                 value=get_device(device).name, description="Device"),
            "unit": w.ToggleButtons(options=list(UNITS), value=unit, description="Unit",
                                    style={"button_width": "60px"}),
        }
        self.figure = plotting.new_figure(plotting.MODEL_SIZE_FIGSIZE, dpi)
        ax = plotting.add_axes(self.figure, "model_size")
        self.data = self._table()
        self.artists = plotting.draw_memory_vs_model_size(ax, self.data, self.device, self.unit,
                                                          self.layout)
        self._renderer = plotting.IncrementalPng(self.figure, plotting.text_blocks(self.artists))
        self._describe()
        self.image.value = self._png()
        self._watch()
        c = self.controls
        self.widget = self._box([
            w.HBox([w.VBox([c["gpus"], c["layout"], c["device"], c["unit"]]), c["models"]]),
            w.HBox([c["parameters_bytes"], c["gradients_bytes"], c["optimizer_bytes"]]),
        ])

    @property
    def gpus(self) -> int:
        return int(self.controls["gpus"].value)

    @property
    def models(self) -> tuple[int, ...]:
        return tuple(sorted(int(m) for m in self.controls["models"].value))

    @property
    def layout(self) -> Layout:
        return self._layout.current()

    @property
    def device(self):
        return get_device(self.controls["device"].value)

    @property
    def unit(self) -> str:
        return self.controls["unit"].value

    def _table(self):
        return memory_table(self.models, self.gpus, STAGES, self.layout)

    def _update(self) -> bool:
        if not self.models:
            # Nothing to draw: keep the last figure and say why.
            self.summary.value = "<p><b>Select at least one model size</b> to draw the bars.</p>"
            return False
        self.data = self._table()
        plotting.update_memory_vs_model_size(self.artists, self.data, self.device, self.unit,
                                             self.layout)
        self._describe()
        return True

    def _describe(self):
        unit, device, gpus, layout = self.unit, self.device, self.gpus, self.layout
        data = self.data
        ok = fits(data["params"].to_numpy(), data["gpus"].to_numpy(), data["stage"].to_numpy(),
                  layout, device)
        first_fit = {}
        rows = []
        for params in self.models:
            here = data["params"].to_numpy() == params
            cells = []
            for stage, total, fit in zip(data["stage"][here], data["total"][here], ok[here]):
                mark = "fits" if fit else "too big"
                cells.append(f"<td style='text-align:right'>{_gb(total, unit)} ({mark})</td>")
                if fit and params not in first_fit:
                    first_fit[params] = int(stage)
            verdict = (STRATEGY_NAMES[first_fit[params]] if params in first_fit
                       else "none: add GPUs or pick a smaller layout")
            rows.append(f"<tr><td>{format_count(params)}</td>{''.join(cells)}"
                        f"<td>{html.escape(verdict)}</td></tr>")
        capacity = plotting.device_label(device, unit).split(": ", 1)[1]
        headers = "".join(f"<th>{html.escape(STRATEGY_NAMES[s])}</th>" for s in STAGES)
        self.table.value = (
            f"<table><caption>Per GPU on {gpus} GPU{'s' if gpus != 1 else ''} against the "
            f"{html.escape(device.label)} ({html.escape(capacity)})</caption>"
            f"<thead><tr><th>Model</th>{headers}<th>Least partitioning that fits</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")

        def verdict(params):
            if params not in first_fit:
                return f"{format_count(params)} does not fit, even with ZeRO stage 3"
            stage = first_fit[params]
            if stage == 0:
                return f"{format_count(params)} fits even without ZeRO"
            return f"{format_count(params)} needs ZeRO stage {stage} or higher"

        largest = self.models[-1]
        stage3 = data[(data["params"] == largest) & (data["stage"] == 3)]["total"].iloc[0]
        self.summary.value = (
            f"<p><b>{gpus} GPU{'s' if gpus != 1 else ''}</b>, "
            f"{html.escape(plotting.layout_summary(layout))}; "
            f"{html.escape(plotting.device_label(device, unit))}. "
            f"<br>{html.escape('; '.join(verdict(p) for p in self.models))}. "
            f"<br>{format_count(largest)} under ZeRO stage 3: {_gb(stage3, unit)} per GPU.</p>")
