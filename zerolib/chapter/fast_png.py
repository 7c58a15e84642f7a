"""Fast repeated rendering of one figure to PNG, for the explorers' redraws.

See :class:`IncrementalPng` for what it re-uses and why the pixels it gives are those of a full
draw.
"""
from __future__ import annotations

import copy
import enum
import math
import struct
import types
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.backend_bases import GraphicsContextBase, RendererBase
from matplotlib.backends.backend_agg import RendererAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties, findfont
from matplotlib.legend import Legend
from matplotlib.path import Path
from matplotlib.text import Text
from matplotlib.transforms import BboxBase, Transform, TransformedPath

from zerolib.chapter.style import style

# The settings a text or path's rasterisation reads from rcParams at draw time.
RC_PREFIXES = ("agg.", "font.", "mathtext.", "path.", "text.")
MARGIN = 2   # pixels around a block's extent, for antialiasing
RING = 12    # pixels around the extent; a block drawing in RING but outside MARGIN is not kept
KEPT = 512   # drawings kept, the least recently used dropped first
PNGS_KEPT = 8   # encoded images kept under their pixels (a slider moved back and forth)
SHOWN_KEPT = 16  # encoded images kept under their caller's key (an explorer's control values)


def text_blocks(artists) -> list:
    """The slow-changing text blocks of a drawn figure: title, subtitle, legend, axis labels."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.xaxis.label, ax.yaxis.label]


def every_text(figure: Figure) -> list:
    """Every text artist ``figure`` holds now, data labels too: many draw as in an earlier
    render (a bar that did not move keeps its value label), so they are worth keeping as blocks."""
    return figure.findobj(Text)


class _Uncacheable(Exception):
    """A block drew through something the recorder cannot compare: draw it afresh every time."""


def _plain(value):
    """``value`` as nested tuples of plain values, equal exactly when what the renderer draws
    from it is equal; raises :class:`_Uncacheable` for anything else."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.value)
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _plain(v)) for k, v in sorted(value.items()))
    if isinstance(value, Path):
        return ("path", _plain(value.vertices), _plain(value.codes), value._interpolation_steps,
                value.should_simplify, value.simplify_threshold)
    if isinstance(value, TransformedPath):
        return ("transformed path", _plain(value.get_fully_transformed_path()))
    if isinstance(value, BboxBase):
        return ("bbox", _plain(value.get_points()))
    if isinstance(value, Transform):
        if not value.is_affine:
            raise _Uncacheable(type(value).__name__)
        return ("affine", _plain(value.get_matrix()))
    if isinstance(value, GraphicsContextBase):
        return ("gc", _plain(vars(value)))
    if isinstance(value, FontProperties):
        return ("font", tuple(value.get_family()), value.get_style(), value.get_variant(),
                value.get_weight(), value.get_stretch(), value.get_size_in_points(),
                value.get_file(), value.get_math_fontfamily(), findfont(value))
    if isinstance(value, Text):
        # Agg's draw_text reads only these two of the text it is handed (matplotlib 3.11).
        return ("mtext", _plain(value.get_fontfeatures()), value.get_language())
    raise _Uncacheable(type(value).__name__)


# Attributes no draw reads: links to the parents and the renderer, callbacks, the stale flag,
# names. Everything else an artist of a block holds is part of its state.
NOT_DRAWN = frozenset({"stale_callback", "_stale", "_callbacks", "callbacks", "_remove_method",
                       "_renderer", "_mouseover", "_picker", "_in_autoscale", "_sticky_edges",
                       "_label", "_gid", "_url", "_parent_figure", "_axes", "parent", "figure",
                       "axes", "_draggable"})
# Values _plain compares as they are (a transform by its matrix as it is now).
_LEAVES = (Path, TransformedPath, BboxBase, Transform, FontProperties, np.ndarray, np.generic,
           enum.Enum)


def _ours(value) -> bool:
    """Whether ``value`` is the draw that :meth:`IncrementalPng.draw` sets on a block for one
    render (it calls the class's own draw)."""
    return (isinstance(value, partial) and isinstance(value.func, types.MethodType)
            and value.func.__func__ is IncrementalPng._draw_block)


