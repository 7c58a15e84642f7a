"""``zerolib html`` / zerolib.publish.html without a browser: what the pages hold, stable bytes, errors.

(tests/browser/test_browser.py opens the exported chapter in Chromium.)
"""
from __future__ import annotations

import base64
import re
import zlib

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from zerolib.cli import main
from zerolib.publish.html import (
    WIDGET_JS_FILES,
    export_chapter,
    find_notebooks,
    markdown_headings,
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
        new_markdown_cell("# 2 · Second"),
        new_code_cell("explorer.widget", outputs=[view], execution_count=1),
    ], metadata={"widgets": {WIDGET_STATE: {"version_major": 2, "version_minor": 0, "state": {
        "m1": {"model_name": "VBoxModel", "model_module": "@jupyter-widgets/controls",
               "model_module_version": "2.0.0", "state": {}}}}}})
    nbformat.write(first, folder / "01-first.ipynb")
    nbformat.write(second, folder / "02-second.ipynb")
    return folder


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
        find_notebooks(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .ipynb files"):
        find_notebooks(tmp_path / "empty")
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
    assert [p.notebook for p in pages] == find_notebooks()
    for page in pages:
        text = page.path.read_text(encoding="utf-8")
        assert page.headings and f"<title>{page.notebook.stem}</title>" in text
