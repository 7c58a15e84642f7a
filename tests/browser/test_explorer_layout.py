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

import re

import pytest
from browser_support import (
    CALLS,
    INSTALL_PLAYWRIGHT,
    chromium,
    explorer_output,
    jupyter_lab,
    run_explorers,
    write_layout_notebook,
)
from conftest import REPO, optional_import

pytestmark = pytest.mark.browser

NOTEBOOKS = REPO / "notebooks"
SCREENSHOTS = REPO / "test-output" / "browser"
SLIDER_TRACK_PX = 150     # shortest slider track on which one step is a visible move
PADDING_PX = 4            # least horizontal padding of a table cell
SHORT_CELL = 24           # data cells of at most this many characters stay on one line
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


# Measured inside the page: everything the checks below read, as plain data.
MEASURE = """(root) => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width, height: r.height}; };
  const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const text = (el) => (el.innerText || el.textContent || '').replace(/\\s+/g, ' ').trim();
  const lines = (el) => { const range = document.createRange(); range.selectNodeContents(el);
    const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
    return tops.size; };
  const canvas = document.createElement('canvas').getContext('2d');
  const textWidth = (el, t) => { const s = getComputedStyle(el);
    canvas.font = `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`; return canvas.measureText(t).width; };
  const out = {labels: [], controls: [], dropdowns: [], sliders: [], multiples: [], cells: [], images: [],
               frame: box(root), outside: []};
  for (const widget of root.querySelectorAll('.widget-inline-hbox, .widget-toggle-buttons, .widget-checkbox')) {
    if (!visible(widget)) continue;
    const label = widget.querySelector(':scope > .widget-label');
    const parts = [...widget.children].filter(
      c => c !== label && visible(c) && !c.classList.contains('widget-readout'));
    if (label && visible(label) && text(label)) {
      out.labels.push({text: text(label), box: box(label), clipped: label.scrollWidth > label.clientWidth + 1,
                       control: parts.length ? box(parts[0]) : null});
    }
    for (const part of parts) out.controls.push({label: label ? text(label) : '', box: box(part)});
    const edge = box(widget);
    if (edge.right > out.frame.right + 0.5 || edge.left < out.frame.left - 0.5)
      out.outside.push(label ? text(label) : text(widget));
  }
  for (const button of root.querySelectorAll('.widget-toggle-button, button.widget-button')) {
    if (!visible(button)) continue;
    out.labels.push({text: text(button), box: box(button), clipped: button.scrollWidth > button.clientWidth + 1,
                     control: null, button: true});
  }
  for (const select of root.querySelectorAll('.widget-dropdown select')) {
    const chosen = select.selectedIndex >= 0 ? select.options[select.selectedIndex].text : '';
    out.dropdowns.push({label: text(select.closest('.widget-dropdown').querySelector('.widget-label') || select),
                        chosen, width: select.clientWidth, needed: chosen ? textWidth(select, chosen) + 24 : 0});
  }
  for (const slider of root.querySelectorAll('.widget-slider')) {
    const track = slider.querySelector('.slider-container') || slider.querySelector('.slider');
    out.sliders.push({label: text(slider.querySelector('.widget-label') || slider),
                      track: track ? box(track).width : 0});
  }
  for (const select of root.querySelectorAll('.widget-select-multiple select')) {
    const frame = box(select);
    const hidden = [...select.selectedOptions].filter(o => { const r = o.getBoundingClientRect();
      return r.height === 0 || r.top < frame.top - 1 || r.bottom > frame.bottom + 1; }).map(o => o.text);
    out.multiples.push({label: text(select.closest('.widget-select-multiple').querySelector('.widget-label') || select),
                        selected: select.selectedOptions.length, hidden});
  }
  for (const cell of root.querySelectorAll('table td, table th')) {
    const s = getComputedStyle(cell);
    out.cells.push({text: text(cell), lines: lines(cell), align: s.textAlign, th: cell.tagName === 'TH',
                    header: cell.tagName === 'TH' || cell.cellIndex === 0,
                    padding: Math.min(parseFloat(s.paddingLeft), parseFloat(s.paddingRight))});
  }
  for (const table of root.querySelectorAll('table')) {
    if (box(table).right > out.frame.right + 0.5)
      out.outside.push(`table ${text(table.caption || table).slice(0, 40)}`);
  }
  for (const img of root.querySelectorAll('img.widget-image')) {
    out.images.push({shown: img.getBoundingClientRect().width, natural: img.naturalWidth});
    if (box(img).right > out.frame.right + 0.5) out.outside.push('the figure');
  }
  return out;
}"""


