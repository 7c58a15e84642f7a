"""Explorer latency in the browser: a key press on a slider to the new image on screen.

Real JupyterLab in headless Chromium (the browser tests' helpers, tests/browser_support.py):
one notebook builds every chapter explorer as its notebook does; for each, the slider its
browser test moves gets two series of key presses, each timed inside the page from the keydown
event to the first frame after the new image has loaded (kernel round trip, recompute, redraw,
PNG, transfer, decode), with :data:`PAUSE_MS` between presses (a reader's pace, not a held key):

- **new settings**: presses the same way from where the notebook leaves the slider, each to a
  value it has not drawn (:data:`NEW_MOVES`);
- **back and forth**: then presses the other way and back (:data:`MOVES`, mirrored), each to a
  value drawn before: an explorer that remembers what is a pure function of its controls (the
  planner its plans, every explorer its images) answers those faster.

Printed per explorer: the median of each series beside the in-kernel time of the same moves
(``bench_explorer`` measures a redraw against rebuilding the figure; in this interpreter no
event loop runs, so nothing is worked out ahead), and what one move brings from the kernel
(widget updates, where the image comes among them, bytes), counted on the page's websocket.

The **floor** is the same key press on a slider whose observer only sets a pre-encoded PNG of
an explorer's size on an image (:data:`FLOOR`): what the widget round trip and the browser cost
with no work in the kernel. It is made of: noUiSlider's keydown handler and the widget model's
update message (the new ``value``/``index``), JupyterLab's websocket to the server and the
server's ZeroMQ hop to the kernel, ipykernel's handling of the comm message (the value set, its
``echo_update`` sent back, the observer), the image's update message with its binary buffer
the same way back, the widget manager turning it into a ``blob:`` URL, the image's decode and
the next frame. Target: the slowest explorer under :data:`TARGET_MS` on each kind of move.

``--baseline DIR`` times the explorers of another checkout too, move for move in the same run
(on a loaded machine only such pairs compare), and prints the ratios.

Skips, saying why, without Chromium or Playwright.
"""
from __future__ import annotations

import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from timing import size

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from browser_support import (  # noqa: E402  (the helpers live beside the browser tests)
    CALLS,
    chromium,
    find_chromium,
    jupyter_lab,
    run_explorers,
    write_layout_notebook,
)

MOVES = size(("ArrowRight", "ArrowLeft", "ArrowRight", "ArrowLeft", "ArrowRight"), ("ArrowRight",))
TARGET_MS = 100.0
PAUSE_MS = 300     # between two presses: a reader's pace
OTHER_WAY = {"ArrowRight": "ArrowLeft", "ArrowLeft": "ArrowRight"}
# The slider each explorer's browser test moves (tests/test_browser.py), by its label.
SLIDERS = {"02-memory-vs-gpu-count": "Model size", "03-memory-vs-model-size": "GPUs",
           "04-will-it-fit": "Micro-batch", "05-the-price-of-zero": "GPUs",
           "07-shard-groups-and-offload": "GPUs", "08-zero-beside-model-parallelism": "GPUs"}
NAMES = {"02-memory-vs-gpu-count": "gpu_count", "03-memory-vs-model-size": "model_size",
         "04-will-it-fit": "will_it_fit", "05-the-price-of-zero": "step_time",
         "07-shard-groups-and-offload": "placement", "08-zero-beside-model-parallelism": "planner"}
# Per explorer, the presses to settings not drawn before: the way its slider has room to go from
# where its notebook leaves it (five steps; the planner's GPUs, at 64 of 8 to 1,024, has four).
NEW_MOVES = {"02-memory-vs-gpu-count": ("ArrowLeft", 5), "03-memory-vs-model-size": ("ArrowRight", 5),
             "04-will-it-fit": ("ArrowRight", 5), "05-the-price-of-zero": ("ArrowLeft", 5),
             "07-shard-groups-and-offload": ("ArrowRight", 5),
             "08-zero-beside-model-parallelism": ("ArrowRight", 4)}
