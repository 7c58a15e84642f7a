"""The chapter where its readers read it: live in JupyterLab, and as exported static HTML.

Real JupyterLab started by ``zerolib lab`` (on its working copy, in a temporary folder, with a
2 s autosave), real headless Chromium (Debian's, driven by Playwright's Python API):

- every notebook with an explorer is opened: before it runs, its saved explorer shows (its
  picture and its note that it is saved, not live), never a repr line; it is run top to bottom
  (its note now says live) and a slider is moved: the explorer's image must be redrawn (new
  bytes) and its table must show what the new value means; a cell is run a second time, the
  notebook saved, and autosave given its turn; screenshots go to test-output/browser/;
- afterwards the committed notebooks are byte for byte as they were, ``zerolib notebooks --check``
  passes on them, and ``zerolib html`` of the reader's saved copies shows no repr line either;
- ``zerolib html`` exports the chapter; every page is opened offline and every image must have
  loaded and every heading of the notebook must be on the page; each saved explorer is set in
  the chapter's font.

Skips with an install hint without Chromium or Playwright; CI sets ZEROLIB_REQUIRE_OPTIONAL=1, which
turns that skip into a failure.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from browser_support import (
    AUTOSAVE_SECONDS,
    KERNEL_IDLE_MS,
    RUN_ALL_MS,
    WIDGET_UPDATE_MS,
    chromium,
    zerolib_lab,
)
from conftest import REPO, missing_optional

from zerolib.publish.html import markdown_headings
from zerolib.publish.saved_widgets import saved_widget_html, widget_states

pytestmark = pytest.mark.browser

NOTEBOOKS = REPO / "notebooks"
SCREENSHOTS = REPO / "test-output" / "browser"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


# --- what each explorer is checked for -----------------------------------------------------------

@dataclass(frozen=True)
class ExplorerCheck:
    """One slider step in a notebook's explorer, and what the explorer must say afterwards.

    ``shows`` are texts (whitespace-normalised) that the explorer's summary or table must show
    after the step and must not show before it; their numbers are worked out by hand below.
    """
    notebook: str
    slider: str           # the slider's description label
    before: str           # its readout as the notebook leaves it
    after: str            # its readout after one ArrowRight
    shows: tuple[str, ...]


# Worked out by hand. Mixed-precision Adam: 2 + 2 + 12 = 16 bytes per parameter (P); a
# partitioned category holds ceil(P / N) elements on each of N GPUs. The A100 80GB holds
# 80 GiB = 85,899,345,920 bytes = 85.9 GB. The explorers print three significant digits.
EXPLORERS = {check.notebook: check for check in (
    # Notebook 1 leaves the shard explorer at its worksheet, 1B parameters on 4 GPUs, stage 1; one
    # step right is 5 GPUs: 2 GB of fp16 parameters and 2 GB of gradients stay whole, the 12 GB of
    # optimizer state split five ways is 2.4 GB: 6.4 GB per GPU; stage 3 holds 16 / 5 = 3.2 GB.
    ExplorerCheck(
        "01-bytes-per-parameter.ipynb", "GPUs", "4", "5", (
            "1B parameters on 5 GPUs",
            "Per GPU: parameters 2.00 GB + gradients 2.00 GB + optimizer state 2.40 GB = 6.40 GB",
            "ZeRO stage 3 (+ parameters) 0.4 GB 0.4 GB 2.40 GB 3.20 GB",
        )),
    # Notebook 2 leaves the explorer at 70B on 1 to 1024 GPUs; one step right is 175B (the next
    # size offered). At 1024 GPUs ceil(175e9 / 1024) = 170,898,438: plain DP 16P = 2,800 GB;
    # stage 1 4P + 12 x 170,898,438 = 700 + 2.05 = 702 GB; stage 2 2P + 14 x ... = 350 + 2.39 =
    # 352 GB; stage 3 16 x 170,898,438 = 2.73 GB.
    # Fewest GPUs on the A100: stages 0-2 never (their replicated parts alone, 2,800 / 700 / 350
    # GB, exceed 85.9 GB); stage 3 at 33 GPUs: 16 x ceil(175e9 / 33) = 16 x 5,303,030,304 =
    # 84.8 GB, while 32 GPUs need 16 x 5,468,750,000 = 87.5 GB.
    ExplorerCheck(
        "02-memory-vs-gpu-count.ipynb", "Model size", "70B", "175B", (
            "175B parameters on 1 to 1024 GPUs",
            "Per GPU at 1024 GPUs: Plain data parallelism: 2,800 GB; ZeRO stage 1 (optimizer): "
            "702 GB; ZeRO stage 2 (+ gradients): 352 GB; ZeRO stage 3 (+ parameters): 2.73 GB",
            "ZeRO stage 2 (+ gradients) never at least 350 GB at any GPU count",
            "ZeRO stage 3 (+ parameters) 33 84.8 GB",
        )),
    # Notebook 3 leaves the explorer at 8 GPUs with the 1B 7B 13B 30B 70B models; one step right
    # is 9 GPUs. 70B: ceil(70e9 / 9) = 7,777,777,778; plain DP 1,120 GB; stage 1 280 + 93.3 =
    # 373 GB; stage 2 140 + 108.9 = 249 GB; stage 3 124 GB (140 GB at 8 GPUs): nothing fits.
    # 30B: ceil(30e9 / 9) = 3,333,333,334; 480 GB; 120 + 40.0 = 160 GB; 60 + 46.7 = 107 GB;
    # stage 3 53.3 GB (60.0 at 8 GPUs), the least partitioning that fits.
    ExplorerCheck(
        "03-memory-vs-model-size.ipynb", "GPUs", "8", "9", (
            "Per GPU on 9 GPUs against the A100 80GB",
            "30B 480 GB (too big) 160 GB (too big) 107 GB (too big) 53.3 GB (state fits) "
            "ZeRO stage 3 (+ parameters)",
            "70B 1,120 GB (too big) 373 GB (too big) 249 GB (too big) 124 GB (too big) "
            "none: add GPUs or pick a smaller layout",
            "70B under ZeRO stage 3: 124 GB of model state per GPU",
        )),
    # Notebook 4 leaves the explorer at Llama-2-7B (P = 6,738,415,616) on 8 H100 80GB, sequence
    # 4096, micro-batch 2, selective recomputation, flash attention; one step right is micro-batch
    # 3. Per sequence: activations 32 x (16sbh + 8sbf) + 4asb + 4sbh = 20,200,292,352 bytes and
    # logits + loss 6 x 4096 x 32,000 = 786,432,000 (s = 4096, h = 4096, f = 11008, a = 32), so
    # micro-batch 3 holds 60.6 GB and 2.36 GB, and every peak grows by 20.99 GB per micro-batch
    # from micro-batch 1: plain DP 144.43 -> 186 GB; stage 1 61.20 -> 103 GB; stage 2 49.4 ->
    # 91.4 GB; stage 3 39.61 -> 81.6 GB (under 85.9: fits).
    # Fewest GPUs at micro-batch 3 (working set 66.11 GB, 68.11 GB with stage 3's 2 GB of
    # gathered parameters; 19.79 GB left of 85.90): stage 1's replicated 4P = 26.95 GB alone is
    # over it: never; stage 2 needs 2P + 14 ceil(P/N) <= 19.79 GB, ceil(P/N) <= 0.451e9, N = 15;
    # stage 3 needs 16 ceil(P/N) <= 17.79 GB, ceil(P/N) <= 1.112e9, N = 7. The largest micro-batch
    # on 8 GPUs does not depend on the micro-batch: stage 1 (85.90 - 40.21) / 20.99 = 2.18 -> 2;
    # stage 3 (85.90 - 18.62) / 20.99 = 3.2 -> 3; plain DP never. The reserved peak beside each:
    # (peak - the 2.15 GB reserve) x 1.108403 + 2.15: 186 -> 206, 103 -> 114, 91.4 -> 101,
    # 81.6 -> 90.2 GB.
    ExplorerCheck(
        "04-will-it-fit.ipynb", "Micro-batch", "2", "3", (
            "sequence 4,096 · micro-batch 3 · selective recomputation",
            "activations (60.6 GB) and the logits and loss (2.36 GB)",
            "Plain data parallelism 186 GB 206 GB too big never never",
            "ZeRO stage 1 (optimizer) 103 GB 114 GB too big never 2",
            "ZeRO stage 2 (+ gradients) 91.4 GB 101 GB too big 15 2",
            "ZeRO stage 3 (+ parameters) 81.6 GB 90.2 GB fits 7 3",
            "Fewest GPUs that fit (micro-batch 3)",
        )),
    # Notebook 7 starts the explorer at 16 GPUs; one step right is 32 (four nodes of 8). ZeRO-3:
    # 16 B x 70e9 / 32 = 35.0 GB. Optimizer on the CPU: 2 B x 70e9 / 32 = 4.375 GB on each GPU;
    # each node's 8 GPUs keep 16 B x 70e9 / 32 x 8 = 280 GB of CPU memory, under 1 TiB.
    ExplorerCheck(
        "07-shard-groups-and-offload.ipynb", "GPUs", "16", "32", (
            "70B parameters on 32 GPUs, sharded over groups of 32 (1 replica)",
            "ZeRO-3 35.0 GB fits 0 GB fits 0 GB",
            "ZeRO-3 + optimizer on CPU 4.38 GB fits 280 GB fits 0 GB",
        )),
    # Notebook 5 leaves the explorer at Llama-2-7B on 64 H100 80GB in DGX H100 nodes under the
    # ZeRO paper's schedule; one step right is 128 GPUs (16 nodes, still min(370, 8 x 48) = 370
    # GB/s across them, the rates NCCL reaches). ceil(P / 128) = 52,643,872 elements: a ring pass
    # sends 127 x 52,643,872 x 2 = 13.37 GB, two passes 26.74 GB, three 40.11 GB. Stage 1 holds
    # 4P + 12 x 52,643,872 = 27.58 GB of state + 24.15 GB of working set = 51.7 GB; each pass
    # takes 13.37e9 / 370e9 s + (8.4 + 112 x 3.4 + 15 x 14.0) us = 0.03674 s, two 0.0735 s; the
    # after-step gather is exposed behind the compute, (6 x 6,607,343,616 multiplied parameters
    # + 3 x 1,073,741,824 of causal attention core) x 4,096 / (0.4 x 989.5e12) = 0.4436 s:
    # 0.4803 s a step, 8 %. Stage 3 holds 16P / 128 = 0.84 GB +
    # 26.15 GB of working set (2 GB of it gathered parameters) = 27.0 GB; its three passes of 35
    # layers (3 x 0.03614 + 105 x 599.2 us = 0.171 s) hide behind compute: 0.44 s.
    # Notebook 8 leaves the planner explorer at Llama-2-70B on 64 A100 80GB (DGX A100 nodes,
    # sequence 4,096, global batch 1,024, 40% of peak) under PyTorch FSDP2; one step right is 128
    # GPUs. The fastest that fits is then t 2 x d 64 under ZeRO-3, 16 micro-batches of one
    # sequence per step. One GPU holds 80 layers of (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x
    # 28672) / 2 + 2 x 8192 = 427,835,392, half the embedding and of the output layer
    # (131,072,000 each) and the final norm: 34,488,983,552 parameters, of which 34,357,911,552
    # multiplied (the embedding's half is looked up); the causal attention core of its 32 heads,
    # 4096 x 32 x 256 x 80 = 2,684,354,560 per token: compute 16 x (6 x 34,357,911,552 + 3 x
    # 2,684,354,560) x 4096 / (0.4 x 312e12) = 112.48 s. Each micro-batch all-reduces 2 x 4096 x 8192 =
    # 67,108,864 bytes 322 times over 2 GPUs on NVLink 3 at the 230 GB/s NCCL achieves (4 per
    # layer, the embedding's, the output layer's): 8.4 + 2 x 3.4 us + 67,108,864 / 230e9 s =
    # 307.0 us, 98.8 ms, 1.58 s for 16. ZeRO-3's gathers hide behind each micro-batch's forward
    # compute but for the first layer's (0.14 s a step). Step 112.48 + 1.58 + 0.14 = 114.2 s:
    # "114 s".
    ExplorerCheck(
        "08-zero-beside-model-parallelism.ipynb", "GPUs", "64", "128", (
            "llama-2-70b on 128 A100 80GB",
            "Fastest that fits: t 2 x p 1 (1F1B) x d 64, ZeRO-3, no recomputation, "
            "micro-batch 1 x 16, no offload: 114 s per step",
        )),
    # Notebook 9 leaves the explorer at Mistral-7B-v0.3 read from its config.json (h = 4096,
    # 32 layers, 32 heads of 128, 8 key/value heads, f = 14336, vocabulary 32,768) on 3 H100 80GB,
    # sequence 4096, micro-batch 1, selective recomputation, flash attention; one step right is
    # micro-batch 2 (sb = 8192). A layer keeps 2 bytes x (4 sbh: the two norms' inputs, the QKV
    # and the MLP inputs; sbh for Q; 2 x 1024 sb for K and V; sbh for the output projection's
    # input; 4 sbf for the gated MLP) + 4 x 32 sb of flash statistics = sb x 168,064 bytes =
    # 1,376,780,288; 32 layers + the final norm's and output layer's inputs (2 x 2sbh) + one layer's
    # statistics recomputed = 44,192,235,520 bytes: "44.2 GB". Logits and loss: (2 + 4) x 8192 x
    # 32,768 = 1,610,612,736 bytes: "1.61 GB".
    ExplorerCheck(
        "09-size-your-own-model.ipynb", "Micro-batch", "1", "2", (
            "sequence 4,096 · micro-batch 2 · selective recomputation",
            "activations (44.2 GB) and the logits and loss (1.61 GB)",
            "Fewest GPUs that fit (micro-batch 2)",
        )),
    ExplorerCheck(
        "05-the-price-of-zero.ipynb", "GPUs", "64", "128", (
            "llama-2-7b on 128 GPUs",
            "ZeRO stage 1 (optimizer) 51.7 GB fits 26.7 GB 0.073 s 0.48 s 8%",
            "ZeRO stage 3 (+ parameters) 27.0 GB fits 40.1 GB 0.17 s 0.44 s 0%",
        )),
)}


def has_widget_output(path: Path) -> bool:
    nb = nbformat.read(path, as_version=4)
    return any(WIDGET_VIEW in output.get("data", {})
               for cell in nb.cells if cell.cell_type == "code" for output in cell.outputs)


def explorer_notebooks() -> list[str]:
    return sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if has_widget_output(p))


# --- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(playwright, chromium_path, tmp_path_factory):
    with chromium(playwright, tmp_path_factory.mktemp("chromium-profile"), chromium_path) as context:
        yield context


@pytest.fixture(scope="module")
def committed() -> dict[str, bytes]:
    """The committed notebooks' bytes before anything is read."""
    return {p.name: p.read_bytes() for p in NOTEBOOKS.glob("*.ipynb")}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium_path, playwright, committed):
    """``zerolib lab`` as a reader starts it, on its working copy in a temporary folder."""
    with zerolib_lab(tmp_path_factory.mktemp("jupyterlab")) as server:
        yield server


