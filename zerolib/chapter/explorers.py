"""Live explorers for the notebooks: ipywidgets controls that redraw the chapter's figures in place.

Each explorer exposes ``.widget`` (what a notebook displays), ``.controls`` (name -> ipywidgets
control), ``.figure`` (one pyplot-free matplotlib Figure, kept for the explorer's lifetime) and
``.data`` (the tidy DataFrame currently drawn). A control change recomputes ``.data`` with
zerolib, changes the existing artists through :mod:`zerolib.chapter.plotting`'s update functions and
writes freshly rendered PNG bytes into an ``ipywidgets.Image``. No ``display()``, ``interact`` or
``Output`` widget is involved, so the widget state a notebook saves holds the image and strict
nbval passes.
"""
from __future__ import annotations

import html
from dataclasses import replace

import numpy as np
import pandas as pd

from zerolib.chapter import plotting
from zerolib.chapter.figures import DEFAULTS as PUBLISHED
from zerolib.core import working_set
from zerolib.core.accounting import (
    CATEGORIES,
    LAYOUTS,
    STAGES,
    STRATEGY_NAMES,
    Layout,
    get_layout,
    model_state,
)
from zerolib.core.activations import RECOMPUTE
from zerolib.core.devices import DEVICES, capacity_text, get_device
from zerolib.core.feasibility import fits
from zerolib.core.inputs import MAX_GPUS
from zerolib.core.models import MODELS, get_model, parameter_count
from zerolib.core.tables import fewest_gpus_table, memory_table
from zerolib.core.units import UNITS, check_unit, format_count

EXPLORER_DPI = 80   # 640 x 448 pixels for the GPU-count figure: readable, quick to redraw
CUSTOM = "custom"   # the layout dropdown's entry for bytes set with the sliders

# Model sizes a reader can pick (parameters). The chapter's five, plus common sizes around them.
MODEL_SIZES = tuple(int(n) for n in (
    125e6, 350e6, 1e9, 1.3e9, 3e9, 7e9, 8e9, 13e9, 30e9, 34e9, 65e9, 70e9, 175e9, 405e9, 1e12))
CHAPTER_SIZES = PUBLISHED.model_sizes   # the five of the chapter's model-size figure
GPU_RANGE_STEPS = tuple(2**k for k in range(11))  # 1, 2, 4, ..., 1024


def _widgets():
    import ipywidgets
    return ipywidgets


def _in_unit(n_bytes, unit: str) -> str:
    """Bytes as a value label in ``unit``: ``'17.5 GB'``."""
    return f"{plotting.format_value(float(n_bytes) / check_unit(unit))} {unit}"


