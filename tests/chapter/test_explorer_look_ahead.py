"""Explorers draw the neighbours of their sliders while the kernel is idle.

After the first draw, every slider's; after a move made in the browser (a frontend's update,
applied through ``Widget.set_state``, not a change set from Python), the moved slider's, the
direction of travel first. Only where an event loop runs, one setting per callback; no widget
message is sent, and a move to a setting drawn ahead sends the kept image without drawing it
again.
"""
import asyncio
import math

import ipywidgets
import pytest

import zerolib as zl
from zerolib.chapter import explorers, fast_png
from zerolib.chapter.explorers.base import neighbours


@pytest.fixture
def sent(monkeypatch):
    """Every widget message sent, as (widget, message)."""
    messages = []
    original = ipywidgets.Widget._send

    def record(self, msg, buffers=None):
        messages.append((self, msg))
        return original(self, msg, buffers)

    monkeypatch.setattr(ipywidgets.Widget, "_send", record)
    return messages


def browser_move(control, index):
    """What the comm handler does with a slider's update from the browser."""
    control.set_state({"index": index})


def run_idle(seconds=2.0):
    """Run an event loop for a while, as the kernel's between messages."""
    async def idle():
        await asyncio.sleep(seconds)
    asyncio.run(idle())


def planner():
    return zl.PlannerExplorer(model="llama-2-7b", gpus=64, gpus_per_node=8, device="a100-80gb")


def test_a_slider_moved_right_has_its_right_neighbour_first():
    # GPUs 8, 16, ..., 1,024: moved from 64 to 128, next 256, then 64; at the end, one side only.
    control = planner().controls["gpus"]
    assert neighbours(control, 64, 128) == [256, 64]
    assert neighbours(control, 256, 128) == [64, 256]
    assert neighbours(control, 512, 1024) == [512]
    slider = ipywidgets.IntSlider(value=3, min=1, max=10)
    assert neighbours(slider, 2, 3) == [4, 2]
    assert neighbours(slider, 10, 9) == [8, 10]
    assert neighbours(ipywidgets.Dropdown(options=["a", "b"]), "a", "b") == []


def test_a_move_from_the_browser_draws_its_neighbours_when_idle_and_sends_nothing(sent):
    explorer = planner()
    gpus = explorer.controls["gpus"]

    def seen():
        return bytes(explorer.image.value), explorer.summary.value, explorer.table.value

    async def reader():
        browser_move(gpus, 4)                     # 64 -> 128, as the browser sends it
        assert explorer.prefetched == 0           # nothing before the kernel is idle
        assert any(widget is explorer.image for widget, _ in sent)   # the move's own image
        del sent[:]
        shown = seen()
        await asyncio.sleep(3)
        return list(sent), shown

    during, shown = asyncio.run(reader())
    assert during == []                           # drawing ahead sends no widget message
    assert seen() == shown
    assert explorer.prefetched == 1               # 256; 64 was drawn already
    assert gpus.value == 128
    draws = explorer._renderer.draws_skipped
    gpus.value = 256
    assert explorer._renderer.draws_skipped == draws + 1   # the kept image, not drawn again
    assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()


def test_a_change_set_from_python_draws_nothing_ahead():
    # Executing a notebook (nbval too) sets controls from Python: no extra work.
    explorer = planner()

    async def notebook():
        explorer.controls["gpus"].value = 128
        await asyncio.sleep(1)

    asyncio.run(notebook())
    assert explorer.prefetched == 0


def test_without_an_event_loop_nothing_is_drawn_ahead():
    explorer = planner()
    browser_move(explorer.controls["gpus"], 4)
    run_idle(0.5)
    assert explorer.prefetched == 0


