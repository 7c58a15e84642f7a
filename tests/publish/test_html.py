"""``zerolib html`` / zerolib.publish.html without a browser: what the pages hold, stable bytes, errors.

(tests/browser/test_browser.py opens the exported chapter in Chromium.)
"""
from __future__ import annotations

import base64
import json
import re
import zlib

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from zerolib.cli import main
from zerolib.publish.html import (
    WIDGET_JS_FILES,
    export_chapter,
    markdown_headings,
    notebooks_to_export,
)


def png_1x1() -> bytes:
    """A valid 1x1 white PNG, assembled by hand (signature, IHDR, IDAT, IEND)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))
    header = (1).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])  # 1x1, 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff")) + chunk(b"IEND", b""))


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def model(name: str, **state) -> dict:
    return {"model_name": name, "model_module": "@jupyter-widgets/controls",
            "model_module_version": "2.0.0", "state": state}


def saved_explorer() -> dict:
    """An explorer's saved widgets as a notebook keeps them: a box holding a note, a panel of
    two controls under a section title, a text, an image (its PNG in a base64 buffer)."""
    image = model("ImageModel", format="png", layout="IPY_MODEL_l1")
    image["buffers"] = [{"encoding": "base64", "path": ["value"],
                         "data": base64.b64encode(png_1x1()).decode()}]
    return {
        "m1": model("VBoxModel", children=["IPY_MODEL_note", "IPY_MODEL_panel", "IPY_MODEL_text",
                                           "IPY_MODEL_image"]),
        "note": model("HTMLModel", value="<p>Needs a kernel.</p>", description=""),
        "panel": model("VBoxModel", children=["IPY_MODEL_title", "IPY_MODEL_grid"]),
        "title": model("HTMLModel", value="<b>Model and GPUs</b>", description=""),
        "grid": model("GridBoxModel", children=["IPY_MODEL_gpus", "IPY_MODEL_device"]),
        "gpus": model("IntSliderModel", description="GPUs", value=8, disabled=False),
        "device": model("DropdownModel", description="Device", index=1, disabled=False,
                        _options_labels=["A100 40GB", "A100 80GB"]),
        "text": model("HTMLModel", value="<p><b>8 GPUs</b>: it fits.</p>", description=""),
        "image": image,
        "l1": {"model_name": "LayoutModel", "model_module": "@jupyter-widgets/base",
               "model_module_version": "2.0.0", "state": {}},
    }


@pytest.fixture
def chapter(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "diagram.png").write_bytes(png_1x1())
    figure = new_output("display_data", data={
        "image/png": base64.b64encode(png_1x1()).decode(), "text/plain": "<Figure>"})
    view = new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "m1", "version_major": 2,
                                                     "version_minor": 0},
        "text/plain": "VBox()"})
    first = new_notebook(cells=[
        new_markdown_cell("# 1 · The `first` **notebook**\n\nNext: [the second](02-second.ipynb#top), "
                          "[elsewhere](other.ipynb), [web](https://example.org/x.ipynb).\n\n"
                          "![a diagram](diagram.png)\n\n```\n# a comment, not a heading\n```"),
        new_code_cell("figure", outputs=[figure], execution_count=1),
        new_markdown_cell("## A [linked](https://example.org) section"),
    ])
    second = new_notebook(cells=[
        new_markdown_cell("# 2 · Second\n\nAn explorer follows. It has a slider."),
        new_code_cell("explorer.widget", outputs=[view], execution_count=1),
    ], metadata={"widgets": {WIDGET_STATE: {"version_major": 2, "version_minor": 0,
                                            "state": saved_explorer()}}})
    nbformat.write(first, folder / "01-first.ipynb")
    nbformat.write(second, folder / "02-second.ipynb")
    return folder


def test_a_saved_explorer_shows_its_picture_its_note_and_its_settings(chapter, tmp_path):
    """Where the widget renderer cannot load, the explorer's output is not an empty Out[N]:."""
    page = export_chapter(tmp_path / "html", chapter)[1].path.read_text(encoding="utf-8")
    saved = page.index('class="zerolib-saved-explorer')
    view = page.index('<script type="application/vnd.jupyter.widget-view+json">')
    assert saved < view                        # in the output, before the renderer's place
    block = page[saved:view]
    assert f'src="data:image/png;base64,{base64.b64encode(png_1x1()).decode()}"' in block
    assert "Saved explorer, not live." in block and "run all cells to move the controls" in block
    assert "<p>Needs a kernel.</p>" in block and "<p><b>8 GPUs</b>: it fits.</p>" in block
    assert "Saved settings:</b> GPUs: 8 · Device: A100 80GB." in block
    assert "Model and GPUs" not in block       # a section title of controls not shown here
    assert "<input" not in block and "<select" not in block and "<button" not in block


