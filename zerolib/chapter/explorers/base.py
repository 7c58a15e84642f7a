"""What every explorer shares: the image and text widgets, the device and unit controls, the
layout controls, observing controls and redrawing in place.

An explorer exposes ``.widget`` (what a notebook displays), ``.controls`` (name -> ipywidgets
control), ``.figure`` (one pyplot-free matplotlib Figure, kept for the explorer's lifetime) and
``.data`` (the tidy DataFrame currently drawn). A control change recomputes ``.data`` with
zerolib once, changes the existing artists through the chart's update function and writes
freshly rendered PNG bytes into an ``ipywidgets.Image``. No ``display()``, ``interact`` or
``Output`` widget is involved, so the widget state a notebook saves holds the image and strict
nbval passes.

Every image is kept under the values of all the controls (the figure's artists are a function
of them), so a setting shown before, or worked out ahead, costs the recompute and the texts but
no draw. Worked out ahead, while the kernel is idle, one setting per callback on the kernel's
running event loop, with stand-ins for the controls and the texts (no widget message is sent
and what the reader sees does not change): after the first draw, the next value either way of
every slider, so that a reader's first move finds its setting drawn; after a control moved by
the reader in the browser (not a change set from Python), the next value either way of that
control, the direction of travel first. Where no loop runs (a script, a test), nothing is
worked out ahead; a notebook executed in a kernel does the first of these between its cells.

A control value that cannot be drawn (a width typed off the slider's steps, a setting the model
cannot take, a value set from Python such as ``None`` or NaN) never fails silently: every
observer reports through the ``status`` line above the image what happened and that the figure
still shows the last setting that could be drawn, and the explorer keeps working for the next
change.
"""
from __future__ import annotations

import asyncio
import functools
import html
import math
from contextlib import contextmanager

