"""Export the chapter's notebooks to static HTML pages that read offline.

nbconvert's lab template does the rendering from the recorded outputs (nothing is executed):

- inline PNG figures are embedded as ``data:`` URIs by nbconvert already; images that markdown
  cells reference by path are embedded too (``embed_images``), so the pages need no files beside
  them and the build folder can be copied anywhere;
- links between notebooks (``02-memory-vs-gpu-count.ipynb``) are pointed at the exported pages;
- the random uuid nbconvert gives each widget ``<div>`` is replaced by a counter, so an export of
  the same notebooks gives the same bytes;
- every displayed widget (an explorer) is written out as it was saved, in plain HTML
  (:mod:`zerolib.publish.saved_widgets`), in the chapter's font: a note that it is not live, the
  settings its controls showed, its texts, figure and tables; so a page never shows an empty
  ``Out[N]:``. A widget output whose state the notebook was saved without (JupyterLab saves a
  run's outputs, not its widgets) says so in one line, never the widget tree's repr;
- an ``index.html`` gives the chapter's contents, one line per section: the lines of
  ``00-index``'s "Contents" list where the chapter has one, else each page's first sentence,
  under the list's own part headings (``### Main path``) where it has them, numbered as the list
  numbers them (across the parts; a page in no part, the contents itself, unnumbered).

The pages load require.js and the widget renderer from CDNs by default; ``widget_js`` is a
folder holding ``require.js`` (npm package ``requirejs``) and the files of
``@jupyter-widgets/html-manager``'s ``dist/`` (``embed-amd.js`` and the fonts it loads beside it,
version 1.x for ipywidgets 8), copied next to the pages (``_static/``) and used instead. Where
the renderer loads, it draws the saved widgets with every control disabled (greyed out: they
cannot redraw anything in a static page) and the plain copy keeps only its note.
"""
from __future__ import annotations

import html
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat

from zerolib._io import write_files
from zerolib.paths import NOTEBOOK_DIR
from zerolib.publish.saved_widgets import inert_state, saved_widget_html, widget_states

WIDGET_JS_FILES = ("require.js", "embed-amd.js")
STATIC_DIR = "_static"

# nbconvert's lab template gives each widget view and JavaScript output <div id="{{ uuid4() }}">
# and a script that looks it up with document.getElementById('<that uuid>').
_DIV_UUID = re.compile(
    r"getElementById\('([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})'\)")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
_WIDGET_VIEW = re.compile(
    r'<script type="application/vnd\.jupyter\.widget-view\+json">\s*(\{.*?\})\s*</script>', re.S)
# The plain copy of a saved explorer, and what changes once the widget renderer has drawn the
# live copy beside it (a .widget-subarea in the same output): the copy keeps only its note.
SAVED_CSS = """<style>
.zerolib-saved-explorer {border-left: 3px solid #bbb; padding: 0.2em 0 0.2em 0.8em;
  font-family: var(--jp-content-font-family); font-size: var(--jp-content-font-size1);
  line-height: var(--jp-content-line-height); color: var(--jp-content-font-color1);}
.zerolib-saved-note {color: #444;}
.zerolib-saved-explorer img {max-width: none;}
.zerolib-saved-explorer table {border-collapse: collapse; margin: 0.4em 0 0.8em;}
.zerolib-saved-explorer th, .zerolib-saved-explorer td {padding: 0.2em 0.6em;}
.jp-OutputArea-output:has(> .widget-subarea) .zerolib-saved-body {display: none;}
</style>"""
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$", re.M)
_INLINE = ((re.compile(r"!?\[([^\]]*)\]\([^)]*\)"), r"\1"),   # [text](url) -> text
           (re.compile(r"(\*\*|__|\*|`)"), ""),               # emphasis and code marks
           (re.compile(r"<[^>]+>"), ""))                         # inline HTML tags


@dataclass(frozen=True)
class Page:
    notebook: Path   # the source notebook
    path: Path       # the written HTML page
    title: str       # the notebook's first heading (or its file name)
    headings: tuple[str, ...]  # every markdown heading, as plain text, in order


def notebooks_to_export(directory: str | Path | None = None) -> list[Path]:
    """Every ``*.ipynb`` in ``directory`` (default: the chapter's ``notebooks/``), sorted by name."""
    directory = Path(directory) if directory is not None else NOTEBOOK_DIR
    if not directory.is_dir():
        raise ValueError(f"notebooks must be a folder of .ipynb files, got {str(directory)!r}")
    notebooks = sorted(directory.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"notebooks folder {str(directory)!r} holds no .ipynb files")
    return notebooks


def markdown_headings(nb: nbformat.NotebookNode) -> tuple[str, ...]:
    """The plain text of every ATX heading (``# Title``) in the markdown cells, in order."""
    headings = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        # Fenced code blocks hold comments that look like headings; skip them.
        text = re.sub(r"^```.*?^```", "", cell.source, flags=re.M | re.S)
        headings.extend(plain_text(match.group(2)) for match in _HEADING.finditer(text))
    return tuple(headings)