def test_the_shard_group_follows_a_gpu_count_drawn_ahead():
    # 16 GPUs, shard group "all" (16): at 32 GPUs it is 32, as the observer sets it.
    explorer = explorers.PlacementExplorer(params=70 * 10**9, gpus=16, gpus_per_node=8,
                                           host_memory=1024**4, device="a100-80gb")
    assert explorer.prefetch("gpus", 32)
    draws = explorer._renderer.draws_skipped
    explorer.controls["gpus"].value = 32
    assert explorer.controls["shard_group"].value == 32
    assert explorer._renderer.draws_skipped == draws + 1
    assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()


def test_a_setting_that_cannot_be_drawn_is_not_drawn_ahead_and_changes_nothing():
    explorer = planner()
    shown = (bytes(explorer.image.value), explorer.summary.value, explorer.status.value)
    assert not explorer.prefetch("gpus", None)
    assert (bytes(explorer.image.value), explorer.summary.value, explorer.status.value) == shown


def test_nothing_is_drawn_ahead_of_a_setting_that_was_not_drawn():
    # Utilisation set to NaN from Python: the figure still shows the last drawn setting;
    # drawing ahead from there would leave the figure at a neighbour of a setting never drawn.
    explorer = planner()
    explorer.controls["mfu"].value = math.nan        # not drawn: said in the status line
    assert "Not redrawn" in explorer.status.value
    image = bytes(explorer.image.value)
    assert not explorer.prefetch("seq_len", 8192)
    assert bytes(explorer.image.value) == image == fast_png.IncrementalPng(explorer.figure).render()


def test_the_image_goes_before_the_shard_group_options_that_follow_the_gpu_count(sent):
    # The reader waits for the figure; the shard group's new options (divisors of 32) and value
    # can follow it.
    explorer = explorers.PlacementExplorer(params=70 * 10**9, gpus=16, gpus_per_node=8,
                                           host_memory=1024**4, device="a100-80gb")
    shard_group = explorer.controls["shard_group"]
    del sent[:]
    explorer.controls["gpus"].value = 32
    widgets = [widget for widget, _ in sent]
    assert explorer.image in widgets and shard_group in widgets
    assert widgets.index(explorer.image) < widgets.index(shard_group)
    assert widgets.count(shard_group) == 1          # options and value in one message
    assert shard_group.value == 32


def test_a_layout_slider_is_never_drawn_ahead():
    # Its value is read through the layout controls' own widgets, not the explorer's controls:
    # an image drawn "ahead" would show the present layout under another layout's key.
    explorer = zl.GpuCountExplorer()
    assert not explorer.prefetch("optimizer_bytes", 6.0)
    explorer.controls["optimizer_bytes"].value = 6.0
    assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()


def test_after_the_first_draw_every_sliders_neighbours_are_drawn_when_idle(sent):
    # Built in a kernel (an event loop runs): once idle, the next value either way of each
    # slider, GPUs 128 and 32, sequence 8,192 and 2,048, global batch 2,048 and 512 (the
    # utilisation slider is a float's: none), so a reader's first move draws nothing.
    async def notebook():
        explorer = planner()
        del sent[:]
        for _ in range(600):                     # at most 60 s on a slow machine
            await asyncio.sleep(0.1)
            if not explorer._ahead and explorer._ahead_handle is None and explorer.prefetched:
                break
        return explorer

    explorer = asyncio.run(notebook())
    assert sent == []                             # nothing sent, nothing the reader sees changed
    assert explorer.prefetched == 6 and len(explorer._plans) == 7     # the first and 6 ahead
    assert explorer.controls["gpus"].value == 64 and explorer.redraws == 0
    for name, value in [("gpus", 128), ("seq_len", 8192), ("global_batch", 512)]:
        control = explorer.controls[name]
        back, draws = control.value, explorer._renderer.draws_skipped
        control.value = value
        assert explorer._renderer.draws_skipped == draws + 1, name   # the kept image
        assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()
        fresh = planner()
        for other, c in explorer.controls.items():
            fresh.controls[other].value = c.value
        assert (explorer.summary.value, explorer.table.value) == (fresh.summary.value,
                                                                  fresh.table.value)
        control.value = back
