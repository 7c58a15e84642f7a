"""The chapter's look, shared by every figure: colours, matplotlib settings, text helpers,
pyplot-free figures and their byte-stable PNG and SVG rendering.

No pyplot: figures are :class:`matplotlib.figure.Figure` objects with an Agg canvas, so nothing
here touches global state (styles apply through ``rc_context``). Bytes inside, units at the
edge: tables hold bytes; values become GB (10^9) or GiB (2^30) only in the charts, and every
label names its unit.
"""
from __future__ import annotations

import io
from collections.abc import Mapping
from types import MappingProxyType

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.transforms import offset_copy

from zerolib.core.catalogue.devices import Device, capacity_text, get_device
from zerolib.core.memory.accounting import Layout, get_layout

# Okabe & Ito, "Color Universal Design" (2008): eight colours that stay distinguishable under
# the common colour-vision deficiencies. One colour per strategy, the same in every figure.
OKABE_ITO: Mapping[str, str] = MappingProxyType({
    "black": "#000000", "orange": "#E69F00", "sky blue": "#56B4E9", "bluish green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish purple": "#CC79A7",
})
STRATEGY_COLORS: Mapping[int, str] = MappingProxyType({
    0: OKABE_ITO["reddish purple"],   # plain data parallelism
    1: OKABE_ITO["orange"],
    2: OKABE_ITO["sky blue"],
    3: OKABE_ITO["blue"],
})
# A second cue besides colour (lines: marker; bars: the legend order and position in a group).
STRATEGY_MARKERS: Mapping[int, str] = MappingProxyType({0: "o", 1: "s", 2: "^", 3: "D"})
DEVICE_COLOR = OKABE_ITO["vermillion"]

# matplotlib settings for drawing and saving, applied with rc_context (never globally).
STYLE: Mapping[str, object] = MappingProxyType({
    "font.family": "DejaVu Sans",      # bundled with matplotlib: the same glyphs everywhere
    "font.size": 11,
    # Unhinted glyphs: a quarter faster to draw (the explorers redraw on every slider move) and,
    # as matplotlib's own image tests use, less dependent on the FreeType build.
    "text.hinting": "no_hinting",
    "axes.titlesize": 13,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "y",              # horizontal lines to read values off; no vertical ones
    "axes.axisbelow": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.8,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "svg.hashsalt": "zerolib-figures",  # fixed SVG ids (matplotlib otherwise draws random ones)
    "svg.fonttype": "path",             # text as outlines: no dependence on the reader's fonts
})
PNG_METADATA = MappingProxyType({"Software": None})            # no version string in the file
SVG_METADATA = MappingProxyType({"Date": None, "Creator": None})  # no date, no version


def style():
    """A context manager applying :data:`STYLE` (draw and save inside it)."""
    return matplotlib.rc_context(dict(STYLE))


def device_label(device: str | Device, unit: str = "GB") -> str:
    """``'A100 80GB capacity: 80 GiB = 85.9 GB'`` (the capacity in the figure's unit, named)."""
    return f"{get_device(device).label} capacity: {capacity_text(device, unit)}"


def layout_summary(layout: str | Layout) -> str:
    """``'Mixed-precision Adam (ZeRO paper, K = 12): 2 + 2 + 12 = 16 bytes per parameter'``."""
    layout = get_layout(layout)
    name = layout.description or f"{layout.name} layout"
    p, g, o = layout.widths()
    return f"{name}: {p:g} + {g:g} + {o:g} = {layout.total:g} bytes per parameter"


def plain_number(value, _position=None) -> str:
    """Axis ticks without scientific notation: 0.1, 1, 10, 1,000."""
    return f"{value:,.10g}"


def new_figure(figsize, dpi: float = 100) -> Figure:
    """A pyplot-free Figure with an Agg canvas (nothing registered with pyplot)."""
    figure = Figure(figsize=figsize, dpi=dpi, facecolor="white")
    FigureCanvasAgg(figure)
    return figure


def add_axes(figure: Figure, margins: tuple[float, float, float, float]):
    """Axes leaving fixed ``margins`` (left, right, bottom, top, in inches) around them, so every
    rendering of a figure puts its axes at the same pixels."""
    left, right, bottom, top = margins
    width, height = figure.get_size_inches()
    with style():
        return figure.add_axes((left / width, bottom / height,
                                1 - (left + right) / width, 1 - (bottom + top) / height))


def render_png(figure: Figure, dpi: float | None = None) -> bytes:
    """PNG bytes, identical on every call in one environment (no software/version metadata)."""
    buffer = io.BytesIO()
    with style():
        figure.savefig(buffer, format="png", dpi=figure.dpi if dpi is None else dpi,
                       metadata=dict(PNG_METADATA))
    return buffer.getvalue()