def plain_text(markdown: str) -> str:
    """A heading's text as a browser shows it: links, emphasis and code marks removed."""
    for pattern, replacement in _INLINE:
        markdown = pattern.sub(replacement, markdown)
    return html.unescape(" ".join(markdown.split()))


def _exporter(require_js_url: str | None, widget_renderer_url: str | None):
    from nbconvert import HTMLExporter  # imported here: nbconvert is slow to import

    urls = {"require_js_url": require_js_url, "widget_renderer_url": widget_renderer_url}
    return HTMLExporter(embed_images=True, **{k: v for k, v in urls.items() if v})


def _stable_div_ids(page: str) -> str:
    """Replace nbconvert's random div ids with ``output-1``, ``output-2``, ... in page order."""
    for number, div_id in enumerate(dict.fromkeys(_DIV_UUID.findall(page)), start=1):
        page = page.replace(div_id, f"output-{number}")
    return page


def _link_pages(page: str, stems: set[str]) -> str:
    """Point links to the chapter's notebooks (``x.ipynb``, ``./x.ipynb#part``) at their pages."""
    def swap(match: re.Match) -> str:
        stem = match.group(2)
        return f'href="{stem}.html{match.group(3) or ""}"' if stem in stems else match.group(0)
    return re.sub(r'href="(\./)?([^"/#?]+)\.ipynb(#[^"]*)?"', swap, page)


UNSAVED_NOTE = ("<p class='zerolib-saved-note'><b>Explorer not saved with this notebook.</b> The "
                "notebook was saved after a run without its widget state (JupyterLab saves a "
                "run's outputs, not the widgets they show), so this page cannot show the "
                "explorer; <code>zerolib notebooks</code> re-executes a notebook with its widget "
                "state.</p>")


def without_unsaved_views(nb: nbformat.NotebookNode, states: dict) -> nbformat.NotebookNode:
    """``nb`` (in place) with each widget output whose model is not in the saved state
    replaced by :data:`UNSAVED_NOTE` (nbconvert would show its ``text/plain`` repr)."""
    for cell in nb.cells:
        for output in cell.get("outputs", ()):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view is not None and view.get("model_id") not in states:
                output["data"] = nbformat.from_dict({"text/html": UNSAVED_NOTE,
                                                     "text/plain": "Explorer not saved with this notebook."})
    return nb


def _with_saved_widgets(page: str, states: dict) -> str:
    """Put each displayed widget's plain copy before its view (the renderer draws there)."""
    import json

    def insert(match: re.Match) -> str:
        try:
            model_id = json.loads(match.group(1)).get("model_id", "")
        except ValueError:
            return match.group(0)
        return saved_widget_html(states, model_id) + "\n" + match.group(0)
    page, count = _WIDGET_VIEW.subn(insert, page)
    return page.replace("</head>", SAVED_CSS + "\n</head>", 1) if count else page


_CONTENTS_ITEM = re.compile(r"^\s*\d+\.\s+\[([^\]]+)\]\((?:\./)?([^)#/]+)\.ipynb[^)]*\)\s*:?\s*(.*)$")
_SENTENCE = re.compile(r"^(.+?[.!?])(\s|$)", re.S)


def _contents_items(nb: nbformat.NotebookNode):
    """(part, match) for each item of an index notebook's "Contents" list, in order: the part is
    the plain text of the sub-heading (``### Main path``) the item sits under, or ""."""
    for cell in nb.cells:
        if cell.cell_type != "markdown" or not re.search(r"^#+\s+Contents\s*$", cell.source, re.M):
            continue
        items, current, part = [], None, ""
        for line in cell.source.split("\n"):
            heading = _HEADING.match(line)
            if heading:                         # below the Contents heading: a part of the list
                part = plain_text(heading.group(2)) if len(heading.group(1)) > 2 else ""
                current = None
            elif re.match(r"^\s*\d+\.\s", line):
                current = [line]
                items.append((part, current))
            elif current is not None and line.strip() and line.startswith((" ", "\t")):
                current.append(line.strip())    # an item's continuation lines
            else:
                current = None
        for part, item in items:
            match = _CONTENTS_ITEM.match(" ".join(item))
            if match:
                yield part, match


def contents_lines(nb: nbformat.NotebookNode) -> dict[str, tuple[str, str]]:
    """An index notebook's "Contents" list: notebook stem -> (its title there, its line)."""
    return {match.group(2): (plain_text(match.group(1)), plain_text(match.group(3)))
            for _, match in _contents_items(nb)}


def contents_parts(nb: nbformat.NotebookNode) -> dict[str, str]:
    """An index notebook's "Contents" list: notebook stem -> the part it is listed under ("" for
    none)."""
    return {match.group(2): part for part, match in _contents_items(nb)}