_SCALARS = frozenset({type(None), bool, int, float, str, bytes})


def _state(value, tree: set, seen: dict):
    """Everything ``value`` holds, as nested tuples of plain values, following every attribute
    of every artist in ``tree`` (ids) and of matplotlib's own helper objects; raises
    :class:`_Uncacheable` on an artist outside ``tree`` or anything it cannot follow."""
    if type(value) in _SCALARS:        # the common case first: most attributes are plain
        return value
    if isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, _LEAVES):
        return _plain(value)
    if id(value) in seen:
        return ("seen", seen[id(value)])       # shared or cyclic: where it was first met
    seen[id(value)] = len(seen)
    if isinstance(value, Artist) and id(value) not in tree:
        raise _Uncacheable(f"{type(value).__name__} outside the block")
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple([_state(v, tree, seen) for v in value]))
    if isinstance(value, dict):
        return ("dict", tuple([(_state(k, tree, seen), _state(v, tree, seen))
                               for k, v in value.items()]))
    if isinstance(value, types.MethodType):
        return ("method", value.__func__.__qualname__, _state(value.__self__, tree, seen))
    if (isinstance(value, Artist) or type(value).__module__.startswith("matplotlib.")) and \
            hasattr(value, "__dict__") and not isinstance(value, (RendererBase, type)):
        return (type(value).__qualname__,
                tuple([(k, _state(v, tree, seen)) for k, v in vars(value).items()
                       if k not in NOT_DRAWN and not (k == "draw" and _ours(v))]))
    raise _Uncacheable(type(value).__name__)


def _full_rc() -> tuple:
    """Every rcParam, as its repr (a legend's artists may read any of them while drawing)."""
    return tuple((k, repr(v)) for k, v in sorted(dict.items(matplotlib.rcParams)))


def legend_state(legend: Legend, renderer, rc: tuple | None = None) -> tuple:
    """What a legend's drawing calls are a function of: every attribute of every artist in it,
    where it is anchored (its parent's box when it has no anchor of its own), the figure's dpi
    and size, the canvas and every rcParam. Equal states draw equal calls, so the dry run that
    finds them can be skipped; a legend placed "best" (which reads the data) has no state here.
    """
    if legend._loc == 0:
        raise _Uncacheable("loc='best' reads the axes' data")
    figure = legend.get_figure(root=True)
    tree = {id(artist) for artist in legend.findobj()}
    return (_full_rc() if rc is None else rc, renderer.width, renderer.height, renderer.dpi, figure.dpi,
            _plain(figure.bbox), _plain(legend.get_bbox_to_anchor()), _state(legend, tree, {}))


def _rc_key() -> tuple:
    # dict.items reads the stored values (indexing rcParams["backend"] would import pyplot).
    return tuple((k, _plain(v)) for k, v in sorted(dict.items(matplotlib.rcParams))
                 if k.startswith(RC_PREFIXES))


class _Recorder:
    """Stands in for the Agg renderer while one block draws: keeps every drawing call as plain
    values, and passes it on to the real renderer only when ``forward`` is set.

    Measuring (text extents, point sizes, new graphics contexts) goes to the real renderer;
    anything else a block might ask of it raises :class:`_Uncacheable`.
    """

    READS = frozenset({"points_to_pixels", "get_text_width_height_descent", "new_gc", "flipy",
                       "get_canvas_width_height", "open_group", "close_group", "dpi", "width",
                       "height", "option_image_nocomposite", "option_scale_image",
                       "get_image_magnification", "get_texmanager", "mathtext_parser",
                       "_text2path", "_raster_depth", "_rasterizing"})

    def __init__(self, renderer: RendererAgg):
        self.renderer = renderer
        self.calls: list = []
        self.replay: list = []   # the same calls as handed over, to draw them without a re-run
        self.forward = False

    def __getattr__(self, name):
        if name.startswith("draw_"):
            return partial(self._draw, name)
        if name in self.READS or not hasattr(self.renderer, name):
            return getattr(self.renderer, name)   # what Agg lacks stays missing (hasattr)
        raise _Uncacheable(name)

    def _draw(self, name, *args, **kwargs):
        # Recorded before drawing: a graphics context may change after the call.
        self.calls.append((name, _plain(args), _plain(kwargs)))
        if self.forward:
            return getattr(self.renderer, name)(*args, **kwargs)
        # A graphics context as it is at the call (the block may change it after); the other
        # arguments are not changed between a dry run and its replay, which follows at once.
        self.replay.append((name, [copy.copy(a) if isinstance(a, GraphicsContextBase) else a
                                   for a in args],
                            {k: copy.copy(v) if isinstance(v, GraphicsContextBase) else v
                             for k, v in kwargs.items()}))
        return None

    def draw_replay(self, replay: list) -> None:
        """Hand the real renderer the calls a dry run recorded: the block's pixels, without
        laying it out again."""
        for name, args, kwargs in replay:
            getattr(self.renderer, name)(*args, **kwargs)


