"""Reading the chapter in JupyterLab leaves the repository clean: real JupyterLab, real headless
Chromium, autosave every 2 s.

- The committed notebook is opened and left open past several autosaves: JupyterLab never marks
  it modified, and an explicit save writes the committed bytes back (``git diff`` is empty).
- The same notebook with the metadata it was committed with before (kernel display name
  "python3", widget-state whole numbers as 12.0) is rewritten by autosave at once; the checks see
  nothing of substance changed, and the bytes JupyterLab wrote are exactly what
  ``zerolib.publish.notebooks`` now commits.

Skips with an install hint without Chromium or Playwright (fails under ZEROLIB_REQUIRE_OPTIONAL=1).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import nbformat
import pytest
from browser_support import KERNEL_IDLE_MS, chromium, jupyter_lab
from conftest import REPO

from zerolib.publish import notebooks

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "02-memory-vs-gpu-count.ipynb"     # widgets with FloatSliders: whole floats in its state
AS_BEFORE = "02-as-committed-before.ipynb"
AUTOSAVE_SECONDS = 2
SAVE_WAIT_SECONDS = 60


def as_committed_before(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with the metadata the notebooks had before: display name "python3" and the float
    sliders' numbers as Python floats (32.0, 0.0, 2.0)."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    nb.metadata["kernelspec"]["display_name"] = "python3"
    for model in nb.metadata["widgets"][notebooks.WIDGET_STATE]["state"].values():
        if model["model_name"] == "FloatSliderModel":
            for key in ("max", "min", "value"):
                model["state"][key] = float(model["state"][key])
    return nb


def _git(root, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, check=True)


@pytest.fixture(scope="module")
def reading(tmp_path_factory, chromium_path, playwright):
    """A git repository of the committed notebook and its as-before copy, served by JupyterLab
    with a 2 s autosave, and a browser."""
    work = tmp_path_factory.mktemp("autosave")
    root = work / "notebooks"
    root.mkdir()
    shutil.copy(REPO / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    before = as_committed_before(nbformat.read(root / NOTEBOOK, as_version=4))
    (root / AS_BEFORE).write_bytes(notebooks.notebook_bytes(before))
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=test", "-c", "user.email=test@localhost", "commit", "-qm", "notebooks")
    settings = work / "jupyter" / "config" / "lab" / "user-settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosaveInterval": AUTOSAVE_SECONDS}))
    with jupyter_lab(root, work) as lab, chromium(playwright, work / "profile", chromium_path) as browser:
        yield lab, browser, root


def _open(browser, lab, name):
    from playwright.sync_api import expect

    page = browser.new_page()
    page.goto(lab.notebook_url(name))
    expect(page.locator(".jp-StatusBar-Widget")).to_contain_text("| Idle", timeout=KERNEL_IDLE_MS)
    return page


def _wait_for_change(path, old: bytes) -> bytes:
    deadline = time.monotonic() + SAVE_WAIT_SECONDS
    while time.monotonic() < deadline:
        data = path.read_bytes()
        if data != old:
            time.sleep(0.5)       # the server writes atomically; let a second save settle too
            return path.read_bytes()
        time.sleep(0.25)
    pytest.fail(f"{path.name} was not saved within {SAVE_WAIT_SECONDS} s")


def test_opening_the_committed_notebook_leaves_it_as_committed(reading):
    lab, browser, root = reading
    path = root / NOTEBOOK
    committed = path.read_bytes()
    page = _open(browser, lab, NOTEBOOK)
    try:
        time.sleep(4 * AUTOSAVE_SECONDS)
        tab = page.locator(".lm-TabBar-tab", has_text=NOTEBOOK)
        assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), "JupyterLab marked it modified"
        assert path.read_bytes() == committed
        # An explicit save writes the notebook back: the same bytes.
        mtime = path.stat().st_mtime_ns
        page.locator(".jp-NotebookPanel").first.click()
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + SAVE_WAIT_SECONDS
        while path.stat().st_mtime_ns == mtime and time.monotonic() < deadline:
            time.sleep(0.25)
        assert path.stat().st_mtime_ns != mtime, "Ctrl+S did not save"
        time.sleep(0.5)
    finally:
        page.close()
    assert path.read_bytes() == committed
    assert _git(root, "status", "--porcelain", "--", NOTEBOOK).stdout == ""


def test_autosave_of_older_metadata_changes_nothing_of_substance(reading):
    lab, browser, root = reading
    path = root / AS_BEFORE
    before = path.read_bytes()
    page = _open(browser, lab, AS_BEFORE)
    try:
        saved = _wait_for_change(path, before)
    finally:
        page.close()
    # The checks compare substance: the autosave is not staleness.
    assert notebooks.same_substance(before, saved)
    nb = nbformat.reads(saved.decode(), as_version=4)
    nbformat.validate(nb)
    assert (nb.metadata["kernelspec"]["name"], nb.metadata["kernelspec"]["language"]) == ("python3", "python")
    # What JupyterLab wrote is, byte for byte, what the project now commits.
    assert saved == (REPO / "notebooks" / NOTEBOOK).read_bytes()
    assert saved == notebooks.notebook_bytes(notebooks.as_jupyterlab_saves(nbformat.reads(before.decode(),
                                                                                    as_version=4)))