FLOOR = "floor"
# The floor's cell: PNGs of the GPU-count explorer (640 x 448) encoded before any press, and a
# slider whose observer only sets one of them on an image.
FLOOR_CELL = """import ipywidgets as widgets
from zerolib.chapter.explorers.gpu_count import MODEL_SIZES
_source = zl.GpuCountExplorer()
floor_pngs = []
for _size in MODEL_SIZES:
    _source.controls["params"].value = _size
    floor_pngs.append(bytes(_source.image.value))
floor_slider = widgets.IntSlider(value=7, min=0, max=len(floor_pngs) - 1, description="Floor",
                                 continuous_update=True)
floor_image = widgets.Image(value=floor_pngs[7], format="png")
floor_slider.observe(lambda change: setattr(floor_image, "value", floor_pngs[change["new"]]),
                     names="value")
widgets.VBox([floor_slider, floor_image])"""

# Armed before the key press: resolves with the milliseconds from the keydown to the first
# animation frame after the image's new source has loaded.
ARM = """(img) => { window.__latency = new Promise((resolve) => {
  let start = null;
  document.addEventListener('keydown', () => { start = performance.now(); }, {capture: true, once: true});
  const old = img.src;
  const observer = new MutationObserver(() => {
    if (img.src === old) return;
    observer.disconnect();
    const shown = () => requestAnimationFrame(() => resolve(performance.now() - start));
    if (img.complete && img.naturalWidth > 0) shown(); else img.addEventListener('load', shown, {once: true});
  });
  observer.observe(img, {attributes: true, attributeFilter: ['src']});
}); }"""


# Installed before the page loads: every websocket frame from the server is noted (when, how many
# bytes, whether it is a widget update and whether it carries a binary buffer: the image).
COUNT_MESSAGES = r"""(() => {
  window.__frames = [];
  const Socket = window.WebSocket;
  const kind = (data) => {
    try {
      let header, content, buffers = 0;
      if (typeof data === 'string') { const m = JSON.parse(data); header = m.header; content = m.content;
                                      buffers = (m.buffers || []).length; }
      else {   // the v1 kernel protocol: a count of offsets, the offsets, then the parts
        const view = new DataView(data), n = Number(view.getBigUint64(0, true));
        const at = (i) => Number(view.getBigUint64(8 + 8 * i, true));
        const part = (i) => JSON.parse(new TextDecoder().decode(
          new Uint8Array(data, at(i), (i + 1 < n ? at(i + 1) : data.byteLength) - at(i))));
        header = part(1); content = part(4); buffers = n - 6;
      }
      const update = header.msg_type === 'comm_msg' && content.data && content.data.method === 'update';
      return update ? (buffers > 0 ? 'image' : 'update') : header.msg_type;
    } catch (e) { return 'other'; }
  };
  window.WebSocket = function (...args) {
    const socket = new Socket(...args);
    socket.addEventListener('message', (event) => window.__frames.push({
      kind: kind(event.data), bytes: typeof event.data === 'string' ? event.data.length : event.data.byteLength}));
    return socket;
  };
  window.WebSocket.prototype = Socket.prototype;
  Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
})();"""


