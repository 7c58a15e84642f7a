"""Every explorer as JupyterLab in Chromium draws it: a finished layout, measured from the page.

One throw-away notebook builds each chapter explorer exactly as its notebook does (the call is
read from the notebook), JupyterLab runs it, and Playwright measures every explorer:

- every dropdown shows a chosen entry (ipywidgets shows a blank one for a None value);
- every label sits on its control's line, left of it, whole (nothing cut to "every..."), and
  no two labels or controls overlap;
- every slider's track is long enough to set a value, every dropdown wide enough for its text;
- a multiple selection shows every selected entry without scrolling;
- table cells have padding, numbers are right-aligned, short cells ("too big", "221 s") do
  not wrap, and no table or control runs past the explorer's edge;
- the figure is shown at its own pixel size (its text sizes, checked in the kernel's tests,
  are then the sizes on screen at 100 % zoom);

and a screenshot of each explorer goes to test-output/browser/layout-<notebook>.png.
"""
from __future__ import annotations

import pytest
from browser_support import (
    CALLS,
    INSTALL_PLAYWRIGHT,
    MEASURE,
    chromium,
    explorer_output,
    jupyter_lab,
    layout_problems,
    run_explorers,
    write_layout_notebook,
)
from conftest import REPO, optional_import

pytestmark = pytest.mark.browser

NOTEBOOKS = REPO / "notebooks"
SCREENSHOTS = REPO / "test-output" / "browser"
# --- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def explorers_page(tmp_path_factory, chromium_path):
    """JupyterLab running the layout notebook in Chromium; yields the page, every explorer drawn."""
    sync_api = optional_import("playwright.sync_api", INSTALL_PLAYWRIGHT)
    work = tmp_path_factory.mktemp("layout")
    root = write_layout_notebook(work)
    with sync_api.sync_playwright() as driver, jupyter_lab(root, work) as lab, \
            chromium(driver, work / "profile", chromium_path) as browser:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        run_explorers(page, lab, sync_api.expect)
        page.page_errors = errors
        yield page


# --- tests ----------------------------------------------------------------------------------------

def test_every_explorer_notebook_is_measured():
    shipped = {p.stem for p in NOTEBOOKS.glob("*.ipynb")
               if "Explorer(" in p.read_text(encoding="utf-8")}
    assert shipped and set(CALLS) == shipped


@pytest.mark.parametrize("stem", list(CALLS))
def test_explorer_layout(stem, explorers_page):
    page = explorers_page
    output = explorer_output(page, stem)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    output.screenshot(path=str(SCREENSHOTS / f"layout-{stem}.png"))
    problems = layout_problems(output.evaluate(MEASURE))
    assert not problems, f"{stem}:\n" + "\n".join(problems)
    assert not page.page_errors, f"JavaScript errors: {page.page_errors}"


def test_the_checks_catch_a_broken_layout():
    """The measurements of a layout with every fault the checks look for are all reported."""
    box = {"left": 0, "right": 100, "top": 0, "bottom": 20, "width": 100, "height": 20}
    below = {**box, "top": 30, "bottom": 50}
    faults = {
        "dropdowns": [{"label": "Links", "chosen": "", "width": 200, "needed": 0}],
        "sliders": [{"label": "bytes/param", "track": 20}],
        "labels": [{"text": "every...", "box": box, "clipped": True, "control": None, "button": True},
                   {"text": "Unit", "box": box, "clipped": False, "control": below}],
        "controls": [{"label": "Unit", "box": below},
                     {"label": "Capacity", "box": {**below, "left": 50, "right": 150}}],
        "multiples": [{"label": "Models", "selected": 5, "hidden": ["13B", "30B", "70B"]}],
        "cells": [{"text": "too big", "lines": 2, "align": "left", "header": False, "th": False, "padding": 0},
                  {"text": "1B", "lines": 1, "align": "left", "header": True, "th": False, "padding": 5},
                  {"text": "221 s", "lines": 1, "align": "left", "header": False, "th": False, "padding": 5}],
        "images": [{"shown": 700, "natural": 960}],
        "outside": ["Links"],
    }
    found = "\n".join(layout_problems(faults))
    for words in ("'Links' shows no value", "20 px track", "'every...' is cut off",
                  "'Unit' is not on its control's line", "overlaps", "hides selected",
                  "'too big' has 0 px padding", "'too big' wraps", "'221 s' is not right-aligned",
                  "its text is scaled", "'Links' runs past the explorer's edge"):
        assert words in found, f"not reported: {words}\n{found}"
    assert "'1B'" not in found     # a model's name heading its row is not a number