@pytest.fixture
def page(browser):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.page_errors = errors
    try:
        yield page
    finally:
        page.close()


# --- driving JupyterLab ---------------------------------------------------------------------------

def open_notebook(page, lab, notebook: str) -> None:
    """Open ``notebook`` and wait for an idle kernel."""
    from playwright.sync_api import expect

    page.goto(lab.notebook_url(notebook))
    # Pressing Run All before the kernel is ready opens a modal "Select Kernel" dialog instead.
    expect(page.locator(".jp-StatusBar-Widget")).to_contain_text("| Idle", timeout=KERNEL_IDLE_MS)


def saved_explorer_shows(page, notebook: str) -> None:
    """Before the notebook runs: its explorer drawn from the saved widget state (picture, the
    note that it is saved, controls off), no output showing a widget's repr."""
    from playwright.sync_api import expect

    panel = page.locator(".jp-NotebookPanel:visible")
    image = panel.locator("img.widget-image")
    expect(image).to_have_count(1, timeout=WIDGET_UPDATE_MS)
    wait_for_loaded(page, image)
    explorer = panel.locator(".jp-OutputArea-output", has=page.locator("img.widget-image"))
    explorer.scroll_into_view_if_needed()
    # (its text content: JupyterLab lays out what is out of view lazily, without inner text)
    expect(explorer).to_contain_text("Saved explorer, not live:", timeout=WIDGET_UPDATE_MS)
    expect(explorer).not_to_contain_text("Live explorer")
    assert explorer.locator("input:enabled, select:enabled, button:enabled").count() == 0
    reprs = panel.locator(".jp-OutputArea-output", has_text=re.compile(r"VBox\(|Explorer \(ipywidgets\)"))
    assert reprs.count() == 0, f"{notebook} shows {reprs.first.inner_text()[:200]!r} before it runs"


