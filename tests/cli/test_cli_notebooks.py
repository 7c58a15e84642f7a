"""``zerolib notebooks``: in-place re-execution, --check, one-line errors; run on small notebooks
in a temporary folder with a real kernel (a widget included, whose ids are random per run)."""
from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest
from cli_support import run
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from zerolib.publish import notebooks

SMALL = [
    new_markdown_cell("# A small notebook", id="title"),
    new_code_cell("from zerolib.core.memory.accounting import model_state\n"
                  "int(model_state(10**9, 4, 3).total)", id="total"),
    new_code_cell("import ipywidgets\n"
                  "slider = ipywidgets.IntSlider(value=4, min=1, max=64, description='GPUs')\n"
                  "ipywidgets.VBox([slider, ipywidgets.Label('per worker')])", id="widget"),
]


@pytest.fixture
def folder(tmp_path):
    nb = new_notebook(cells=SMALL, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}})
    nbformat.write(nb, tmp_path / "01-small.ipynb")
    return tmp_path


def test_unknown_notebook_is_one_line_and_exit_2(capsys, folder):
    status, out, err = run(capsys, "notebooks", "--dir", str(folder), "07")
    assert status == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("zerolib notebooks: error: notebook must be") and "01-small" in err


def test_bad_timeout_is_one_line_and_exit_2(capsys, folder):
    status, _, err = run(capsys, "notebooks", "--dir", str(folder), "--timeout", "0")
    assert status == 2 and err.count("\n") == 1 and "--timeout" in err


@pytest.mark.slow
def test_refresh_then_check(capsys, folder):
    path = folder / "01-small.ipynb"
    status, out, _ = run(capsys, "notebooks", "--dir", str(folder))
    assert status == 0 and "rewritten" in out
    first = path.read_bytes()
    nb = nbformat.reads(first.decode(), as_version=4)
    # Executed, with the widget state saved under stable ids, and a normalised kernelspec.
    assert [c.execution_count for c in nb.cells if c.cell_type == "code"] == [1, 2]
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "4000000000"
    assert nb.metadata["kernelspec"] == notebooks.KERNELSPEC
    state = nb.metadata["widgets"][notebooks.WIDGET_STATE]["state"]
    view = nb.cells[2].outputs[0]["data"][notebooks.WIDGET_VIEW]["model_id"]
    assert state[view]["model_name"] == "VBoxModel"
    assert all("execution" not in c.metadata for c in nb.cells)

    # A second run in a fresh kernel (new random widget ids inside) gives the same bytes.
    status, out, _ = run(capsys, "notebooks", "--dir", str(folder), "01")
    assert status == 0 and "unchanged" in out
    assert path.read_bytes() == first

    status, out, err = run(capsys, "notebooks", "--check", "--dir", str(folder))
    assert status == 0 and "current" in out and err == ""

    # A stale output is reported and nothing is written.
    stale = json.loads(first)
    stale["cells"][1]["outputs"][0]["data"]["text/plain"] = ["16000000000"]
    path.write_text(json.dumps(stale, indent=1))
    before = path.read_bytes()
    status, out, err = run(capsys, "notebooks", "--check", "--dir", str(folder))
    assert status == 1 and "STALE" in out and "01-small.ipynb" in err
    assert path.read_bytes() == before
    assert [p.name for p in folder.iterdir()] == ["01-small.ipynb"]


@pytest.mark.slow
def test_a_failing_cell_is_one_line_exit_1_and_nothing_written(capsys, folder):
    path = folder / "02-broken.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1 / 0", id="boom")]), path)
    before = path.read_bytes()
    status, out, err = run(capsys, "notebooks", "--dir", str(folder), "02")
    assert status == 1
    assert err.count("\n") == 1 and "ZeroDivisionError" in err and "02-broken.ipynb" in err
    assert path.read_bytes() == before


def test_python_m_zerolib_notebooks_help():
    result = subprocess.run([sys.executable, "-m", "zerolib", "notebooks", "--help"],
                            capture_output=True, text=True, check=True)
    assert "--check" in result.stdout


@pytest.mark.slow
def test_check_ignores_what_an_editor_rewrites_without_changing_anything(capsys, folder):
    """Opening a notebook in JupyterLab writes its kernel's display name, and saving it keeps
    view state (collapsed outputs); neither is staleness. An edited source is."""
    path = folder / "01-small.ipynb"
    status, _, _ = run(capsys, "notebooks", "--dir", str(folder))
    assert status == 0
    saved = json.loads(path.read_text())
    saved["metadata"]["kernelspec"]["display_name"] = "Python 3 (my venv)"
    saved["cells"][1]["metadata"]["collapsed"] = True
    path.write_text(json.dumps(saved, indent=1))
    status, out, err = run(capsys, "notebooks", "--check", "--dir", str(folder))
    assert status == 0 and "current" in out and err == ""
    saved["cells"][1]["source"] = ("from zerolib.core.memory.accounting import model_state\n"
                                   "int(model_state(10**9, 4, 2).total)")
    path.write_text(json.dumps(saved, indent=1))
    status, out, err = run(capsys, "notebooks", "--check", "--dir", str(folder))
    assert status == 1 and "STALE" in out
