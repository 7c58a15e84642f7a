"""What every explorer shares: the image and text widgets, the device and unit controls, the
layout controls, observing controls and redrawing in place.

An explorer exposes ``.widget`` (what a notebook displays), ``.controls`` (name -> ipywidgets
control), ``.figure`` (one pyplot-free matplotlib Figure, kept for the explorer's lifetime) and
``.data`` (the tidy DataFrame currently drawn). A control change recomputes ``.data`` with
zerolib once, changes the existing artists through the chart's update function and writes
freshly rendered PNG bytes into an ``ipywidgets.Image``. No ``display()``, ``interact`` or
``Output`` widget is involved, so the widget state a notebook saves holds the image and strict
nbval passes.

A control value that cannot be drawn (a width typed off the slider's steps, a setting the model
cannot take, a value set from Python such as ``None`` or NaN) never fails silently: every
observer reports through the ``status`` line above the image what happened and that the figure
still shows the last setting that could be drawn, and the explorer keeps working for the next
change.
"""
from __future__ import annotations

import html
import math
from contextlib import contextmanager

from zerolib.chapter.explorers.panel import (
    EXPLORER_CLASS,
    TABLE_CSS,
    control_panel,
    shown_at_own_size,
)
from zerolib.chapter.fast_png import IncrementalPng, every_text
from zerolib.chapter.style import add_axes, new_figure
from zerolib.core.catalogue.devices import CAPACITY_BASES, DEVICES, device_at, get_device
from zerolib.core.memory.accounting import CATEGORIES, LAYOUTS, Layout, get_layout
from zerolib.core.units import UNITS, check_unit, format_value

EXPLORER_DPI = 80   # 640 x 448 pixels for the GPU-count figure: readable, quick to redraw
CUSTOM = "custom"   # the layout dropdown's entry for bytes set with the sliders
WIDTH_STEP = 0.5    # bytes per parameter between two positions of a layout slider
CAPACITY_WORDS = {"nominal": "nominal GiB", "decimal": "decimal GB", "reported": "nvidia-smi"}
# What a control value that cannot be drawn raises on its way through zerolib and the observers.
NOT_DRAWABLE = (ArithmeticError, LookupError, TypeError, ValueError)
# In a static copy (nbviewer, an HTML export) the saved widgets show but nothing answers them.
STATIC_NOTE = ("<p style='font-size:smaller;color:#555'>The controls redraw the figure only while a "
               "Python kernel runs this notebook. In a static copy (nbviewer, an HTML export) they "
               "show the state the notebook was saved in and move nothing: run the notebook to use "
               "them.</p>")


def widgets():
    """The ipywidgets module, imported on first use (the charts and tables do not need it)."""
    import ipywidgets
    return ipywidgets


def in_unit(n_bytes, unit: str) -> str:
    """Bytes as a value label in ``unit``: ``'17.5 GB'``."""
    return unit_label(unit)(n_bytes)


def unit_label(unit: str):
    """:func:`in_unit` with ``unit`` checked once: the labeller of a table of many values."""
    per = check_unit(unit)
    return lambda n_bytes: f"{format_value(float(n_bytes) / per)} {unit}"


def device_and_unit(device: str, unit: str, capacity: str = "nominal") -> dict:
    """The device dropdown, the reading of its capacity and the unit buttons every explorer has.

    ``capacity`` says which reading of the device's "80GB" a fit is judged against
    (:data:`zerolib.core.catalogue.devices.CAPACITY_BASES`): the vendor's GiB, the same figure in decimal
    GB, or what nvidia-smi reports.
    """
    w = widgets()
    check_unit(unit)
    if capacity not in CAPACITY_BASES:
        raise ValueError(f"capacity must be one of {', '.join(CAPACITY_BASES)}, got {capacity!r}")
    return {"device": w.Dropdown(options=[(d.label, d.name) for d in DEVICES.values()],
                                 value=get_device(device).name, description="Device"),
            "capacity": w.ToggleButtons(options=[(CAPACITY_WORDS[b], b) for b in CAPACITY_BASES],
                                        value=capacity, description="Capacity",
                                        style={"button_width": "110px"}),
            "unit": w.ToggleButtons(options=list(UNITS), value=unit, description="Unit",
                                    style={"button_width": "60px"})}


def whole_bits(width: float) -> float:
    """A width typed into a slider's readout, rounded to the nearest whole bit (1/8 byte)."""
    return round(float(width) * 8) / 8


