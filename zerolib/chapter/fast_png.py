"""Fast repeated rendering of one figure to PNG, for the explorers' redraws.

See :class:`IncrementalPng` for what it re-uses, what its cache key covers and when it could
serve stale pixels.
"""
from __future__ import annotations

import math
import struct
import zlib

import numpy as np
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from zerolib.chapter.style import style


def _text_key(text) -> tuple:
    return (text.get_text(), tuple(text.get_position()), text.get_color(), text.get_fontsize(),
            text.get_fontweight(), text.get_rotation(), text.get_visible())


def _block_key(artist) -> tuple:
    texts = artist.get_texts() if hasattr(artist, "get_texts") else [artist]
    return tuple(_text_key(t) for t in texts)


def text_blocks(artists) -> list:
    """The slow-changing text blocks of a drawn figure: title, subtitle, legend, axis labels."""
    ax = artists.ax
    return [artists.title, artists.subtitle, artists.legend, ax.xaxis.label, ax.yaxis.label]


class IncrementalPng:
    """Render one figure to PNG again and again, re-drawing slow text blocks only when they change.

    Text is what costs most in an Agg draw (matplotlib lays out and rasterises every glyph on
    every draw), and the title, subtitle, legend and axis labels change far less often than the
    data. This renderer keeps the pixels of those ``blocks`` (all outside the axes) from the last
    draw that showed them. When a block's key is unchanged, the figure is drawn without it and
    the kept pixels are pasted back: the same pixels a full draw gives. If anything drawn afresh
    reaches into a kept block (checked after the draw), the figure is drawn again in full.
    ``benchmarks/bench_fast_png.py`` times the cache and the encoder each on its own.

    The cache key of a block covers the figure's dpi and size in inches and, for every text of
    the block (a legend's texts, or the text itself): its string, position, colour, font size,
    font weight, rotation and visibility. Anything else that changes a block's pixels while all
    of those stay the same would be served stale: a legend handle's line colour, marker or
    width, a text's font family, alpha, alignment, transform or background box, or matplotlib
    settings that differ between renders. The chapter's charts change none of these after the
    first draw (a strategy keeps its colour and marker; labels change only by string and
    colour), and the tests compare every explorer image with a full draw.
    """

    def __init__(self, figure: Figure, blocks=(), compress_level: int = 1):
        self.figure = figure
        self.blocks = list(blocks)
        self.compress_level = compress_level
        self._kept: dict[int, tuple] = {}   # block index -> (key, pixel box, BufferRegion)
        self.full_draws = 0

    def _box(self, artist, renderer):
        """Whole-pixel extent of ``artist`` with a 2-pixel margin, clipped to the canvas."""
        box = artist.get_window_extent(renderer)
        width, height = self.figure.canvas.get_width_height(physical=True)
        return (max(math.floor(box.x0) - 2, 0), max(math.floor(box.y0) - 2, 0),
                min(math.ceil(box.x1) + 2, width), min(math.ceil(box.y1) + 2, height))

    @staticmethod
    def _overlap(a, b) -> bool:
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    def _key(self, block) -> tuple:
        return (self.figure.dpi, tuple(self.figure.get_size_inches()), _block_key(block))

    def _others(self, reuse):
        """Everything drawn afresh that could reach outside the axes (unclipped texts)."""
        others = [b for i, b in enumerate(self.blocks) if i not in reuse]
        for ax in self.figure.axes:
            texts = [*ax.texts, *ax.xaxis.get_ticklabels(), *ax.yaxis.get_ticklabels()]
            others += [t for t in texts if t not in self.blocks and t.get_visible()
                       and t.get_text() and not t.get_clip_on()]
        return others

    def _draw(self, reuse, renderer) -> bool:
        """Draw all but the reused blocks; False if a fresh artist overlaps a reused block."""
        hidden = [self.blocks[i] for i in reuse]
        for artist in hidden:
            artist.set_visible(False)
        try:
            self.figure.canvas.draw()
        finally:
            for artist in hidden:
                artist.set_visible(True)
        if not reuse:
            return True
        boxes = [self._box(a, renderer) for a in self._others(reuse)]
        return not any(self._overlap(self._kept[i][1], b) for i in reuse for b in boxes)

    def render(self) -> bytes:
        """PNG bytes of the figure as it is now."""
        return encode_png(self.draw(), self.compress_level)

    def draw(self) -> np.ndarray:
        """The figure's pixels (RGBA) as they are now, re-using the unchanged text blocks."""
        canvas = self.figure.canvas
        with style():
            renderer = canvas.get_renderer()
            reuse = {i for i, block in enumerate(self.blocks)
                     if block.get_visible() and i in self._kept
                     and self._kept[i][0] == self._key(block)}
            if not self._draw(reuse, renderer):
                reuse = set()
                self._draw(reuse, renderer)
            if not reuse:
                self.full_draws += 1
            for i in sorted(reuse):
                canvas.restore_region(self._kept[i][2])
            for i, block in enumerate(self.blocks):
                if i not in reuse and block.get_visible():
                    box = self._box(block, renderer)
                    self._kept[i] = (self._key(block), box,
                                     canvas.copy_from_bbox(Bbox.from_extents(*box)))
            return np.asarray(canvas.buffer_rgba())


def encode_png(rgba: np.ndarray, compress_level: int = 1) -> bytes:
    """A minimal PNG of an opaque RGBA pixel array: 8-bit RGB, no filtering, no metadata.

    Faster than Pillow's encoder on a figure (which filters every row; see
    ``benchmarks/bench_fast_png.py``) and no larger: a figure is mostly flat white.
    Deterministic: the bytes depend only on the pixels and ``compress_level``.
    """
    height, width = rgba.shape[:2]
    rows = np.empty((height, 1 + 3 * width), dtype=np.uint8)
    rows[:, 0] = 0                                   # filter type 0 (None) on every row
    rows[:, 1:] = rgba[..., :3].reshape(height, 3 * width)

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (struct.pack(">I", len(payload)) + kind + payload
                + struct.pack(">I", zlib.crc32(kind + payload)))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit truecolour RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), compress_level)) + chunk(b"IEND", b""))