def overlaps(a: dict, b: dict, slack: float = 0.5) -> bool:
    return (a["left"] < b["right"] - slack and b["left"] < a["right"] - slack
            and a["top"] < b["bottom"] - slack and b["top"] < a["bottom"] - slack)


NUMBER = re.compile(r"^[<>≈~]?\s*[\d,.]+%?( ?(GB|GiB|TB|s|ms|TiB|B|M|T))?( \(.*\))?$")


def layout_problems(m: dict) -> list[str]:
    """Everything wrong with one explorer's measurements, in words."""
    problems = []
    for d in m["dropdowns"]:
        if not d["chosen"]:
            problems.append(f"dropdown {d['label']!r} shows no value")
        elif d["width"] < d["needed"]:
            problems.append(f"dropdown {d['label']!r} is {d['width']:.0f} px wide, its value "
                            f"{d['chosen']!r} needs {d['needed']:.0f} px")
    for s in m["sliders"]:
        if s["track"] < SLIDER_TRACK_PX:
            problems.append(f"slider {s['label']!r} has a {s['track']:.0f} px track "
                            f"(at least {SLIDER_TRACK_PX} px)")
    for label in m["labels"]:
        if label["clipped"]:
            problems.append(f"label {label['text']!r} is cut off")
        control = label["control"]
        if control is not None:
            b = label["box"]
            if not (b["top"] < control["bottom"] and control["top"] < b["bottom"]):
                problems.append(f"label {label['text']!r} is not on its control's line")
            elif b["right"] > control["left"] + 0.5:
                problems.append(f"label {label['text']!r} runs into its control")
    boxes = [(f"label {x['text']!r}", x["box"]) for x in m["labels"] if not x.get("button")]
    boxes += [(f"control of {x['label']!r}", x["box"]) for x in m["controls"]]
    for i, (name_a, a) in enumerate(boxes):
        for name_b, b in boxes[i + 1:]:
            if overlaps(a, b) and not (a["left"] <= b["left"] and b["right"] <= a["right"]
                                       and a["top"] <= b["top"] and b["bottom"] <= a["bottom"]):
                problems.append(f"{name_a} overlaps {name_b}")
    for name in m["outside"]:
        problems.append(f"{name!r} runs past the explorer's edge")
    for s in m["multiples"]:
        if s["hidden"]:
            problems.append(f"list {s['label']!r} hides selected {s['hidden']} of {s['selected']}")
    for cell in m["cells"]:
        if cell["padding"] < PADDING_PX:
            problems.append(f"table cell {cell['text']!r} has {cell['padding']:.0f} px padding")
        if not cell["th"] and cell["text"] and len(cell["text"]) <= SHORT_CELL and cell["lines"] > 1:
            problems.append(f"table cell {cell['text']!r} wraps")
        if not cell["header"] and NUMBER.match(cell["text"]) and cell["align"] not in ("right", "end"):
            problems.append(f"number {cell['text']!r} is not right-aligned")
    for image in m["images"]:
        if abs(image["shown"] - image["natural"]) > 1:
            problems.append(f"the figure is shown {image['shown']:.0f} px wide, it is drawn "
                            f"{image['natural']} px wide: its text is scaled")
    return list(dict.fromkeys(problems))


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