def open_and_run_all(page, lab, notebook: str, saved_first: bool = False) -> None:
    """Open ``notebook``, wait for an idle kernel (with ``saved_first``, check its saved explorer
    shows), Run > Run All Cells, wait until every cell ran."""
    open_notebook(page, lab, notebook)
    if saved_first:
        saved_explorer_shows(page, notebook)
    run_all(page, notebook)


def run_all(page, notebook: str) -> None:
    from playwright.sync_api import expect

    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    # Every code cell shows an execution count ("[7]:"), none is queued or running ("[*]:").
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            return prompts.length > 0 && prompts.every(p => /\\[\\d+\\]/.test(p.textContent));
        }""", timeout=RUN_ALL_MS)
    expect(page.locator(".jp-StatusBar-Widget")).to_contain_text("| Idle", timeout=RUN_ALL_MS)
    stderr = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
    assert stderr.count() == 0, f"{notebook} printed errors or warnings:\n" + "\n".join(
        stderr.all_inner_texts())


def image_digest(page, image) -> str:
    """SHA-256 of the bytes behind an <img> (the widget's blob: URL), read inside the page."""
    src = image.get_attribute("src")
    return page.evaluate(
        """async (src) => {
            const bytes = await (await fetch(src)).arrayBuffer();
            const digest = await crypto.subtle.digest('SHA-256', bytes);
            return [...new Uint8Array(digest)].map(b => b.toString(16).padStart(2, '0')).join('');
        }""", src)


def wait_for_loaded(page, image) -> None:
    image.wait_for(state="visible", timeout=WIDGET_UPDATE_MS)
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0",
                           arg=image.element_handle(), timeout=WIDGET_UPDATE_MS)