def series(stem: str, back_and_forth=MOVES) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The explorer's two series of presses: to new settings, then back and forth (the other
    way first, so that every one of them returns to a setting drawn before)."""
    way, count = NEW_MOVES[stem]
    count = size(count, 1)
    back = tuple(OTHER_WAY[m] for m in back_and_forth) if way == "ArrowRight" else tuple(back_and_forth)
    return (way,) * count, back


def kernel_redraw_ms(stem: str) -> tuple[float, float]:
    """The same presses in this interpreter, the explorer's own redraw: median milliseconds of
    the new settings and of the back and forth."""
    import zerolib as zl  # noqa: F401  (the calls read zl)
    from zerolib.core.units import GiB
    scope = {"zl": zl, "GiB": GiB, "TiB": 1024 * GiB}
    exec(CALLS[stem], scope)
    explorer = scope["explorer"]
    control = next(c for c in explorer.controls.values()
                   if getattr(c, "description", None) == SLIDERS[stem])
    values = [o[1] if isinstance(o, tuple) else o for o in getattr(control, "options", ())]
    medians = []
    for moves in series(stem):
        times = []
        for move in moves:
            step = 1 if move == "ArrowRight" else -1
            if values:
                new = values[values.index(control.value) + step]
            else:
                new = control.value + step * (control.step or 1)
            start = time.perf_counter()
            control.value = new
            times.append(time.perf_counter() - start)
        medians.append(1000 * statistics.median(times))
    return medians[0], medians[1]


class Slider:
    """The slider of one explorer on one page, and a key press on it timed."""

    def __init__(self, page, index: int, label: str):
        self.page = page
        output = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output",
                              has=page.locator("img.widget-image")).nth(index)
        output.scroll_into_view_if_needed()
        self.image = output.locator("img.widget-image")
        label = page.locator(".widget-label", has_text=re.compile(rf"^\s*{re.escape(label)}\s*$"))
        self.handle = output.locator(".widget-slider", has=label).locator(".noUi-handle").first

    def press(self, move: str) -> tuple[float, list[dict]]:
        """Milliseconds from the key press to the new image shown, and the frames it brought."""
        self.page.bring_to_front()     # a tab in the background has its frames throttled
        self.handle.scroll_into_view_if_needed()
        self.page.evaluate(ARM, self.image.element_handle())
        self.handle.focus()
        self.page.evaluate("() => { window.__frames = []; }")
        self.page.keyboard.press(move)
        latency = self.page.evaluate("() => window.__latency")
        self.page.wait_for_timeout(PAUSE_MS)
        return latency, self.page.evaluate("() => window.__frames")


def browser_latencies(pages: dict, back_and_forth=MOVES) -> dict:
    """Per page (its side: "current", "baseline"), explorer (and the floor) and series ("new",
    "back"): the latencies (ms) and the frames of each move. With two pages the moves alternate
    between them, so that a loaded machine's slow moments fall on both sides alike."""
    results = {side: {} for side in pages}
    plans = [(stem, list(CALLS).index(stem), SLIDERS[stem], series(stem, back_and_forth))
             for stem in SLIDERS]    # one per kind of explorer (08 shows the will-it-fit one again)
    plans.append((FLOOR, len(CALLS), "Floor", ((), back_and_forth)))
    for stem, index, label, (new, back) in plans:
        sliders = {side: Slider(page, index, label) for side, page in pages.items()}
        for side in pages:
            results[side][stem] = {"new": ([], []), "back": ([], [])}
        for kind, moves in (("new", new), ("back", back)):
            for move in moves:
                for side, slider in sliders.items():
                    latency, frames = slider.press(move)
                    results[side][stem][kind][0].append(latency)
                    results[side][stem][kind][1].append(frames)
    return results