def test_a_loaded_widget_renderer_draws_the_controls_disabled(chapter, tmp_path):
    """With the renderer (a CDN or --widget-js) the saved controls show greyed out, not live."""
    page = export_chapter(tmp_path / "html", chapter)[1].path.read_text(encoding="utf-8")
    state = json.loads(re.search(r'<script type="application/vnd\.jupyter\.widget-state\+json">'
                                 r"\s*(.*?)\s*</script>", page, re.S).group(1))["state"]
    assert state["gpus"]["state"]["disabled"] is True
    assert state["device"]["state"]["disabled"] is True
    assert "disabled" not in state["text"]["state"]
    # Once the renderer has drawn the widget beside the copy, the copy keeps only its note.
    assert ".jp-OutputArea-output:has(> .widget-subarea) .zerolib-saved-body {display: none;}" in page
    source = nbformat.read(chapter / "02-second.ipynb", as_version=4)
    assert source.metadata.widgets[WIDGET_STATE]["state"]["gpus"]["state"]["disabled"] is False


def test_the_index_gives_one_line_per_section(chapter, tmp_path):
    """As 00-index's contents: each section's title and its line; else the page's first sentence."""
    nbformat.write(new_notebook(cells=[new_markdown_cell(
        "# The chapter\n\nIntro.\n\n## Contents\n\n1. [The first](01-first.ipynb): what the first\n"
        "   section teaches, on two lines.\n\nStart with the first.")]), chapter / "00-index.ipynb")
    out = tmp_path / "html"
    export_chapter(out, chapter)
    index = (out / "index.html").read_text(encoding="utf-8")
    assert "<h1>The chapter</h1>" in index and "<title>The chapter</title>" in index
    items = re.findall(r"<li>(.*?)</li>", index)
    assert items == [
        '<a href="00-index.html">Contents</a>: this list, with how to run the notebooks',
        '<a href="01-first.html">The first</a>: what the first section teaches, on two lines.',
        '<a href="02-second.html">2 · Second</a>: An explorer follows.',
    ]


def test_the_index_keeps_the_contents_parts(chapter, tmp_path):
    """00-index's contents in parts (### headings): each part's heading, then its sections, numbered
    on from the part before as the notebook numbers them; the index's own line first, unnumbered
    (two items "1." read as one list counted twice)."""
    nbformat.write(new_notebook(cells=[new_markdown_cell(
        "# The chapter\n\n## Contents\n\n### Main path (about an hour)\n\nRead in order.\n\n"
        "1. [The first](01-first.ipynb): what the first teaches.\n\n### Appendix\n\n"
        "2. [The second](02-second.ipynb): what the second checks.\n\n## Running\n\nRun it.")]),
        chapter / "00-index.ipynb")
    out = tmp_path / "html"
    export_chapter(out, chapter)
    index = (out / "index.html").read_text(encoding="utf-8")
    body = index[index.index("<h2>Contents</h2>"):index.index("</body>")]
    assert body == (
        '<h2>Contents</h2>\n<ul>\n<li><a href="00-index.html">Contents</a>: this list, with how to run '
        'the notebooks</li>\n</ul>\n<h3>Main path (about an hour)</h3>\n<ol start="1">\n'
        '<li><a href="01-first.html">The first</a>: what the first teaches.</li>\n</ol>\n'
        '<h3>Appendix</h3>\n<ol start="2">\n<li><a href="02-second.html">The second</a>: what the '
        'second checks.</li>\n</ol>\n')


def test_markdown_headings_are_plain_text(chapter):
    nb = nbformat.read(chapter / "01-first.ipynb", as_version=4)
    assert markdown_headings(nb) == ("1 · The first notebook", "A linked section")


def test_pages_index_and_titles(chapter, tmp_path):
    out = tmp_path / "html"
    pages = export_chapter(out, chapter)
    assert [p.path.name for p in pages] == ["01-first.html", "02-second.html"]
    assert [p.title for p in pages] == ["1 · The first notebook", "2 · Second"]
    index = (out / "index.html").read_text(encoding="utf-8")
    assert re.findall(r'href="([^"]+)"', index) == ["01-first.html", "02-second.html"]
    assert ">1 · The first notebook</a>" in index


