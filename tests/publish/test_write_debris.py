"""An interrupted write leaves a temporary file; the next run of the same writer removes it,
whether the files it writes change or not, so that ``--check`` passes again after it.

The debris is made the way a kill makes it: :func:`zerolib._io._write_temporary` writes the
temporary file beside its target, and the rename that would follow never happens.
"""
from __future__ import annotations

import nbformat
from cli_support import run
from nbformat.v4 import new_code_cell, new_notebook

from zerolib import _io
from zerolib.publish import notebooks


def killed_write(path, content=b"half written"):
    """What a write killed between its temporary file and its rename leaves behind."""
    return _io._write_temporary(path, content)


def small_notebook(folder):
    path = folder / "01-small.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1 + 1", id="sum")]), path)
    return path


def test_refresh_removes_debris_when_the_notebook_is_unchanged(tmp_path, monkeypatch):
    path = small_notebook(tmp_path)
    debris = killed_write(path)
    monkeypatch.setattr(notebooks, "rerun", lambda p, timeout=600: path.read_bytes())
    assert notebooks.refresh(path) is False
    assert not debris.exists() and _io.stale_temporaries(tmp_path) == []


def test_refresh_removes_debris_when_the_notebook_changes(tmp_path, monkeypatch):
    path = small_notebook(tmp_path)
    debris = killed_write(path)
    monkeypatch.setattr(notebooks, "rerun", lambda p, timeout=600: b"{}\n")
    assert notebooks.refresh(path) is True
    assert path.read_bytes() == b"{}\n" and not debris.exists()


def test_notebooks_then_check_passes_after_a_killed_run(capsys, tmp_path, monkeypatch):
    path = small_notebook(tmp_path)
    own = killed_write(path)
    orphan = killed_write(tmp_path / "00-renamed.ipynb")    # a notebook no longer there
    monkeypatch.setattr(notebooks, "rerun", lambda p, timeout=600: p.read_bytes())
    status, _, err = run(capsys, "notebooks", "--check", "--dir", str(tmp_path))
    assert status == 1 and own.name in err and orphan.name in err
    status, out, _ = run(capsys, "notebooks", "--dir", str(tmp_path))
    assert status == 0 and "unchanged" in out
    assert not own.exists() and not orphan.exists()
    status, out, err = run(capsys, "notebooks", "--check", "--dir", str(tmp_path))
    assert status == 0 and err == "" and "current" in out


def test_figures_removes_debris_it_reports_even_when_nothing_changes(capsys, tmp_path):
    assert run(capsys, "figures", "--out", str(tmp_path))[0] == 0
    debris = [killed_write(tmp_path / "figures" / "memory-vs-gpu-count.svg"),
              killed_write(tmp_path / "data" / "validation.csv")]   # another command's file
    status, out, _ = run(capsys, "figures", "--check", "--out", str(tmp_path))
    assert status == 1 and all(d.name in out for d in debris)
    status, out, _ = run(capsys, "figures", "--out", str(tmp_path))
    assert status == 0 and "wrote" not in out        # every file unchanged
    assert not any(d.exists() for d in debris)
    assert run(capsys, "figures", "--check", "--out", str(tmp_path))[0] == 0