def slider(explorer, description: str):
    """The slider whose description label reads ``description``."""
    found = explorer.locator(".widget-slider", has=explorer.page.locator(
        ".widget-label", has_text=re.compile(rf"^\s*{re.escape(description)}\s*$")))
    assert found.count() == 1, f"expected one slider labelled {description!r}, found {found.count()}"
    return found


def normalised_text(locator) -> str:
    return " ".join(locator.inner_text().split())


def move_slider_and_check(page, lab, check: ExplorerCheck, shots: Path,
                          update_ms: int = WIDGET_UPDATE_MS, saved_first: bool = True) -> None:
    """The whole reader's path through one explorer; raises AssertionError when it does not work."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    open_and_run_all(page, lab, check.notebook, saved_first)
    notebook = page.locator(".jp-NotebookPanel:visible")
    image = notebook.locator("img.widget-image")
    assert image.count() == 1, f"{check.notebook}: expected one explorer image, found {image.count()}"
    wait_for_loaded(page, image)
    explorer = notebook.locator(".jp-OutputArea-output", has=page.locator("img.widget-image"))
    explorer.scroll_into_view_if_needed()
    control = slider(explorer, check.slider)
    readout = control.locator(".widget-readout")
    expect(readout).to_have_text(check.before, timeout=update_ms)
    before_src, before_digest = image.get_attribute("src"), image_digest(page, image)
    before_text = normalised_text(explorer)
    assert "Live explorer:" in before_text and "move nothing" not in before_text, before_text[:300]
    assert "Saved explorer" not in before_text
    explorer.screenshot(path=str(shots / f"{Path(check.notebook).stem}-before.png"))

    control.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    expect(readout).to_have_text(check.after, timeout=update_ms)
    try:
        page.wait_for_function("([img, old]) => img.getAttribute('src') !== old",
                               arg=[image.element_handle(), before_src], timeout=update_ms)
    except PlaywrightTimeout:
        raise AssertionError(f"{check.notebook}: the image was not redrawn within {update_ms} ms "
                             f"after moving {check.slider!r} from {check.before} to {check.after}") from None
    wait_for_loaded(page, image)
    # The text widgets change in the same callback as the image; give their messages a moment.
    try:
        page.wait_for_function("([el, want]) => el.innerText.replace(/\\s+/g, ' ').includes(want)",
                               arg=[explorer.element_handle(), check.shows[0]], timeout=2_000)
    except PlaywrightTimeout:
        pass  # reported below, with every text that is missing
    explorer.screenshot(path=str(shots / f"{Path(check.notebook).stem}-after.png"))
    assert image_digest(page, image) != before_digest, "the redrawn image has the same bytes"
    after_text = normalised_text(explorer)
    problems = [f"shown before the move already: {want!r}" for want in check.shows if want in before_text]
    problems += [f"not shown after the move: {want!r}" for want in check.shows if want not in after_text]
    assert not problems, (f"{check.notebook}, {check.slider} {check.before} -> {check.after}:\n"
                          + "\n".join(problems) + f"\nexplorer text after: {after_text}")
    assert not page.page_errors, f"JavaScript errors: {page.page_errors}"


def run_a_cell_again_and_save(page, lab, notebook: str) -> None:
    """Run the first code cell a second time (a new execution count), save (Ctrl+S) and give
    autosave its turn: all of it lands in the working copy."""
    from playwright.sync_api import expect

    path = lab.root_dir / notebook
    before = path.read_bytes()
    cell = page.locator(".jp-NotebookPanel:visible .jp-CodeCell").first
    prompt = cell.locator(".jp-InputPrompt")
    count = prompt.inner_text()
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    expect(prompt).not_to_have_text(count, timeout=RUN_ALL_MS)
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=RUN_ALL_MS)
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 60
    while path.read_bytes() == before and time.monotonic() < deadline:
        time.sleep(0.25)
    assert path.read_bytes() != before, f"{notebook} was not saved in the working copy"
    time.sleep(AUTOSAVE_SECONDS + 0.5)      # autosave's turn
    tab = page.locator(".lm-TabBar-tab.jp-mod-current")
    expect(tab).not_to_have_class(re.compile(r"jp-mod-dirty"), timeout=RUN_ALL_MS)


# --- tests ----------------------------------------------------------------------------------------

def test_every_explorer_notebook_has_a_check():
    """A notebook that gains an explorer must gain a browser check too."""
    assert explorer_notebooks(), "no notebook in notebooks/ shows a widget"
    assert set(explorer_notebooks()) == set(EXPLORERS)


@pytest.mark.parametrize("notebook", sorted(EXPLORERS))
def test_explorer_slider_redraws_the_figure(notebook, lab, page, committed):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    move_slider_and_check(page, lab, EXPLORERS[notebook], SCREENSHOTS)
    run_a_cell_again_and_save(page, lab, notebook)
    assert (NOTEBOOKS / notebook).read_bytes() == committed[notebook], f"reading changed {notebook}"


# Broken on purpose in a temporary copy: every callback that the chapter's code (not ipywidgets
# itself) registers on a slider raises instead of redrawing, as a bug in an explorer would.
SABOTAGE = """import ipywidgets
_original_observe = ipywidgets.Widget.observe
def _broken_observe(self, handler, *args, **kwargs):
    if "Slider" in type(self).__name__ and not handler.__module__.startswith(("ipywidgets", "traitlets")):
        def handler(change):
            raise RuntimeError("slider callback broken on purpose by test_browser.py")
    return _original_observe(self, handler, *args, **kwargs)