def message_words(moves: list[list[dict]]) -> str:
    """What one move brought, from the median move: widget updates, where the image came among
    them, bytes."""
    updates = sorted(moves, key=len)[len(moves) // 2]
    kinds = [f["kind"] for f in updates if f["kind"] in ("image", "update")]
    place = kinds.index("image") + 1 if "image" in kinds else 0
    total = sum(f["bytes"] for f in updates)
    return (f"{len(kinds)} widget updates per move (the image {place} of them), "
            f"{len(updates)} messages, {total / 1000:.0f} kB")


def write_bench_notebook(work: Path) -> Path:
    """The layout notebook with the floor's cell at its end; returns the notebooks folder."""
    root = write_layout_notebook(work)
    notebook = nbformat.read(root / "explorers.ipynb", as_version=4)
    notebook.cells.append(nbformat.v4.new_markdown_cell("# floor"))
    notebook.cells.append(nbformat.v4.new_code_cell(FLOOR_CELL))
    nbformat.write(notebook, root / "explorers.ipynb")
    return root


def write_baseline_notebook(root: Path, baseline: Path, name: str = "baseline.ipynb") -> str:
    """The benchmark's notebook once more, its kernel importing zerolib from ``baseline`` (a
    checkout of another commit) before anything else."""
    notebook = nbformat.read(root / "explorers.ipynb", as_version=4)
    notebook.cells[0].source = (f"import sys\nsys.path.insert(0, {str(baseline)!r})\n"
                                + notebook.cells[0].source)
    nbformat.write(notebook, root / name)
    return name


def times_words(times) -> str:
    return ", ".join(f"{t:.0f}" for t in times)


def main(argv=()) -> int:
    """``--baseline DIR``: also time the explorers of the checkout DIR, move for move in the same
    run (e.g. ``git worktree add /tmp/before main``), and print the ratios."""
    baseline = Path(argv[argv.index("--baseline") + 1]).resolve() if "--baseline" in argv else None
    executable = find_chromium()
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        print("explorer_browser_latency: skipped (playwright is not installed: pip install -e '.[test]')")
        return 0
    if executable is None:
        print("explorer_browser_latency: skipped (Chromium is not installed: apt-get install -y chromium)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        root = write_bench_notebook(work)
        with sync_playwright() as driver, jupyter_lab(root, work) as lab, \
                chromium(driver, work / "profile", executable) as browser:
            pages = {"current": browser.new_page()}
            names = {"current": "explorers.ipynb"}
            if baseline is not None:
                pages["baseline"] = browser.new_page()
                names["baseline"] = write_baseline_notebook(root, baseline)
            for side, page in pages.items():
                page.add_init_script(COUNT_MESSAGES)
                run_explorers(page, lab, expect, names[side], expected=len(CALLS) + 1)
            results = browser_latencies(pages, MOVES * 2 if baseline else MOVES)
    slowest = {"new": 0.0, "back": 0.0}
    words = {"new": "new settings", "back": "back and forth"}
    for stem, kinds in results["current"].items():
        name = NAMES.get(stem, FLOOR)
        kernel = dict(zip(("new", "back"), kernel_redraw_ms(stem))) if stem != FLOOR else {}
        for kind, (times, frames) in kinds.items():
            if not times:
                continue
            browser_ms = statistics.median(times)
            if stem != FLOOR:
                slowest[kind] = max(slowest[kind], browser_ms)
            against = (f"against the in-kernel redraw {kernel[kind]:.0f} ms, "
                       f"{browser_ms / kernel[kind]:.1f}x" if kernel else
                       "an observer that only sets a pre-encoded PNG")
            print(f"explorer_browser_{name}_{kind}: {browser_ms:.0f} ms (key press to new image in "
                  f"Chromium, {words[kind]}, median of {len(times)}; {against}; moves "
                  f"{times_words(times)} ms; {message_words(frames)}; target < {TARGET_MS:.0f} ms)")
            if baseline is not None:
                before, before_frames = results["baseline"][stem][kind]
                before_ms = statistics.median(before)
                paired = statistics.median(a / b for a, b in zip(times, before))
                print(f"explorer_browser_{name}_{kind}_vs_baseline: {browser_ms / before_ms:.2f}x "
                      f"(median {browser_ms:.0f} ms against {before_ms:.0f} ms at {baseline}, "
                      f"moves interleaved; median of the paired ratios {paired:.2f}x; baseline "
                      f"moves {times_words(before)} ms; {message_words(before_frames)})")
    for kind in ("new", "back"):
        print(f"explorer_browser_slowest_{kind}: {slowest[kind]:.0f} ms ({words[kind]}; "
              f"target < {TARGET_MS:.0f} ms: {'met' if slowest[kind] < TARGET_MS else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