def render_svg(figure: Figure) -> bytes:
    """SVG bytes with fixed ids and no date or version."""
    buffer = io.BytesIO()
    with style():
        figure.savefig(buffer, format="svg", metadata=dict(SVG_METADATA))
    return buffer.getvalue()


def fix_axis_labels(ax):
    """Axis labels at fixed offsets from the axes."""
    # Fixed places for the axis labels (in points from the axes): matplotlib would otherwise
    # measure every tick label on every draw to place them. The left margin leaves room for
    # tick labels up to "16,000" (10-point text).
    ax.xaxis.set_label_coords(0.5, 0, transform=offset_copy(ax.transAxes, ax.figure, y=-22,
                                                            units="points"))
    ax.xaxis.label.set_verticalalignment("top")
    ax.yaxis.set_label_coords(0, 0.5, transform=offset_copy(ax.transAxes, ax.figure, x=-50,
                                                            units="points"))
    ax.yaxis.label.set_verticalalignment("bottom")


def gpus_text(count: int, noun: str = "GPU") -> str:
    """``'1 GPU'``, ``'2 GPUs'``, ``'1,024 GPUs'``: a count with its noun, singular only for one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def a_or_an(word: str) -> str:
    """``word`` after its indefinite article as it is read aloud: "an 8B", "an 11B", "an 18B",
    "an 800M", "a 1.8T", "a 7B", "a 110B" (eight, eleven and eighteen begin with a vowel)."""
    whole = word.split(".")[0].replace(",", "")
    digits = whole[:len(whole) - len(whole.lstrip("0123456789"))]
    if not digits:
        return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"
    group = digits[:len(digits) % 3 or 3]       # read first: "11" of 11,000, "110" of 110
    return f"{'an' if group[0] == '8' or group in ('11', '18') else 'a'} {word}"


def make_titles(ax, title: str, subtitle: str):
    """A bold title above a one-line subtitle, left-aligned over the axes."""
    # The subtitle sits just above the axes; the title is padded to sit above the subtitle.
    # An explicit y turns off matplotlib's title auto-positioning (a costly bbox search per draw).
    title_text = ax.set_title(title, loc="left", y=1.0, pad=28, fontweight="bold", fontsize=12.5)
    subtitle_text = ax.text(0, 1.0, subtitle, transform=offset_copy(ax.transAxes, ax.figure, y=7,
                                                                     units="points"),
                            ha="left", va="bottom", fontsize=10, color="#333333")
    return title_text, subtitle_text


def legend_below(ax, handles, ncol: int):
    """The legend under the axes and their x-axis label."""
    # Below the axes, clear of the data whatever the curves do; placed in points under the
    # x-axis label so it does not depend on the axes height.
    below = offset_copy(ax.transAxes, ax.figure, y=-44, units="points")
    return ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                     bbox_transform=below, ncol=ncol, frameon=False, handlelength=2.6,
                     columnspacing=1.8)


def show_device_and_titles(artists, device: Device, unit: str, capacity: float,
                            titles: tuple[str, str]):
    """What every figure updates alike: the capacity line and its legend entry, the titles."""
    label = device_label(device, unit)
    artists.device_line.set_ydata([capacity, capacity])
    artists.device_line.set_label(label)
    artists.device_legend_text.set_text(label)
    artists.title.set_text(titles[0])
    artists.subtitle.set_text(titles[1])


# A white backing for a value label a reference line crosses (only those: each costs a patch).
LABEL_BACKING = MappingProxyType({"facecolor": "white", "edgecolor": "none", "alpha": 0.85,
                                  "pad": 0.6})


def ink(colour: str) -> str:
    """Black or white, whichever has the higher WCAG contrast ratio on ``colour``."""
    channels = np.array(matplotlib.colors.to_rgb(colour))
    linear = np.where(channels <= 0.04045, channels / 12.92, ((channels + 0.055) / 1.055) ** 2.4)
    luminance = float(linear @ [0.2126, 0.7152, 0.0722])
    return "#000000" if (luminance + 0.05) / 0.05 >= 1.05 / (luminance + 0.05) else "#ffffff"


def labels_clear_of_line(tops, line: float, top: float, band: float):
    """Where the labels above bars start (data units), and the axis top that keeps them in view.

    The labels span ``band`` (a fraction of the axes' height) above each bar's top in ``tops``.
    Where the ``line`` (the device's capacity) would run through them, they start at the line
    instead and so sit above it, readable, rather than on it; the axis grows when it must.
    """
    tops = np.asarray(tops, dtype=float)

    def crossing(axis_top):
        return (tops <= line) & (line <= tops + band * axis_top)
    if crossing(top).any():
        top = max(top, line / (1 - band))   # a label starting at the line ends inside the axes
    return np.where(crossing(top), line, tops), top