ipywidgets.Widget.observe = _broken_observe"""


def test_a_broken_slider_callback_is_caught(lab, page, tmp_path):
    """The check above fails when the explorer's callback is broken (in a sabotaged copy)."""
    check = EXPLORERS[min(EXPLORERS)]
    nb = nbformat.read(lab.root_dir / check.notebook, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(SABOTAGE))
    sabotaged = f"sabotaged-{check.notebook}"
    nbformat.write(nb, lab.root_dir / sabotaged)
    broken = ExplorerCheck(sabotaged, check.slider, check.before, check.after, check.shows)
    with pytest.raises(AssertionError, match="not redrawn"):
        move_slider_and_check(page, lab, broken, tmp_path, update_ms=5_000, saved_first=False)


def test_reading_left_the_chapter_whole(lab, committed, tmp_path):
    """After every explorer notebook was read above (run, a slider moved, a cell run twice,
    saved, autosaved): the committed notebooks are byte for byte as they were, ``zerolib
    notebooks --check`` passes on them, and ``zerolib html`` of the reader's saved copies shows
    no widget repr (a saved copy without its widget state says so)."""
    read = sorted(name for name in EXPLORERS
                  if (lab.root_dir / name).read_bytes() != committed[name])
    if not read:
        pytest.skip("no explorer notebook was read (run with test_explorer_slider_redraws_the_figure)")
    assert {p.name: p.read_bytes() for p in NOTEBOOKS.glob("*.ipynb")} == committed
    script = Path(sys.executable).parent / "zerolib"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "zerolib"]
    result = subprocess.run([*command, "notebooks", "--check", *read], capture_output=True,
                            text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": current") == len(read)
    saved = tmp_path / "saved"           # the reader's saved copies of the notebooks read
    saved.mkdir()
    for name in read:
        shutil.copyfile(lab.root_dir / name, saved / name)
    out = tmp_path / "html"
    result = subprocess.run([*command, "html", "--notebooks", str(saved), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in read:
        page = (out / f"{Path(name).stem}.html").read_text(encoding="utf-8")
        assert "VBox(children" not in page and "Explorer (ipywidgets)" not in page
        assert "Explorer not saved with this notebook." in page


# --- the exported HTML ----------------------------------------------------------------------------

def expected_images(path: Path) -> int:
    """Images a page must show: PNG/JPEG outputs, images referenced in markdown cells, and each
    saved explorer's picture."""
    nb = nbformat.read(path, as_version=4)
    states = widget_states(nb)
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            count += len(re.findall(r"!\[[^\]]*\]\([^)]+\)|<img\s", cell.source))
        elif cell.cell_type == "code":
            count += sum(1 for o in cell.outputs
                         if {"image/png", "image/jpeg"} & set(o.get("data", {})))
            count += sum(1 for o in cell.outputs if WIDGET_VIEW in o.get("data", {})
                         and "<img" in saved_widget_html(states, o["data"][WIDGET_VIEW]["model_id"]))
    return count


@pytest.fixture(scope="module")
def exported(tmp_path_factory, playwright):
    """``zerolib html`` run as a reader would run it, into a temporary folder."""
    out = tmp_path_factory.mktemp("html")
    script = Path(sys.executable).parent / "zerolib"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "zerolib"]
    result = subprocess.run([*command, "html", "--notebooks", str(NOTEBOOKS), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


def offline(route) -> None:
    """Serve only local files: the exported pages must not need the network to show figures."""
    if route.request.url.startswith(("file:", "data:", "blob:")):
        route.continue_()
    else:
        route.abort()


@pytest.mark.parametrize("notebook", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_exported_page_shows_every_figure_and_heading(notebook, exported, page):
    html_page = exported / f"{Path(notebook).stem}.html"
    assert html_page.is_file(), f"zerolib html wrote no {html_page.name}"
    page.route("**/*", offline)
    page.goto(html_page.as_uri(), wait_until="load")
    images = page.eval_on_selector_all(
        "img", "imgs => imgs.map(i => ({src: i.src.slice(0, 60), ok: i.complete && i.naturalWidth > 0}))")
    broken = [image["src"] for image in images if not image["ok"]]
    assert not broken, f"{html_page.name}: images that did not load: {broken}"
    # Offline the widget renderer cannot load, so every <img> is a recorded figure, a markdown
    # image or a saved explorer's picture.
    assert len(images) == expected_images(NOTEBOOKS / notebook), (
        f"{html_page.name} shows {len(images)} images, the notebook has "
        f"{expected_images(NOTEBOOKS / notebook)}")
    shown = [" ".join(text.replace("¶", "").split())
             for text in page.locator("h1, h2, h3, h4, h5, h6").all_inner_texts()]
    wanted = list(markdown_headings(nbformat.read(NOTEBOOKS / notebook, as_version=4)))
    assert wanted, f"{notebook} has no headings"
    missing = [heading for heading in wanted if heading not in shown]
    assert not missing, f"{html_page.name} lacks headings {missing}; it shows {shown}"


@pytest.mark.parametrize("notebook", explorer_notebooks())
def test_exported_explorer_is_its_saved_picture_and_note_offline(notebook, exported, page):
    """Where the widget renderer cannot load, an explorer's output is not an empty Out[N]:."""
    page.route("**/*", offline)
    page.goto((exported / f"{Path(notebook).stem}.html").as_uri(), wait_until="load")
    outputs = page.locator(".jp-OutputArea-output:has(script[type='application/vnd.jupyter.widget-view+json'])")
    assert outputs.count() >= 1
    for i in range(outputs.count()):
        output = outputs.nth(i)
        text = normalised_text(output)
        assert "Saved explorer, not live." in text and "Saved settings:" in text, text[:300]
        picture = output.locator(".zerolib-saved-explorer img")
        assert picture.count() == 1
        assert picture.evaluate("i => i.complete && i.naturalWidth > 0")
        assert output.locator("input, select, button").count() == 0     # nothing that looks live
        assert "VBox(" not in text
    # The saved explorer in the chapter's font: that of its markdown text, not the browser's serif.
    fonts = page.evaluate("""() => [document.querySelector('.jp-RenderedMarkdown p'),
                                    document.querySelector('.zerolib-saved-explorer')]
                                   .map(el => getComputedStyle(el).fontFamily)""")
    assert fonts[0] == fonts[1], fonts
    output = outputs.first
    output.scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    output.screenshot(path=str(SCREENSHOTS / f"static-{Path(notebook).stem}.png"))


WIDGET_JS_HINT = ("set ZEROLIB_WIDGET_JS to a folder filled as the README's static-copy section "
                  "says (npm install requirejs @jupyter-widgets/html-manager@1)")


@pytest.fixture(scope="module")
def exported_with_widget_js(tmp_path_factory, playwright):
    """``zerolib html --widget-js DIR``, where DIR is $ZEROLIB_WIDGET_JS (npm's files)."""
    widget_js = os.environ.get("ZEROLIB_WIDGET_JS")
    if not widget_js:
        missing_optional(WIDGET_JS_HINT)
    out = tmp_path_factory.mktemp("html-widget-js")
    script = Path(sys.executable).parent / "zerolib"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "zerolib"]
    result = subprocess.run([*command, "html", "--notebooks", str(NOTEBOOKS), "--out", str(out),
                             "--widget-js", widget_js], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("notebook", explorer_notebooks())
def test_rendered_saved_widgets_are_disabled_and_say_so(notebook, exported_with_widget_js, page):
    """With the widget renderer, an explorer's controls show their setting greyed out, the note
    says the page is not live, and the plain copy's figure and tables step aside."""
    page.route("**/*", offline)
    page.goto((exported_with_widget_js / f"{Path(notebook).stem}.html").as_uri(), wait_until="load")
    output = page.locator(".jp-OutputArea-output:has(.zerolib-saved-explorer)").first
    output.locator(".widget-subarea img.widget-image").wait_for(timeout=WIDGET_UPDATE_MS)
    live = output.locator(".widget-subarea").locator("input:enabled, select:enabled, button:enabled")
    assert output.locator(".widget-subarea").locator("input, select, button").count() > 0
    assert live.count() == 0, f"{live.count()} controls look live"
    assert output.locator(".zerolib-saved-note").is_visible()
    assert not output.locator(".zerolib-saved-body").is_visible()
    output.scroll_into_view_if_needed()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    output.screenshot(path=str(SCREENSHOTS / f"static-widget-js-{Path(notebook).stem}.png"))
    assert not page.page_errors, f"JavaScript errors: {page.page_errors}"


def test_exported_index_links_every_page(exported, page):
    page.route("**/*", offline)
    page.goto((exported / "index.html").as_uri())
    links = page.eval_on_selector_all("a", "links => links.map(a => a.getAttribute('href'))")
    assert links == [f"{p.stem}.html" for p in sorted(NOTEBOOKS.glob("*.ipynb"))]