class LayoutControls:
    """A layout dropdown and three bytes-per-parameter sliders kept in step with each other.

    Picking a preset sets the sliders to its widths; moving a slider away from the preset's
    widths switches the dropdown to "custom". A value typed into a slider's readout off the
    slider's steps (ipywidgets clamps typed values but does not round them) is rounded to the
    nearest whole bit, which every layout accepts. ``guard`` wraps each observer (the
    explorer's :meth:`Explorer.reporting`, so that a value it cannot take is reported).
    """

    def __init__(self, layout: str | Layout, on_change, guard=lambda observer: observer):
        w = widgets()
        layout = get_layout(layout)
        options = [(f"{name} ({get_layout(name).total:g} bytes/param)", name) for name in LAYOUTS]
        options.append(("custom (bytes per category below)", CUSTOM))
        self.layout = w.Dropdown(options=options,
                                 value=layout.name if layout.name in LAYOUTS else CUSTOM,
                                 description="Layout", style={"description_width": "initial"})
        self.sliders = {
            category: w.FloatSlider(value=width, min=0, max=32, step=WIDTH_STEP,
                                    readout_format=".1f",
                                    description=category.capitalize(),
                                    tooltip=f"{category}: bytes per parameter")
            for category, width in zip(CATEGORIES, layout.widths())}
        self._on_change = on_change
        self._syncing = False
        self.layout.observe(guard(self._preset_changed), names="value")
        for slider in self.sliders.values():
            slider.observe(guard(self._slider_changed), names="value")

    @property
    def controls(self) -> dict:
        return {"layout": self.layout,
                **{f"{category}_bytes": slider for category, slider in self.sliders.items()}}

    def _preset(self, value) -> str:
        if value != CUSTOM and value not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join([*LAYOUTS, CUSTOM])}, got {value!r}")
        return value

    def _widths(self) -> tuple[float, ...]:
        """The sliders' widths in whole bits; a value set from Python must be a number."""
        widths = []
        for category, slider in self.sliders.items():
            value = slider.value
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{category} bytes/param must be a number from {slider.min:g} "
                                 f"to {slider.max:g}, got {value!r}")
            widths.append(whole_bits(value))
        return tuple(widths)

    def current(self) -> Layout:
        if self._preset(self.layout.value) != CUSTOM:
            return LAYOUTS[self.layout.value]
        return Layout.custom(*self._widths())

    @contextmanager
    def _sync(self):
        self._syncing = True
        try:
            yield
        finally:
            self._syncing = False

    def _preset_changed(self, change):
        if self._syncing:
            return
        if self._preset(change["new"]) != CUSTOM:
            with self._sync():
                for slider, width in zip(self.sliders.values(), LAYOUTS[change["new"]].widths()):
                    slider.value = width
        self._on_change()

    def _slider_changed(self, _change):
        if self._syncing:
            return
        widths = self._widths()
        if self._preset(self.layout.value) != CUSTOM and LAYOUTS[self.layout.value].widths() != widths:
            with self._sync():
                self.layout.value = CUSTOM
        self._on_change()


class Explorer:
    """Shared machinery: the image, the text widgets, observing the controls, redrawing.

    A subclass sets ``controls`` and ``data``, calls :meth:`_start`, declares its control panel
    as ``PANEL`` (titled sections of control names, laid out by
    :func:`zerolib.chapter.explorers.panel.control_panel`), and implements
    ``_update()`` (recompute ``.data``, update the artists, write the texts; return False when
    there is nothing to draw) and ``_describe()`` (write the texts for the current ``.data``).
    """

    LAYOUT_CONTROLS = ("layout", "parameters_bytes", "gradients_bytes", "optimizer_bytes")

    def __init__(self, dpi: float):
        w = widgets()
        self.dpi = dpi
        self.image = w.Image(format="png")
        self.status = w.HTML()
        self.summary = w.HTML()
        self.table = w.HTML()
        self.redraws = 0
        self._holding = False

    def reporting(self, observer):
        """``observer`` wrapped so that a value it cannot take is reported in ``status``."""
        def reported(change):
            try:
                observer(change)
            except NOT_DRAWABLE as error:
                self._not_redrawn(error)
        return reported

    def _not_redrawn(self, error):
        self.status.value = (f"<p style='color:#b00'><b>Not redrawn:</b> "
                             f"{html.escape(' '.join(str(error).split()))}. The figure and "
                             "table still show the last setting that could be drawn.</p>")

    def _watch(self):
        for name, control in self.controls.items():
            if name not in self.LAYOUT_CONTROLS:
                control.observe(lambda _change: self.redraw(), names="value")

    def _start(self, figsize, margins, blocks, draw):
        """Draw the first figure from ``.data`` (``draw(ax)`` returns the artists), render it,
        write the texts, then watch the controls."""
        self.figure = new_figure(figsize, self.dpi)
        self.artists = draw(add_axes(self.figure, margins))
        shown_at_own_size(self.image, self.figure)
        # Every text may re-use its pixels, not only the chart's slow-changing blocks: a data
        # label that did not move draws as before (the renderer checks calls and background).
        self._renderer = IncrementalPng(self.figure, [*blocks(self.artists),
                                                      *every_text(self.figure)])
        self._describe()
        self.image.value = self._renderer.render()
        self._watch()

    @contextmanager
    def hold(self):
        """Change several controls with one redraw at the end (not one per control)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self.redraw()

    def redraw(self):
        """Recompute ``.data`` from the controls and redraw the same figure in place.

        A setting that cannot be drawn leaves the last figure and says so in ``status``.
        The texts are worked out before the image (a setting they cannot describe is not
        drawn either) but sent after it: each widget change is one message to the browser,
        handled in order, and the figure is what a reader waits for.
        """
        if self._holding:
            return
        with self.summary.hold_sync(), self.table.hold_sync():
            try:
                drawn = self._update()
            except NOT_DRAWABLE as error:
                self._not_redrawn(error)
                return
            if drawn:
                self.image.value = self._renderer.render()
                self.status.value = ""
                self.redraws += 1

    def _box(self):
        """The explorer's one layout: the static note, the control panel, the texts, the
        figure and the tables."""
        w = widgets()
        box = w.VBox([w.HTML(STATIC_NOTE), w.HTML(TABLE_CSS),
                      control_panel(self.controls, self.PANEL),
                      self.status, self.summary, self.image, self.table])
        box.add_class(EXPLORER_CLASS)
        return box

    # Current settings every explorer has, read from the controls.
    @property
    def device(self):
        """The chosen device, its capacity read as the capacity control says."""
        return device_at(self.controls["device"].value, self.controls["capacity"].value)

    @property
    def unit(self) -> str:
        return self.controls["unit"].value