def _device_and_unit(device: str, unit: str) -> dict:
    """The device dropdown and the unit buttons every explorer has."""
    w = _widgets()
    check_unit(unit)
    return {"device": w.Dropdown(options=[(d.label, d.name) for d in DEVICES.values()],
                                 value=get_device(device).name, description="Device"),
            "unit": w.ToggleButtons(options=list(UNITS), value=unit, description="Unit",
                                    style={"button_width": "60px"})}


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
            for category, width in zip(CATEGORIES, layout.widths())}
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

    def _start(self, figsize, kind: str, blocks, draw):
        """Draw the first figure from ``.data`` (``draw(ax)`` returns the artists), render it,
        write the texts, then watch the controls."""
        self.figure = plotting.new_figure(figsize, self.dpi)
        self.artists = draw(plotting.add_axes(self.figure, kind))
        self._renderer = plotting.IncrementalPng(self.figure, blocks(self.artists))
        self._describe()
        self.image.value = self._png()
        self._watch()

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

    # Current settings every explorer has, read from the controls.
    @property
    def device(self):
        return get_device(self.controls["device"].value)

    @property
    def unit(self) -> str:
        return self.controls["unit"].value


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
            **_device_and_unit(device, unit),
        }
        self.data = self._table()
        self._start(plotting.GPU_COUNT_FIGSIZE, "gpu_count", plotting.text_blocks,
                    lambda ax: plotting.draw_memory_vs_gpu_count(ax, self.data, self.device,
                                                                 self.unit, self.layout))
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
        values = "; ".join(f"{STRATEGY_NAMES[int(row.stage)]}: {_in_unit(row.total, unit)}"
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
                cell, per_gpu = "never", f"at least {_in_unit(floor, unit)} at any GPU count"
            else:
                n = int(row.fewest_gpus)
                cell = str(n)
                per_gpu = _in_unit(model_state(self.params, n, stage, self.layout).total, unit)
            rows.append(f"<tr><td>{html.escape(STRATEGY_NAMES[stage])}</td>"
                        f"<td style='text-align:right'>{cell}</td><td style='text-align:right'>"
                        f"{html.escape(per_gpu)}</td></tr>")
        return (
            f"<table><caption>Fewest GPUs at which each strategy fits the {html.escape(device.label)} "
            f"({html.escape(capacity_text(device, unit))}), "
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
        self._layout = _LayoutControls(layout, self.redraw)
        self.controls = {
            "gpus": w.IntSlider(value=gpus, min=1, max=1024, description="GPUs",
                                continuous_update=True),
            "models": w.SelectMultiple(options=[(format_count(p), p) for p in MODEL_SIZES],
                                       value=models, rows=6, description="Models"),
            **self._layout.controls,
            **_device_and_unit(device, unit),
        }
        self.data = self._table()
        self._start(plotting.MODEL_SIZE_FIGSIZE, "model_size", plotting.text_blocks,
                    lambda ax: plotting.draw_memory_vs_model_size(ax, self.data, self.device,
                                                                  self.unit, self.layout))
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
                cells.append(f"<td style='text-align:right'>{_in_unit(total, unit)} ({mark})</td>")
                if fit and params not in first_fit:
                    first_fit[params] = int(stage)
            verdict = (STRATEGY_NAMES[first_fit[params]] if params in first_fit
                       else "none: add GPUs or pick a smaller layout")
            rows.append(f"<tr><td>{format_count(params)}</td>{''.join(cells)}"
                        f"<td>{html.escape(verdict)}</td></tr>")
        capacity = capacity_text(device, unit)
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
            f"<br>{format_count(largest)} under ZeRO stage 3: {_in_unit(stage3, unit)} per GPU.</p>")


# The will-it-fit explorer's ranges.
SEQ_LENGTHS = tuple(2**k for k in range(7, 18))   # 128 to 131,072 tokens
MAX_MICRO_BATCH = 64   # also the bound of the largest-micro-batch search ("64 or more")
MAX_EXPLORER_GPUS = 1024


def _count_words(count: int) -> str:
    """Parameters to three significant digits: '6.74B', '124M'."""
    if count >= 10**9:
        return f"{plotting.format_value(count / 10**9)}B"
    return f"{plotting.format_value(count / 10**6)}M"


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class WillItFitExplorer(_Explorer):
    """Will a model train on these GPUs? Its peak per GPU, stage by stage, against the device.

    Controls: ``model`` (a preset of :mod:`zerolib.core.models`), ``gpus`` (1 to 1024),
    ``micro_batch`` (1 to 64), ``seq_len`` (powers of two, 128 to 131,072 tokens), ``recompute``
    (none, selective, full), ``flash_attention``, ``device``, ``unit``. ``.data`` is
    :func:`zerolib.core.working_set.peak_frame` (bytes per stage and component). The table gives, per
    stage, the peak, whether it fits, the fewest GPUs at which it fits (at this micro-batch) and
    the largest micro-batch that fits (on these GPUs), all from :mod:`zerolib.core.working_set`.
    """

    def __init__(self, model: str = "llama-2-7b", gpus: int = 8, micro_batch: int = 1,
                 seq_len: int = 4096, recompute: str = "selective", flash_attention: bool = True,
                 device: str = "h100-80gb", unit: str = "GB", layout: "str | Layout" = "mixed-adam",
                 dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = _widgets()
        if not isinstance(model, str) or get_model(model).name not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
        for name, value, high in (("gpus", gpus, MAX_EXPLORER_GPUS),
                                  ("micro_batch", micro_batch, MAX_MICRO_BATCH)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ValueError(f"{name} must be a whole number from 1 to {high}, got {value!r}")
        if seq_len not in SEQ_LENGTHS:
            raise ValueError(f"seq_len must be one of {', '.join(map(str, SEQ_LENGTHS))}, "
                             f"got {seq_len!r}")
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        if not isinstance(flash_attention, bool):
            raise TypeError(f"flash_attention must be True or False, got {flash_attention!r}")
        self._layout_fixed = get_layout(layout)
        self._fewest = (None, None)     # (settings key, fewest GPUs per stage)
        self._largest = (None, None)    # (settings key, largest micro-batch per stage)
        wide = {"description_width": "initial"}
        self.controls = {
            "model": w.Dropdown(options=[(f"{name} ({_count_words(parameter_count(config))})", name)
                                         for name, config in MODELS.items()],
                                value=get_model(model).name, description="Model"),
            "gpus": w.IntSlider(value=gpus, min=1, max=MAX_EXPLORER_GPUS, description="GPUs",
                                continuous_update=True),
            "micro_batch": w.IntSlider(value=micro_batch, min=1, max=MAX_MICRO_BATCH,
                                       description="Micro-batch", style=wide,
                                       continuous_update=True),
            "seq_len": w.SelectionSlider(options=[(f"{n:,}", n) for n in SEQ_LENGTHS],
                                         value=seq_len, description="Sequence", style=wide,
                                         continuous_update=True),
            "recompute": w.ToggleButtons(options=list(RECOMPUTE), value=recompute,
                                         description="Recompute", style={"button_width": "80px"}),
            "flash_attention": w.Checkbox(value=flash_attention, description="Flash attention",
                                          indent=False),
            **_device_and_unit(device, unit),
        }
        self.data = self._frame()
        self._start(plotting.WILL_IT_FIT_FIGSIZE, "will_it_fit", plotting.will_it_fit_blocks,
                    lambda ax: plotting.draw_will_it_fit(ax, self.data, self.device, self.unit,
                                                         self.settings, self.layout))
        c = self.controls
        self.widget = self._box([
            w.HBox([c["model"], c["device"], c["unit"]]),
            w.HBox([c["gpus"], c["micro_batch"], c["seq_len"]]),
            w.HBox([c["recompute"], c["flash_attention"]]),
        ])

    # Current settings, read from the controls.
    @property
    def model(self) -> str:
        return self.controls["model"].value

    @property
    def gpus(self) -> int:
        return int(self.controls["gpus"].value)

    @property
    def settings(self) -> working_set.WorkingSetSettings:
        c = self.controls
        return working_set.WorkingSetSettings(
            seq_len=int(c["seq_len"].value), micro_batch=int(c["micro_batch"].value),
            recompute=c["recompute"].value, flash_attention=bool(c["flash_attention"].value))

    @property
    def layout(self) -> Layout:
        return self._layout_fixed

    def _frame(self):
        return working_set.peak_frame(self.model, self.gpus, STAGES, self.settings, self.layout)

    def _update(self) -> bool:
        try:
            data = self._frame()
        except ValueError as error:
            # A setting this model cannot take (GPT-2's learned positions end at 1,024 tokens):
            # keep the last figure and say why.
            self.summary.value = f"<p><b>Not drawn:</b> {html.escape(str(error))}.</p>"
            self.table.value = ""
            return False
        self.data = data
        plotting.update_will_it_fit(self.artists, self.data, self.device, self.unit,
                                    self.settings, self.layout)
        self._describe()
        return True

    def _searches(self, settings, device):
        """Fewest GPUs and largest micro-batch per stage, each recomputed only when its inputs change."""
        fewest_key = (self.model, settings, device.name)        # the GPU count does not enter
        if fewest_key != self._fewest[0]:
            found = working_set.fewest_gpus(self.model, STAGES, settings, self.layout, device)
            self._fewest = (fewest_key, {stage: int(n) or None for stage, n in zip(STAGES, found)})
        largest_key = (self.model, self.gpus, replace(settings, micro_batch=1), device.name)
        if largest_key != self._largest[0]:
            self._largest = (largest_key, {
                stage: working_set.largest_micro_batch(self.model, self.gpus, stage, settings,
                                                       self.layout, device,
                                                       max_micro_batch=MAX_MICRO_BATCH)
                for stage in STAGES})
        return self._fewest[1], self._largest[1]

    def _describe(self):
        unit, device, gpus, settings = self.unit, self.device, self.gpus, self.settings
        config = get_model(self.model)
        rows = working_set.stage_rows(config, gpus, STAGES, settings, self.layout, device)
        fewest, largest = self._searches(settings, device)
        on = f"{gpus} GPU{'s' if gpus != 1 else ''}"
        _, conditions = plotting.will_it_fit_titles(config.name, gpus, settings, self.layout)
        fitting = [STRATEGY_NAMES[row["stage"]] for row in rows if row["fits"]]
        too_big = [STRATEGY_NAMES[row["stage"]] for row in rows if not row["fits"]]
        if not too_big:
            verdict = "Fits under every strategy, even plain data parallelism."
        elif not fitting:
            smallest = min(rows, key=lambda row: row["peak"])
            verdict = (f"Fits under no strategy: the smallest peak is "
                       f"{_in_unit(smallest['peak'], unit)} ({STRATEGY_NAMES[smallest['stage']]}). "
                       "Add GPUs, shorten the sequence, lower the micro-batch or recompute more.")
        else:
            verdict = f"Fits under {_and(fitting)}. Too big under {_and(too_big)}."
        terms = rows[0]["working_set"]     # activations and logits are the same at every stage
        self.summary.value = (
            f"<p><b>{html.escape(config.name)}</b> ({parameter_count(config):,} parameters) "
            f"on <b>{on}</b>: {html.escape(conditions)}."
            f"<br>{html.escape(verdict)}"
            f"<br>Every strategy also holds the activations ({_in_unit(terms['activations'], unit)}) "
            f"and the logits and loss ({_in_unit(terms['logits_loss'], unit)}) of one micro-batch per "
            "GPU; both grow with micro-batch × sequence length."
            f"<br>Reference line: {html.escape(plotting.device_label(device, unit))}.</p>")

        def right(text):
            return f"<td style='text-align:right'>{text}</td>"
        cells = []
        for row in rows:
            stage = row["stage"]
            most = largest[stage]
            if most == 0:
                most = "none"
            elif most == MAX_MICRO_BATCH:
                most = f"{most} or more"       # the search stops at the slider's end
            cells.append(
                f"<tr><td>{html.escape(STRATEGY_NAMES[stage])}</td>{right(_in_unit(row['peak'], unit))}"
                f"<td>{'fits' if row['fits'] else 'too big'}</td>"
                f"{right('never' if fewest[stage] is None else fewest[stage])}"
                f"{right(most)}</tr>")
        capacity = capacity_text(device, unit)
        self.table.value = (
            f"<table><caption>Per GPU on {on} against the {html.escape(device.label)} "
            f"({html.escape(capacity)}), {html.escape(config.name)}</caption>"
            "<thead><tr><th>Strategy</th><th>Peak per GPU</th><th>Fits?</th>"
            f"<th>Fewest GPUs that fit (micro-batch {settings.micro_batch})</th>"
            f"<th>Largest micro-batch that fits ({on})</th></tr></thead>"
            f"<tbody>{''.join(cells)}</tbody></table>")
