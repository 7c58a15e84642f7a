"""Export the chapter's notebooks to static HTML pages that read offline.

nbconvert's lab template does the rendering from the recorded outputs (nothing is executed):

- inline PNG figures are embedded as ``data:`` URIs by nbconvert already; images that markdown
  cells reference by path are embedded too (``embed_images``), so the pages need no files beside
  them and the build folder can be copied anywhere;
- links between notebooks (``02-memory-vs-gpu-count.ipynb``) are pointed at the exported pages;
- the random uuid nbconvert gives each widget ``<div>`` is replaced by a counter, so an export of
  the same notebooks gives the same bytes;
- an ``index.html`` lists the pages with their titles.

The pages load require.js and the widget renderer from CDNs by default; where those cannot be
reached the static figures and tables still show and only the live widgets stay blank.
``widget_js`` is a folder holding ``require.js`` (npm package ``requirejs``) and the files of
``@jupyter-widgets/html-manager``'s ``dist/`` (``embed-amd.js`` and the fonts it loads beside it,
version 1.x for ipywidgets 8); it is copied next to the pages (``_static/``) and used instead, so
the recorded widget state (the explorers' last image) renders offline too.
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

WIDGET_JS_FILES = ("require.js", "embed-amd.js")
STATIC_DIR = "_static"

# nbconvert's lab template gives each widget view and JavaScript output <div id="{{ uuid4() }}">
# and a script that looks it up with document.getElementById('<that uuid>').
_DIV_UUID = re.compile(
    r"getElementById\('([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})'\)")
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


def _index_page(pages: list[Page]) -> str:
    items = "\n".join(f'<li><a href="{html.escape(p.path.name)}">{html.escape(p.title)}</a></li>'
                      for p in pages)
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\" />\n"
            "<title>ZeRO memory chapter</title>\n</head>\n<body>\n<h1>ZeRO memory chapter</h1>\n"
            f"<ol>\n{items}\n</ol>\n</body>\n</html>\n")


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
            nb, resources={"metadata": {"name": notebook.stem, "path": str(notebook.parent)}})
        page = Path(out_dir) / f"{notebook.stem}.html"
        files[page] = _link_pages(_stable_div_ids(body), stems)
        headings = markdown_headings(nb)
        pages.append(Page(notebook, page, headings[0] if headings else notebook.stem, headings))
    files[out_dir / "index.html"] = _index_page(pages)
    write_files(files, only_changed=False)
    return pages