@dataclass(frozen=True)
class _Kept:
    region: tuple       # (row slice, column slice) of the canvas the drawing calls drew into
    under: np.ndarray   # that region's pixels just before they drew
    over: np.ndarray    # and just after


def tick_labels(figure: Figure) -> list:
    """Every tick label the axes of ``figure`` hold now (matplotlib re-uses them between draws)."""
    labels = []
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in [*axis.majorTicks, *axis.minorTicks]:
                labels += [tick.label1, tick.label2]
    return labels


class IncrementalPng:
    """Render one figure to PNG again and again, re-using the pixels of texts drawn before.

    Text is what costs most in an Agg draw (matplotlib lays out and rasterises every glyph on
    every draw), and most of it (titles, legends, axis and tick labels) draws the same as in
    the last render. Every render is one full ``canvas.draw()`` in which each of the
    ``blocks`` and every tick label draws, in its place in the drawing order, in one of two
    ways:

    - by writing kept pixels into its region, when its drawing calls are ones kept before and
      the pixels beneath are the kept pixels beneath;
    - or afresh, with the real renderer, recording its calls as they pass; if it changed no
      pixel farther than ``MARGIN`` from its extent (checked out to ``RING``), that region's
      pixels just before and just after are kept under its calls.

    A dry run through a recorder (no rasterising) gives the calls each time: every primitive
    the Agg renderer would be handed (text, position, angle, font and its file, the graphics
    context, paths and transforms), with the dpi, the canvas size and the rcParams that
    rasterising reads. Agg's output in a region is a function of those calls and of the
    region's pixels beneath, so a re-used block leaves exactly the pixels a fresh draw would,
    and whatever draws after it (a data label over a title) draws onto the same pixels as in
    a full draw. Nothing is keyed by hand on chosen properties; a block that draws through
    anything the recorder cannot compare (a non-affine transform, a filter, rasterisation) is
    drawn afresh every time. A legend's layout is most of its dry run, so a legend's calls are
    also remembered under its whole state (:func:`legend_state`: every attribute of every
    artist in it, followed to plain values, its anchor, the figure's dpi and size, the canvas
    and every rcParam); an equal state gives the remembered calls without the dry run, and
    anything the state cannot follow (an artist outside the legend, a "best" placement that
    reads the data) leaves the dry run in place. ``benchmarks/bench_fast_png.py`` times the cache and the encoder
    each on its own; the explorers' property test compares random control sequences with full
    renders byte for byte. With no ``blocks`` a render is a plain full draw.
    """

    def __init__(self, figure: Figure, blocks=(), compress_level: int = 1):
        self.figure = figure
        self.blocks = list(dict.fromkeys(blocks))     # each block once, in order
        self.compress_level = compress_level
        self._kept: OrderedDict[tuple, _Kept] = OrderedDict()   # drawing calls -> pixels
        self._states: OrderedDict[tuple, tuple] = OrderedDict()  # legend state -> its calls
        self.dry_runs_skipped = 0   # legends whose calls came from their state
        self.replays = True         # a block drawn afresh replays its dry run's calls
        self._all_rc: tuple | None = None
        self._recorder: _Recorder | None = None
        self._rc: tuple | None = ()
        self._reused = 0
        self.full_draws = 0     # renders that re-used nothing
        # Pixels -> PNG bytes: encoding is a pure function of the pixels, and a reader returning
        # to a setting draws the same pixels again. Keyed by a checksum, confirmed by comparing
        # every pixel (a checksum alone could collide).
        self._pngs: OrderedDict[int, tuple[np.ndarray, bytes]] = OrderedDict()
        self.encodings_skipped = 0
        # Caller's key -> PNG bytes, for a caller whose figure is a function of its key.
        self._shown: OrderedDict[tuple, bytes] = OrderedDict()
        self.shown_kept = SHOWN_KEPT   # 0: every render draws
        self.draws_skipped = 0

    def _full_key(self, key) -> tuple | None:
        """``key`` with what rasterising reads besides the figure's artists: the rcParams (under
        the chapter's style), the figure's dpi and size; None where the rcParams cannot be compared."""
        with style():
            try:
                rc = _rc_key()
            except _Uncacheable:
                return None
        return (key, rc, self.figure.dpi, tuple(self.figure.get_size_inches()))

    def kept(self, key) -> bytes | None:
        """The PNG rendered before under ``key`` (see :meth:`render`), or None."""
        full = self._full_key(key)
        png = None if full is None else self._shown.get(full)
        if png is not None:
            self._shown.move_to_end(full)
        return png

    def render(self, key=None) -> bytes:
        """PNG bytes of the figure as it is now.

        With a ``key`` (hashable) the caller promises that the figure's artists are a function
        of it (an explorer: of its control values, the artists updated from them): the PNG of an
        earlier render under an equal key, with equal rcParams, dpi and size, is given back
        without drawing, else the figure is drawn and its PNG kept under the key (the last
        ``shown_kept``, :data:`SHOWN_KEPT` unless set).
        """
        full = None if key is None else self._full_key(key)
        if full is not None:
            png = self._shown.get(full)
            if png is not None:
                self._shown.move_to_end(full)
                self.draws_skipped += 1
                return png
        png = self._render()
        if full is not None and self.shown_kept:
            self._shown[full] = png
            while len(self._shown) > self.shown_kept:
                self._shown.popitem(last=False)
        return png

    def _render(self) -> bytes:
        pixels = self.draw()
        key = zlib.crc32(pixels)
        kept = self._pngs.get(key)
        if kept is not None and np.array_equal(kept[0], pixels):
            self._pngs.move_to_end(key)
            self.encodings_skipped += 1
            return kept[1]
        png = encode_png(pixels, self.compress_level)
        self._pngs[key] = (pixels.copy(), png)
        while len(self._pngs) > PNGS_KEPT:
            self._pngs.popitem(last=False)
        return png

    def draw(self) -> np.ndarray:
        """The figure's pixels (RGBA) as they are now, re-using texts drawn before."""
        canvas = self.figure.canvas
        with style():
            try:
                self._rc = _rc_key()
            except _Uncacheable:      # e.g. path effects set in rcParams: draw everything afresh
                self._rc = None
            self._reused = 0
            self._all_rc = None
            texts = list(dict.fromkeys([*self.blocks, *tick_labels(self.figure)])) if self.blocks else []
            for text in texts:
                # An instance attribute shadows the class's draw: the parent calls it in order.
                text.draw = partial(self._draw_block, text)
            try:
                canvas.draw()
            finally:
                for text in texts:
                    vars(text).pop("draw", None)
            if not self._reused:
                self.full_draws += 1
            return np.asarray(canvas.buffer_rgba())

    def _calls(self, block, renderer, forward: bool) -> tuple:
        """What the block's pixels depend on besides those beneath it: its drawing calls."""
        if self._recorder is None or self._recorder.renderer is not renderer:
            self._recorder = _Recorder(renderer)   # one per renderer keeps text metrics cached
        recorder = self._recorder
        recorder.calls, recorder.replay, recorder.forward = [], [], forward
        type(block).draw(block, recorder)
        return (self._rc, renderer.width, renderer.height, renderer.dpi, tuple(recorder.calls))

    def _calls_of(self, block, renderer) -> tuple:
        """The block's drawing calls: remembered under a legend's state (laying a legend out
        is most of its dry run), or from a dry run."""
        if not isinstance(block, Legend):
            return self._calls(block, renderer, forward=False)
        try:
            if self._all_rc is None:      # once per render, at the first legend
                self._all_rc = _full_rc()
            state = (self._rc, legend_state(block, renderer, self._all_rc))
        except _Uncacheable:
            return self._calls(block, renderer, forward=False)
        calls = self._states.get(state)
        if calls is not None:
            self._states.move_to_end(state)
            self.dry_runs_skipped += 1
            if self._recorder is not None:
                self._recorder.replay = None   # no dry run: nothing to replay
            return calls
        calls = self._calls(block, renderer, forward=False)
        self._states[state] = calls
        while len(self._states) > KEPT:
            self._states.popitem(last=False)
        return calls

    @staticmethod
    def _window(box, renderer, margin: int) -> tuple:
        """Rows and columns of the canvas within ``margin`` pixels of ``box`` (a block's extent)."""
        width, height = int(renderer.width), int(renderer.height)
        x0, x1 = max(math.floor(box.x0) - margin, 0), min(math.ceil(box.x1) + margin, width)
        y0, y1 = max(math.floor(box.y0) - margin, 0), min(math.ceil(box.y1) + margin, height)
        return slice(height - max(y1, y0), height - y0), slice(x0, max(x1, x0))   # rows run down

    def _draw_block(self, block, renderer):
        draw = type(block).draw
        if (self._rc is None or not isinstance(renderer, RendererAgg) or block.get_rasterized()
                or block.get_agg_filter() is not None):
            return draw(block, renderer)      # inside a recorded block, or not comparable
        try:
            key = self._calls_of(block, renderer)
        except _Uncacheable:
            return draw(block, renderer)
        if not key[-1]:
            return None                       # it draws nothing (hidden, or an empty string)
        pixels = np.asarray(renderer.buffer_rgba())
        kept = self._kept.get(key)
        if kept is not None and np.array_equal(pixels[kept.region], kept.under):
            pixels[kept.region] = kept.over
            self._kept.move_to_end(key)
            self._reused += 1
            return None
        recorder = self._recorder         # its replay is this block's dry run's (None: none ran)
        replay = recorder.replay if recorder is not None and recorder.renderer is renderer else None
        box = block.get_window_extent(renderer)     # laid out once for both windows
        region, window = self._window(box, renderer, MARGIN), self._window(box, renderer, RING)
        before = pixels[window].copy()
        if replay is not None and self.replays:
            recorder.draw_replay(replay)    # the dry run's calls, laid out once
        else:
            self._calls(block, renderer, forward=True)
        # The region inside the window, and whether anything changed outside it.
        inner = tuple(slice(r.start - w.start, r.stop - w.start) for r, w in zip(region, window))
        outside = pixels[window].copy()
        outside[inner] = before[inner]
        if np.array_equal(outside, before):
            self._kept[key] = _Kept(region, before[inner].copy(), pixels[region].copy())
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return None


def encode_png(rgba: np.ndarray, compress_level: int = 1) -> bytes:
    """A minimal PNG of an opaque RGBA pixel array: 8-bit RGB, no filtering, no metadata.

    Faster than Pillow's encoder on a figure (which filters every row; see
    ``benchmarks/bench_fast_png.py``) and no larger: a figure is mostly flat white.
    Deterministic: the bytes depend only on the pixels and ``compress_level``.
    """
    height, width = rgba.shape[:2]
    rows = np.empty((height, 1 + 3 * width), dtype=np.uint8)
    rows[:, 0] = 0                                   # filter type 0 (None) on every row
    # One strided copy of the RGB channels into the rows (reshaping the RGBA view first would
    # copy it once more), and the rows handed to zlib as they are (no bytes copy).
    rows[:, 1:].reshape(height, width, 3)[...] = rgba[..., :3]

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload)))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit truecolour RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows, compress_level)) + chunk(b"IEND", b""))


