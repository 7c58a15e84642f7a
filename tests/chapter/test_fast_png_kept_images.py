"""IncrementalPng keeps encoded images under their pixels: the same pixels give the same bytes
without encoding again, and any changed pixel is encoded afresh."""
import numpy as np

from zerolib.chapter import fast_png
from zerolib.chapter.style import add_axes, new_figure


def test_the_same_pixels_are_not_encoded_twice_and_new_ones_are(monkeypatch):
    figure = new_figure((2, 1.5), 50)
    ax = add_axes(figure, (0.3, 0.1, 0.3, 0.1))
    line, = ax.plot([0, 1], [0, 1])
    renderer = fast_png.IncrementalPng(figure)
    encoded = []
    encode = fast_png.encode_png
    monkeypatch.setattr(fast_png, "encode_png",
                        lambda rgba, level=1: (encoded.append(1), encode(rgba, level))[1])
    first = renderer.render()
    line.set_ydata([1, 0])
    second = renderer.render()
    line.set_ydata([0, 1])
    third = renderer.render()
    assert first != second and third == first
    assert len(encoded) == 2 and renderer.encodings_skipped == 1
    # What is returned is what an encoder gives for the pixels drawn now.
    assert third == encode(np.asarray(figure.canvas.buffer_rgba()))


def test_a_checksum_collision_is_encoded_afresh(monkeypatch):
    figure = new_figure((2, 1.5), 50)
    ax = add_axes(figure, (0.3, 0.1, 0.3, 0.1))
    line, = ax.plot([0, 1], [0, 1])
    renderer = fast_png.IncrementalPng(figure)
    monkeypatch.setattr(fast_png.zlib, "crc32", lambda _data: 7)   # every image collides
    first = renderer.render()
    line.set_ydata([1, 0])
    second = renderer.render()
    assert second != first and renderer.encodings_skipped == 0
    assert second == fast_png.encode_png(np.asarray(figure.canvas.buffer_rgba()))


def test_only_the_last_eight_images_are_kept():
    figure = new_figure((2, 1.5), 50)
    ax = add_axes(figure, (0.3, 0.1, 0.3, 0.1))
    line, = ax.plot([0, 1], [0, 1])
    renderer = fast_png.IncrementalPng(figure)
    for k in range(12):
        line.set_ydata([0, k])
        renderer.render()
    assert fast_png.PNGS_KEPT == 8 and len(renderer._pngs) == 8