def test_figures_are_embedded_and_chapter_links_point_at_pages(chapter, tmp_path):
    page = (export_chapter(tmp_path / "html", chapter)[0].path).read_text(encoding="utf-8")
    sources = re.findall(r'<img[^>]*\ssrc="([^"]+)"', page)
    assert len(sources) == 2  # the markdown diagram and the PNG output
    assert all(src.startswith("data:image/png;base64,") for src in sources)
    assert 'href="02-second.html#top"' in page
    assert 'href="other.ipynb"' in page                     # not a chapter notebook: left alone
    assert 'href="https://example.org/x.ipynb"' in page     # not local: left alone


def test_exports_are_byte_identical(chapter, tmp_path):
    first = export_chapter(tmp_path / "a", chapter)
    second = export_chapter(tmp_path / "b", chapter)
    for one, two in zip(first, second):
        assert one.path.read_bytes() == two.path.read_bytes()
    widget_page = first[1].path.read_text(encoding="utf-8")
    assert "getElementById('output-1')" in widget_page and not UUID.search(widget_page)


def test_widget_js_is_copied_beside_the_pages(chapter, tmp_path):
    js = tmp_path / "js"
    js.mkdir()
    for name in (*WIDGET_JS_FILES, "font.woff2", "embed-amd.js.map"):
        (js / name).write_text(f"/* {name} */")
    out = tmp_path / "html"
    page = export_chapter(out, chapter, widget_js=js)[1].path.read_text(encoding="utf-8")
    assert sorted(p.name for p in (out / "_static").iterdir()) == ["embed-amd.js", "font.woff2",
                                                                   "require.js"]
    assert '<script src="_static/require.js"></script>' in page
    assert "var widgetRendererSrc = '_static/embed-amd.js';" in page
    assert "unpkg.com" not in page and "cdnjs.cloudflare.com/ajax/libs/require.js" not in page


def test_default_pages_name_the_cdn(chapter, tmp_path):
    """Without widget_js the pages keep nbconvert's CDN addresses (widgets need the network)."""
    page = export_chapter(tmp_path / "html", chapter)[1].path.read_text(encoding="utf-8")
    assert "unpkg.com/@jupyter-widgets/html-manager" in page


def test_bad_folders_raise_naming_the_argument(chapter, tmp_path):
    with pytest.raises(ValueError, match="notebooks must be a folder"):
        notebooks_to_export(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .ipynb files"):
        notebooks_to_export(tmp_path / "empty")
    with pytest.raises(ValueError, match="widget_js must be a folder holding require.js and "
                                         "embed-amd.js.*lacks require.js, embed-amd.js"):
        export_chapter(tmp_path / "html", chapter, widget_js=tmp_path / "empty")


def test_cli_writes_pages(chapter, tmp_path, capsys):
    out = tmp_path / "html"
    assert main(["html", "--notebooks", str(chapter), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert str(out / "01-first.html") in printed and "2 pages" in printed
    assert (out / "02-second.html").is_file()


def test_cli_error_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["html", "--notebooks", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerolib html: error: notebooks must be a folder") and err.count("\n") == 1


def test_the_chapter_exports(tmp_path):
    """Every notebook of the real chapter becomes a page holding each of its headings."""
    pages = export_chapter(tmp_path / "html")
    assert [p.notebook for p in pages] == notebooks_to_export()
    for page in pages:
        text = page.path.read_text(encoding="utf-8")
        assert page.headings and f"<title>{page.notebook.stem}</title>" in text


def test_a_widget_output_saved_without_its_state_says_so_not_its_repr(chapter, tmp_path):
    """A notebook saved by JupyterLab after a run: its explorer's output names a model the saved
    state does not hold. nbconvert would print the text/plain repr; the page says why instead."""
    path = chapter / "02-second.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].outputs[0]["data"] = {
        "application/vnd.jupyter.widget-view+json": {"model_id": "a-run-not-saved",
                                                     "version_major": 2, "version_minor": 0},
        "text/plain": "VBox(children=(HTML(value=\"<p style='font-size:smaller'>The controls\u2026"}
    nbformat.write(nb, path)
    page = export_chapter(tmp_path / "html", chapter)[1].path.read_text(encoding="utf-8")
    assert "VBox(children" not in page
    assert "Explorer not saved with this notebook." in page


def test_a_saved_explorer_is_set_in_the_chapters_font(chapter, tmp_path):
    """The plain copy sits in an output area, whose font is the browser's default (a serif):
    it takes the font of the chapter's text (JupyterLab's content font, as markdown cells)."""
    page = export_chapter(tmp_path / "html", chapter)[1].path.read_text(encoding="utf-8")
    rule = re.search(r"\.zerolib-saved-explorer \{([^}]*)\}", page).group(1)
    assert "font-family: var(--jp-content-font-family)" in rule
    assert "font-size: var(--jp-content-font-size1)" in rule