from zerolib.chapter.explorers.panel import (
    EXPLORER_CLASS,
    LIVE_NOTE,
    NOTE_CLASS,
    PLAIN_TEXT,
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


PREFETCH_DELAY = 0.02   # seconds after a move before working out its neighbours
FIRST_LOOK_DELAY = 0.5  # seconds after the first draw before working out every slider's


def widgets():
    """The ipywidgets module, imported on first use (the charts and tables do not need it)."""
    import ipywidgets
    return ipywidgets


@functools.cache
def explorer_box_class():
    """A VBox whose plain-text form (what shows where widgets do not render) is a sentence,
    :data:`PLAIN_TEXT`, not the repr of its widget tree (made on first use: ipywidgets is
    imported then)."""
    class ExplorerBox(widgets().VBox):
        def __repr__(self):
            return PLAIN_TEXT
    return ExplorerBox


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


class _StandIn:
    """A widget's value held apart from the widget: read and set like the widget (its other
    attributes read from it), but setting it sends nothing and leaves the widget as it is."""

    def __init__(self, widget, value):
        vars(self).update(_widget=widget, value=value)

    def __getattr__(self, name):
        return getattr(self._widget, name)

    def __setattr__(self, name, value):
        vars(self)[name] = value


def _text_stand_ins(attributes: dict) -> dict:
    """Stand-ins for an explorer's text widgets, from its attributes."""
    return {n: _StandIn(attributes[n], attributes[n].value) for n in ("status", "summary", "table")}


def neighbours(control, old, new) -> list:
    """The next value either way of a slider moved from ``old`` to ``new``, the direction of
    travel first; none for other controls (a reader picks any entry of a menu)."""
    w = widgets()
    if isinstance(control, w.SelectionSlider):
        options = [o[1] if isinstance(o, tuple) else o for o in control.options]
        if new not in options:
            return []
        at = options.index(new)
        ahead = 1 if old not in options or options.index(old) < at else -1
        return [options[i] for i in (at + ahead, at - ahead) if 0 <= i < len(options)]
    if isinstance(control, w.IntSlider):
        ahead = control.step if old is None or old < new else -control.step
        return [v for v in (new + ahead, new - ahead) if control.min <= v <= control.max]
    return []


def from_the_browser(control) -> bool:
    """Whether ``control``'s change now comes from the browser: ipywidgets holds the synced
    values under a lock while it applies a frontend's update (``Widget.set_state``)."""
    return bool(getattr(control, "_property_lock", None))


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
        self.prefetched = 0     # settings drawn ahead of the reader
        self._holding = False
        self._ahead: list = []  # steps still to work out ahead, one per idle callback
        self._ahead_handle = None

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
                control.observe(lambda change, name=name: self._moved(name, change), names="value")

    def _moved(self, name, change):
        """A control's observer: redraw, then, for a move the reader made in the browser, work
        out the neighbouring values of that control while the kernel is idle."""
        self.redraw()
        if from_the_browser(change["owner"]):
            self._look_ahead([(name, value) for value in
                              neighbours(change["owner"], change["old"], change["new"])])

    def _look_ahead_at_start(self):
        """Every slider's neighbours after the first draw: each slider's next value first, then
        the ones before."""
        sides = [[(name, value) for value in neighbours(control, None, control.value)]
                 for name, control in self.controls.items() if name not in self.LAYOUT_CONTROLS]
        self._look_ahead([pair for side in (0, 1) for pair in
                          (pairs[side] for pairs in sides if len(pairs) > side)],
                         FIRST_LOOK_DELAY)

    def _look_ahead(self, settings: list, delay: float = PREFETCH_DELAY):
        """Work out ``settings`` ((control, value) pairs, in order) while the kernel is idle,
        in place of what was still to be worked out."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return        # no event loop (a script, a test): nothing is worked out ahead
        self._ahead = [step for name, value in settings for step in self._steps_ahead(name, value)]
        if self._ahead_handle is None:
            self._ahead_handle = loop.call_later(delay, self._prefetch_next)

    def _steps_ahead(self, name, value) -> list:
        """What working out ``name`` at ``value`` ahead takes, one callback each: drawing it
        (an explorer may put slow pure work in a callback of its own before)."""
        return [lambda: self.prefetch(name, value)]

    def _prefetch_next(self):
        """One step per callback, so the kernel answers the reader in between."""
        self._ahead_handle = None
        while self._ahead:
            if self._ahead.pop(0)():
                break
        if self._ahead:
            self._ahead_handle = asyncio.get_running_loop().call_later(0, self._prefetch_next)

    def _key(self, controls=None) -> tuple:
        """Every control's value: what the figure's artists are a function of."""
        return tuple((name, control.value)
                     for name, control in (self.controls if controls is None else controls).items())

    def _followers(self, name, value) -> dict:
        """The controls that follow ``name`` set to ``value`` (their observers set them), with
        their values then: none unless an explorer says so."""
        return {}

    @contextmanager
    def _at(self, values: dict):
        """The explorer with stand-ins for its controls (``values`` for some) and its texts,
        its attributes as they were afterwards."""
        saved = dict(vars(self))
        try:
            vars(self).update(controls={n: _StandIn(c, values.get(n, c.value))
                                        for n, c in self.controls.items()},
                              **_text_stand_ins(saved))
            yield
        finally:
            vars(self).clear()
            vars(self).update(saved)

    def prefetch(self, name, value) -> bool:
        """Draw and keep the image the explorer would show with control ``name`` at ``value``
        (the others as they are), without a widget message and leaving what the reader sees
        as it is; True when it drew (False: kept already, or a setting it cannot draw)."""
        if name in self.LAYOUT_CONTROLS:
            return False    # read through LayoutControls' own widgets, which a stand-in cannot replace
        if self._renderer.kept(self._key()) is None:
            return False    # the figure does not show the controls (their setting was not drawn)
        values = {name: value, **self._followers(name, value)}
        stand_ins = {n: _StandIn(c, values.get(n, c.value)) for n, c in self.controls.items()}
        if self._renderer.kept(self._key(stand_ins)) is not None:
            return False
        try:
            with self._at(values):
                try:
                    drawn = self._update()
                except NOT_DRAWABLE:
                    drawn = False
                if drawn:
                    self._renderer.render(self._key())
        finally:
            with self._at({}):
                self._update()   # the figure back to the reader's setting
        if drawn:
            self.prefetched += 1
        return drawn

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
        self.image.value = self._renderer.render(self._key())
        self._watch()
        self._look_ahead_at_start()

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
                self.image.value = self._renderer.render(self._key())
                self.status.value = ""
                self.redraws += 1

    def _box(self):
        """The explorer's one layout: the note (live; its saved state says saved), the control
        panel, the texts, the figure and the tables."""
        w = widgets()
        note = w.HTML(LIVE_NOTE)
        note.add_class(NOTE_CLASS)
        box = explorer_box_class()([note, w.HTML(TABLE_CSS),
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