def first_sentence(nb: nbformat.NotebookNode) -> str:
    """The first sentence of a notebook's first paragraph that is not a heading."""
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for paragraph in re.split(r"\n\s*\n", cell.source):
            if paragraph.strip() and not _HEADING.match(paragraph.strip().split("\n")[0]):
                text = plain_text(paragraph)
                match = _SENTENCE.match(text)
                return match.group(1) if match else text
    return ""


def _index_page(pages: list[Page], contents: dict[str, tuple[str, str]], title: str,
                parts: dict[str, str] | None = None) -> str:
    """The chapter's contents: one line per section, its title linking to its page, each under
    its part's heading (pages in no part first, in a list of their own)."""
    parts = parts or {}
    groups: dict[str, list[str]] = {}
    for p in sorted(pages, key=lambda p: bool(parts.get(p.notebook.stem))):
        name, line = contents.get(p.notebook.stem, (p.title, ""))
        if not line:
            line = first_sentence(nbformat.read(p.notebook, as_version=4))
        groups.setdefault(parts.get(p.notebook.stem, ""), []).append(
            f'<li><a href="{html.escape(p.path.name)}">{html.escape(name)}</a>'
            + (f": {html.escape(line)}" if line else "") + "</li>")
    lists, number = [], 1
    for part, items in groups.items():
        if part:                                # numbered on from the part before, as in 00-index
            lists.append(f"<h3>{html.escape(part)}</h3>\n<ol start=\"{number}\">\n" + "\n".join(items)
                         + "\n</ol>")
            number += len(items)
        elif len(groups) > 1:                   # beside numbered parts (the contents page): no number
            lists.append("<ul>\n" + "\n".join(items) + "\n</ul>")
        else:
            lists.append("<ol>\n" + "\n".join(items) + "\n</ol>")
    body = "\n".join(lists)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\" />\n"
            f"<title>{html.escape(title)}</title>\n"
            "<style>body {max-width: 50em; margin: 2em auto; padding: 0 1em; font-family: sans-serif;"
            " line-height: 1.5;} li {margin-bottom: 0.6em;}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n<h2>Contents</h2>\n{body}\n</body>\n</html>\n")


INDEX_NOTEBOOK = "00-index"
DEFAULT_TITLE = "ZeRO memory chapter"


def export_chapter(out_dir: str | Path, notebook_dir: str | Path | None = None,
                   widget_js: str | Path | None = None) -> list[Page]:
    """Write one HTML page per notebook plus ``index.html`` into ``out_dir``; return the pages."""
    notebooks = notebooks_to_export(notebook_dir)
    out_dir = Path(out_dir)
    require_js_url = widget_renderer_url = None
    if widget_js is not None:
        widget_js = Path(widget_js)
        missing = [name for name in WIDGET_JS_FILES if not (widget_js / name).is_file()]
        if missing:
            raise ValueError(f"widget_js must be a folder holding {' and '.join(WIDGET_JS_FILES)}; "
                             f"{str(widget_js)!r} lacks {', '.join(missing)}")
        static = out_dir / STATIC_DIR
        static.mkdir(parents=True, exist_ok=True)
        for source in sorted(widget_js.iterdir()):
            if source.is_file() and source.suffix != ".map":  # source maps are for debugging
                shutil.copyfile(source, static / source.name)
        require_js_url = f"{STATIC_DIR}/require.js"
        widget_renderer_url = f"{STATIC_DIR}/embed-amd.js"
    exporter = _exporter(require_js_url, widget_renderer_url)
    stems = {path.stem for path in notebooks}
    pages, files = [], {}
    for notebook in notebooks:
        nb = nbformat.read(notebook, as_version=4)
        body, _ = exporter.from_notebook_node(
            without_unsaved_views(inert_state(nb), widget_states(nb)),
            resources={"metadata": {"name": notebook.stem, "path": str(notebook.parent)}})
        page = Path(out_dir) / f"{notebook.stem}.html"
        body = _with_saved_widgets(_stable_div_ids(body), widget_states(nb))
        files[page] = _link_pages(body, stems)
        headings = markdown_headings(nb)
        pages.append(Page(notebook, page, headings[0] if headings else notebook.stem, headings))
    index = next((p for p in pages if p.notebook.stem == INDEX_NOTEBOOK), None)
    index_nb = nbformat.read(index.notebook, as_version=4) if index else None
    contents = contents_lines(index_nb) if index else {}
    parts = contents_parts(index_nb) if index else {}
    if index is not None:
        contents.setdefault(INDEX_NOTEBOOK, ("Contents", "this list, with how to run the notebooks"))
    files[out_dir / "index.html"] = _index_page(pages, contents,
                                                index.title if index else DEFAULT_TITLE, parts)
    write_files(files, only_changed=False)
    return pages
