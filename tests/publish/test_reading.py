"""The reader's working copy (zerolib.publish.reading): what ``zerolib lab`` serves, so that
reading never writes the committed notebooks. (tests/browser/test_browser.py reads every
explorer notebook through ``zerolib lab`` in Chromium and checks the chapter afterwards.)"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from zerolib.paths import NOTEBOOK_DIR, REPO_ROOT
from zerolib.publish import reading


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def source(tmp_path):
    """A chapter of two notebooks."""
    folder = tmp_path / "chapter"
    folder.mkdir()
    for name in ("00-index", "01-first"):
        nbformat.write(new_notebook(cells=[new_markdown_cell(f"# {name}"),
                                           new_code_cell("1 + 1", execution_count=1)]),
                       folder / f"{name}.ipynb")
    return folder


def test_a_fresh_copy_of_every_notebook_trusted_beside_what_they_read(source, tmp_path):
    committed = {p.name: p.read_bytes() for p in source.glob("*.ipynb")}
    prepared = reading.prepare(tmp_path / "lab", source)
    copy = prepared.copy
    assert prepared.copied == ("00-index.ipynb", "01-first.ipynb") and not prepared.kept
    assert {p.name: p.read_bytes() for p in copy.notebooks.glob("*.ipynb")} == committed
    # Trusted in the copy's own store (JupyterLab then draws the saved widgets before a run).
    assert all(reading.is_trusted(copy, p) for p in copy.notebooks.glob("*.ipynb"))
    assert (copy.folder / "tests" / "data" / "mistral-7b-v0.3.json").is_file()
    manifest = json.loads((copy.state / reading.MANIFEST).read_text())
    assert manifest["taken_from"] == {name: hashlib.sha256(data).hexdigest()
                                      for name, data in committed.items()}
    # The source is read, never written.
    assert {p.name: p.read_bytes() for p in source.glob("*.ipynb")} == committed


def test_the_readers_changes_are_kept_and_untouched_copies_follow_the_repository(source, tmp_path):
    folder = tmp_path / "lab"
    copy = reading.prepare(folder, source).copy
    mine = copy.notebooks / "00-index.ipynb"
    nb = nbformat.read(mine, as_version=4)
    nb.cells.append(new_markdown_cell("my note"))
    nbformat.write(nb, mine)
    edited = mine.read_bytes()
    again = reading.prepare(folder, source)
    assert again.copied == () and again.kept == ("00-index.ipynb",) and again.behind == ()
    assert mine.read_bytes() == edited
    # A pull changes both notebooks: the untouched copy follows, the reader's is kept and named.
    for path in source.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(new_markdown_cell("new in the repository"))
        nbformat.write(nb, path)
    after = reading.prepare(folder, source)
    assert after.copied == ("01-first.ipynb",) and after.behind == ("00-index.ipynb",)
    assert (copy.notebooks / "01-first.ipynb").read_bytes() == (source / "01-first.ipynb").read_bytes()
    assert reading.is_trusted(copy, copy.notebooks / "01-first.ipynb")
    assert mine.read_bytes() == edited
    # --reset: a fresh copy of everything, the reader's changes gone.
    fresh = reading.prepare(folder, source, reset=True)
    assert fresh.copied == ("00-index.ipynb", "01-first.ipynb") and fresh.kept == ()
    assert _sha(mine) == _sha(source / "00-index.ipynb")


def test_a_deleted_copy_comes_back(source, tmp_path):
    copy = reading.prepare(tmp_path / "lab", source).copy
    (copy.notebooks / "01-first.ipynb").unlink()
    assert reading.prepare(tmp_path / "lab", source).copied == ("01-first.ipynb",)


@pytest.mark.parametrize("where, says", [
    ("notebooks-parent", "must not be the chapter's own notebooks"),
    ("foreign", "holds files but no working copy"),
    ("a-file", "is a file"),
])
def test_a_folder_that_is_not_a_working_copy_is_refused(source, tmp_path, where, says):
    folder = {"notebooks-parent": source.parent, "foreign": tmp_path / "foreign",
              "a-file": tmp_path / "a-file"}[where]
    if where == "notebooks-parent":
        source = source.rename(source.parent / "notebooks")
    elif where == "foreign":
        folder.mkdir()
        (folder / "thesis.tex").write_text("mine")
    else:
        folder.write_text("not a folder")
    with pytest.raises(ValueError, match=says):
        reading.prepare(folder, source, reset=True)
    if where == "foreign":
        assert (folder / "thesis.tex").read_text() == "mine"     # --reset removed nothing


def test_the_default_copy_is_git_ignored():
    folder = reading.default_folder()
    assert folder == REPO_ROOT / "build" / "lab"
    if (REPO_ROOT / ".git").exists():
        result = subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "-q",
                                 str(folder / "notebooks" / "00-index.ipynb")])
        assert result.returncode == 0, "build/lab is not git-ignored"


def _relative_paths(path) -> list[str]:
    """String literals starting with ../ in a notebook's code cells."""
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            source = "\n".join(line for line in cell.source.splitlines() if not line.startswith(("%", "!")))
            found += [node.value for node in ast.walk(ast.parse(source))
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and re.match(r"\.\./", node.value)]
    return found


def test_every_file_a_notebook_reads_by_a_relative_path_is_in_the_copy(tmp_path):
    """Notebooks 09 and 10 read ``../tests/data/...``: from the copy's notebooks/ too."""
    prepared = reading.prepare(tmp_path / "lab")
    paths = {p.name: _relative_paths(p) for p in sorted(NOTEBOOK_DIR.glob("*.ipynb"))}
    assert any(paths.values())
    for name, relative in paths.items():
        for path in relative:
            assert (prepared.copy.notebooks / path).exists(), f"{name} reads {path}: not in the copy"


def test_no_chapter_to_copy_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no notebooks"):
        reading.prepare(tmp_path / "lab", empty)
    assert not (tmp_path / "lab").exists()
