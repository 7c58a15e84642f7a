"""IncrementalPng gives back the PNG rendered under a caller's key without drawing (the caller's
figure is a function of its key), unless what rasterising reads besides the artists changed;
and a text drawn afresh replays its dry run's calls with the pixels of a full draw."""
import matplotlib

from zerolib.chapter import fast_png
from zerolib.chapter.style import add_axes, new_figure


def line_figure():
    figure = new_figure((2, 1.5), 50)
    ax = add_axes(figure, (0.3, 0.1, 0.3, 0.1))
    line, = ax.plot([0, 1], [0, 1])
    return figure, ax, line


def test_a_key_rendered_before_is_given_back_without_drawing():
    figure, _, line = line_figure()
    renderer = fast_png.IncrementalPng(figure)
    up = renderer.render(("y", "up"))
    line.set_ydata([1, 0])
    down = renderer.render(("y", "down"))
    line.set_ydata([0, 1])
    draws = renderer.full_draws
    assert renderer.render(("y", "up")) == up != down
    assert renderer.full_draws == draws and renderer.draws_skipped == 1
    assert renderer.kept(("y", "down")) == down and renderer.kept(("y", "left")) is None


def test_other_rc_settings_or_another_size_draw_again():
    figure, _, _ = line_figure()
    renderer = fast_png.IncrementalPng(figure)
    renderer.render("key")
    with matplotlib.rc_context({"text.antialiased": False}):
        renderer.render("key")
    figure.set_size_inches(3, 1.5)
    renderer.render("key")
    assert renderer.draws_skipped == 0


def test_no_image_is_kept_by_key_when_told_not_to():
    figure, _, _ = line_figure()
    renderer = fast_png.IncrementalPng(figure)
    renderer.shown_kept = 0
    renderer.render("key")
    renderer.render("key")
    assert renderer.draws_skipped == 0


def test_texts_drawn_afresh_by_replay_give_the_pixels_of_a_full_draw():
    figure, ax, line = line_figure()
    title = ax.set_title("first")
    renderer = fast_png.IncrementalPng(figure, [title])
    for text, y in (("second", [1, 0]), ("third, longer", [0, 1]), ("first", [1, 0])):
        title.set_text(text)
        line.set_ydata(y)
        assert renderer.render() == fast_png.IncrementalPng(figure).render(), text
