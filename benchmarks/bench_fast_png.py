"""The explorers' fast renderer, part by part: does each piece of IncrementalPng still pay?

On the will-it-fit figure at the explorers' dpi (the heaviest explorer), for a cycle of setting
changes, medians per redraw of:
- drawing: a full ``canvas.draw()`` vs IncrementalPng's draw that re-uses unchanged text blocks;
- encoding the same pixels: zerolib's ``encode_png`` vs Pillow's PNG encoder (its default level
  and level 1, the level encode_png uses), with the bytes each produces.
"""
from __future__ import annotations

import io
import itertools
import statistics
import time

import numpy as np
from PIL import Image
from timing import size

from zerolib.chapter.charts import will_it_fit as will_it_fit_chart
from zerolib.chapter.explorers.base import EXPLORER_DPI
from zerolib.chapter.fast_png import IncrementalPng, encode_png
from zerolib.chapter.style import style
from zerolib.core.memory.tables import peak_frame
from zerolib.core.memory.working_set import WorkingSetSettings

ROUNDS = size(8, 1)
SETTINGS = [WorkingSetSettings(micro_batch=b, recompute=r, seq_len=s)
            for b, r, s in [(1, "selective", 4096), (2, "selective", 4096), (2, "full", 4096),
                            (1, "none", 8192), (3, "selective", 2048)]]
DEVICES = ["h100-80gb", "a100-40gb"]


def pillow_png(rgba: np.ndarray, compress_level: int = 6) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgba[..., :3])).save(buffer, format="png",
                                                               compress_level=compress_level)
    return buffer.getvalue()


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main():
    frames = [peak_frame("llama-2-7b", 8, (0, 1, 2, 3), s) for s in SETTINGS]
    figure, artists = will_it_fit_chart.will_it_fit_figure(frames[0], DEVICES[0], dpi=EXPLORER_DPI)
    cached = IncrementalPng(figure, will_it_fit_chart.will_it_fit_blocks(artists))
    cached.draw()
    full, incremental, own, pil6, pil1, sizes = [], [], [], [], [], {}
    for frame, device in itertools.islice(itertools.cycle(itertools.product(frames, DEVICES)),
                                          ROUNDS * len(frames) * len(DEVICES)):
        will_it_fit_chart.update_will_it_fit(artists, frame, device)
        with style():
            seconds, _ = timed(figure.canvas.draw)
        full.append(seconds)
        pixels_full = np.asarray(figure.canvas.buffer_rgba()).copy()
        seconds, pixels = timed(cached.draw)
        incremental.append(seconds)
        assert np.array_equal(pixels, pixels_full)     # the cache serves the pixels of a full draw
        for store, encoder, level in ((own, encode_png, 1), (pil6, pillow_png, 6), (pil1, pillow_png, 1)):
            seconds, data = timed(lambda e=encoder, lv=level, px=pixels: e(px, lv))
            store.append(seconds)
            sizes[id(store)] = len(data)
    m = statistics.median
    print(f"fast_png_text_cache: {m(incremental) / m(full):.2f}x (drawing the will-it-fit figure "
          f"at {EXPLORER_DPI} dpi re-using unchanged text blocks, median {m(incremental) * 1e3:.1f} ms, "
          f"vs a full canvas.draw(), {m(full) * 1e3:.1f} ms; keep the cache while < 1)")
    print(f"fast_png_encoder: {m(own) / m(pil6):.2f}x (encode_png level 1, median {m(own) * 1e3:.1f} ms, "
          f"{sizes[id(own)]:,} bytes, vs Pillow's default, {m(pil6) * 1e3:.1f} ms, "
          f"{sizes[id(pil6)]:,} bytes; Pillow level 1: {m(pil1) * 1e3:.1f} ms, {sizes[id(pil1)]:,} bytes; "
          f"keep encode_png while < 1)")


if __name__ == "__main__":
    main()
