"""The chapter's shape: three parts in zerolib.paths' order, a main path read in one sitting, and
every notebook opened and closed the same way, saying each thing once.

Every check that reads one notebook is parametrised by its stem, so that one notebook's shape can
be checked while the others are still being written.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from zerolib.chapter.explorers.panel import LIVE_NOTE, SAVED_NOTE
from zerolib.paths import APPENDIX, CHAPTER, GOING_FURTHER, INDEX, MAIN_PATH

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
SECTIONS = CHAPTER[1:]

# Prose words of each main-path notebook (whitespace-separated tokens of its markdown cells): the
# main path is read in about an hour.
BUDGETS = {"01-bytes-per-parameter": 830, "02-memory-vs-gpu-count": 780,
           "03-memory-vs-model-size": 780, "04-will-it-fit": 1760, "05-the-price-of-zero": 1780,
           "06-when-zero-is-not-enough": 1230}
MAIN_PATH_WORDS = sum(BUDGETS.values())
# Reading time: 200 words a minute plus a minute per figure and per table. The main path is read
# in an hour (80.3 minutes before depth moved to the optional notebooks and the appendix).
WORDS_PER_MINUTE = 200
MAIN_PATH_MINUTES = 60
MARKDOWN_TABLE_RULE = re.compile(r"^\|[-: |]+\|$", re.M)
PARTS = {"Main path": MAIN_PATH, "Going further": GOING_FURTHER, "Appendix": APPENDIX}

# The full citation names the paper's title; elsewhere the chapter says "the ZeRO paper".
ZERO_TITLE = "Memory Optimizations Toward Training Trillion Parameter Models"
CITED_IN_FULL = {INDEX, "01-bytes-per-parameter"}
# The collectives and their words, defined in bold in 05's "The words" only.
DEFINER = "05-the-price-of-zero"
TERMS = {"all-gather": r"all-gathers?", "reduce-scatter": r"reduce-scatters?",
         "all-reduce": r"all-reduces?", "bucket": r"buckets?", "prefetch": r"prefetch\w*",
         "overlap": r"overlap\w*"}
# The live-widget disclaimer: the index's one note and each saved explorer's SAVED_NOTE say it.
DISCLAIMER = re.compile(r"(controls|sliders)[^.]{0,60}\bmove nothing|needs? a running kernel|"
                        r"shows? no widgets|look live|in a static copy", re.I)
# The last notebook's Next is the contents itself, so its line has no third link.
NAV = re.compile(r"^Previous: \[[^\]]+\]\(([\w-]+)\.ipynb\) · Next: \[[^\]]+\]\(([\w-]+)\.ipynb\)"
                 r"( · \[Contents\]\(00-index\.ipynb\))?$")
ABBREVIATION = re.compile(r"\b(e\.g|i\.e|vs|Sec|et al|cf|etc|approx|Fig|Eq)\.", re.I)


def notebook(name: str) -> nbformat.NotebookNode:
    path = NOTEBOOKS / f"{name}.ipynb"
    if not path.is_file():
        pytest.fail(f"notebooks/{name}.ipynb does not exist yet")
    return nbformat.read(path, as_version=4)


def markdown_cells(name: str) -> list[nbformat.NotebookNode]:
    return [cell for cell in notebook(name).cells if cell.cell_type == "markdown"]


def prose_words(name: str) -> int:
    return sum(len(cell.source.split()) for cell in markdown_cells(name))


def bullets(text: str) -> list[str]:
    """The top-level items of the first markdown list in ``text``, each joined onto one line."""
    items, current = [], None
    for line in text.split("\n"):
        if re.match(r"^[-*] ", line):
            current = [line[2:].strip()]
            items.append(current)
        elif current is not None and line.startswith((" ", "\t")) and line.strip():
            current.append(line.strip())
        elif items and line.strip():
            break
    return [" ".join(item) for item in items]


def sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9*\[(`Ψ])", " ".join(text.split())) if s.strip()]


# --- the files ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", CHAPTER)
def test_every_chapter_notebook_exists(name):
    assert (NOTEBOOKS / f"{name}.ipynb").is_file(), f"notebooks/{name}.ipynb is missing"


def test_no_other_notebook_in_the_chapter_folder():
    others = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if p.stem not in CHAPTER)
    assert not others, f"not in zerolib.paths.CHAPTER: {others}"


# --- the main path in one sitting --------------------------------------------------------------

def test_the_budgets_fit_the_main_path():
    assert list(BUDGETS) == list(MAIN_PATH) and sum(BUDGETS.values()) <= MAIN_PATH_WORDS


def test_the_main_path_is_read_in_one_sitting():
    words = {name: prose_words(name) for name in MAIN_PATH}
    assert sum(words.values()) <= MAIN_PATH_WORDS, f"{sum(words.values())} words of prose: {words}"


def reading_minutes(name: str) -> float:
    """Minutes to read ``name``: its prose at 200 words a minute, plus one per figure (an image
    output) and per table (an HTML table output or a markdown table)."""
    figures = tables = 0
    for cell in notebook(name).cells:
        if cell.cell_type == "markdown":
            tables += len(MARKDOWN_TABLE_RULE.findall(cell.source))
        for output in cell.get("outputs", ()):
            data = output.get("data", {})
            if "image/png" in data:
                figures += 1
            elif "<table" in data.get("text/html", ""):
                tables += 1
    return prose_words(name) / WORDS_PER_MINUTE + figures + tables


def test_reading_minutes_counts_by_hand():
    # 01, read by eye: one figure (who holds what; the shard explorer is a widget, not an image
    # output), one printed table (the layout's parts; zerolib's worksheet prints a dict), no
    # markdown table.
    assert reading_minutes("01-bytes-per-parameter") == prose_words("01-bytes-per-parameter") / 200 + 2
    # 05: three figures (a layer's shards through a step, the timeline, memory against step
    # time) and two tables (the engines, the frameworks).
    assert reading_minutes("05-the-price-of-zero") == prose_words("05-the-price-of-zero") / 200 + 5


def test_the_main_path_reads_within_its_minutes():
    minutes = {name: round(reading_minutes(name), 1) for name in MAIN_PATH}
    assert sum(minutes.values()) <= MAIN_PATH_MINUTES, f"{sum(minutes.values()):.1f} minutes: {minutes}"


@pytest.mark.parametrize("name", MAIN_PATH)
def test_each_main_path_notebook_keeps_its_budget(name):
    words = prose_words(name)
    assert words <= BUDGETS[name], f"{name}: {words} words of prose, budget {BUDGETS[name]}"


# --- the index ---------------------------------------------------------------------------------

def test_the_index_lists_the_three_parts_with_one_line_per_notebook():
    (cell,) = [cell.source for cell in markdown_cells(INDEX) if re.search(r"^## Contents\s*$", cell.source, re.M)]
    contents = re.split(r"^## (?!Contents).*$", cell.split("## Contents", 1)[1], flags=re.M)[0]
    parts = [m.group(1) for m in re.finditer(r"^### (Main path|Going further|Appendix)\b", contents, re.M)]
    assert parts == list(PARTS), f"the contents' parts are {parts}"
    chunks = re.split(r"^### .*$", contents, flags=re.M)[1:]
    number = 0
    for (part, stems), chunk in zip(PARTS.items(), chunks):
        lines = [line for line in chunk.split("\n") if line.strip()]
        assert not any(line[0].isspace() for line in lines), f"{part}: an item runs over two lines"
        listed = []
        for line in (line for line in lines if ".ipynb)" in line or re.match(r"\d+\. ", line)):
            match = re.match(r"^(\d+)\. \[[^\]]+\]\(([\w-]+)\.ipynb\): \S", line)
            assert match, f"{part}: not one line per notebook: {line!r}"
            number += 1
            assert int(match.group(1)) == number, f"{part}: numbered {match.group(1)}, expected {number}"
            listed.append(match.group(2))
        assert listed == list(stems), f"{part} lists {listed}"


def test_the_index_says_how_long_the_main_path_takes():
    text = " ".join(" ".join(cell.source.split()) for cell in markdown_cells(INDEX))
    assert re.search(r"### Main path \(about an hour\)|main path takes about an hour", text), text[:300]


def test_the_index_holds_the_one_note_about_live_widgets():
    notes = [cell.id for cell in markdown_cells(INDEX) if DISCLAIMER.search(cell.source)]
    assert len(notes) == 1, f"the widget note is in the index's cells {notes}"


# --- every notebook opens and closes the same way ----------------------------------------------

def expected_title(name: str) -> str:
    if name in APPENDIX:
        return f"# Appendix {'AB'[APPENDIX.index(name)]} · "
    return f"# {int(name.split('-')[0])} · "


@pytest.mark.parametrize("name", SECTIONS)
def test_each_notebook_opens_with_what_you_will_learn(name):
    first = notebook(name).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(expected_title(name)), (
        f"{name}: its first cell is not titled {expected_title(name)!r}...")
    head, found, rest = first.source.partition("**What you will learn**")
    assert found and head.strip().count("\n") >= 1, f"{name}: no opening, then **What you will learn**"
    learned = bullets(rest)
    assert 3 <= len(learned) <= 5, f"{name}: {len(learned)} bullets under What you will learn"


@pytest.mark.parametrize("name", SECTIONS)
def test_each_notebook_closes_with_a_short_summary_and_its_neighbours(name):
    last = markdown_cells(name)[-1].source.strip()
    assert last.startswith("## Summary\n"), f"{name}: the last markdown cell is not ## Summary"
    # The navigation is the last paragraph, wrapped or not.
    body, _, nav = last.removeprefix("## Summary\n").rpartition("\n\n")
    nav = " ".join(nav.split())
    index = CHAPTER.index(name)
    following = CHAPTER[index + 1] if index + 1 < len(CHAPTER) else INDEX
    match = NAV.match(nav.strip())
    assert match, f"{name}: the last line is not Previous · Next · Contents: {nav!r}"
    assert match.groups()[:2] == (CHAPTER[index - 1], following), f"{name}: links {match.groups()}"
    assert match.group(3) or following == INDEX, f"{name}: no link to the contents: {nav!r}"
    assert not ABBREVIATION.search(body), f"{name}: an abbreviation in the summary: {body[:200]}"
    listed = bullets(body)
    count = len(listed) if listed else len(sentences(body))
    if listed:
        assert all(len(sentences(item)) == 1 for item in listed), f"{name}: a bullet of two sentences"
    assert 3 <= count <= 5, f"{name}: the summary has {count} sentences"


# --- say a thing once ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", CHAPTER)
def test_the_full_zero_citation_only_in_the_index_and_01(name):
    text = " ".join(" ".join(cell.source.split()) for cell in markdown_cells(name))
    count = text.count(ZERO_TITLE)
    if name in CITED_IN_FULL:
        assert count == 1, f"{name} cites the ZeRO paper in full {count} times"
    else:
        assert count == 0, f"{name} cites the ZeRO paper in full; write [the ZeRO paper](...)"


@pytest.mark.parametrize("name", CHAPTER)
def test_only_05_defines_the_collectives(name):
    text = " ".join(cell.source for cell in markdown_cells(name))
    defined = [term for term, pattern in TERMS.items()
               if re.search(r"\*\*" + pattern + r"\*\*", text, re.I)]
    if name == DEFINER:
        assert defined == list(TERMS), f"05's The words defines only {defined}"
    else:
        assert not defined, f"{name} defines {defined} in bold; link to {DEFINER}.ipynb#The-words"


@pytest.mark.parametrize("name", SECTIONS)
def test_no_notebook_repeats_the_widget_note(name):
    for cell in markdown_cells(name):
        match = DISCLAIMER.search(cell.source)
        assert not match, f"{name} [{cell.id}] repeats the index's widget note: {match.group(0)!r}"


@pytest.mark.parametrize("name", CHAPTER)
def test_every_saved_explorer_says_it_is_saved_with_its_controls_off(name):
    """The saved state is what JupyterLab draws before the notebook runs (and nbviewer, an
    export): each explorer's note says it is saved, not live; no control looks live."""
    nb = notebook(name)
    views = [o for cell in nb.cells for o in cell.get("outputs", ())
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    if not views:
        return
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    values = [m["state"].get("value") for m in states.values() if m.get("model_name") == "HTMLModel"]
    assert values.count(SAVED_NOTE) >= len(views), (
        f"{name}: {len(views)} explorers, {values.count(SAVED_NOTE)} saved notes")
    assert LIVE_NOTE not in values, f"{name}: a saved explorer says it is live"
    live = [m["model_name"] for m in states.values() if m["state"].get("disabled") is False]
    assert not live, f"{name}: saved controls that look live: {live}"


@pytest.mark.parametrize("name", CHAPTER)
def test_never_fits_is_said_one_way(name):
    for cell in notebook(name).cells:
        if cell.cell_type == "markdown":
            assert "<NA>" not in cell.source, f"{name} [{cell.id}] says <NA>; tables say never"
        for output in cell.get("outputs", ()):
            shown = output.get("data", {}).get("text/plain", "") + output.get("data", {}).get("text/html", "")
            assert "&lt;NA&gt;" not in shown and "<NA>" not in shown, (
                f"{name} [{cell.id}] shows <NA>; show the table through zl.show_never")
