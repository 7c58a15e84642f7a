"""The chapter's notebooks: committed clean and executed, the 01 worksheet's numbers, and the
deterministic re-execution behind ``zerolib notebooks`` (zerolib/notebooks.py)."""
from __future__ import annotations

import copy
import platform
import re
import uuid
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from zerolib import paths
from zerolib.core.memory.accounting import model_state
from zerolib.core.units import GB
from zerolib.publish import notebooks

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
CHAPTER = list(paths.CHAPTER)
# The chapter's notebooks are written on several branches at once: a link to one of them is
# allowed before it exists (tests/notebooks/test_chapter_shape.py requires every one to exist).
PLANNED: set[str] = {f"{name}.ipynb" for name in CHAPTER}
ALL_NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# Tags that hide or skip outputs; a cell carrying one must say why ("# nbval-skip: because ...").
HIDING_TAGS = {"nbval-ignore-output", "nbval-skip", "nbval-raise", "raises-exception",
               "remove-output", "remove-cell", "hide-output", "hide-cell"}


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def code_cells(nb):
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def widget_views(nb) -> list[str]:
    return [output["data"][notebooks.WIDGET_VIEW]["model_id"]
            for cell in code_cells(nb) for output in cell.outputs
            if notebooks.WIDGET_VIEW in output.get("data", {})]


# ---------------------------------------------------------------------------------------------
# The committed notebooks


@pytest.fixture(params=ALL_NOTEBOOKS, ids=lambda p: p.stem)
def committed(request):
    return request.param, read(request.param)


def test_notebook_is_valid_and_kernelspec_normalised(committed):
    path, nb = committed
    nbformat.validate(nb)
    # The kernel by name; its display name is whatever JupyterLab's kernel called itself when a
    # reader's autosave ran, which says nothing about the notebook.
    kernelspec = nb.metadata["kernelspec"]
    assert (kernelspec["name"], kernelspec["language"]) == ("python3", "python")
    assert set(nb.metadata["zerolib"]["executed_with"]) == set(notebooks.VERSIONED_PACKAGES)


def test_every_code_cell_executed_in_order_with_outputs_and_no_errors(committed):
    path, nb = committed
    cells = code_cells(nb)
    assert cells, f"{path.name} has no code"
    assert [cell.execution_count for cell in cells] == list(range(1, len(cells) + 1))
    for cell in cells:
        assert cell.source.strip(), f"{path.name}: empty code cell {cell.id}"
        assert cell.outputs, f"{path.name}: cell {cell.id} has no output"
        for output in cell.outputs:
            assert output.output_type != "error", f"{path.name}: cell {cell.id} raised"
            # Warnings on stderr are noise to a reader and flaky under nbval.
            assert not (output.output_type == "stream" and output.name == "stderr"), (
                f"{path.name}: cell {cell.id} wrote to stderr: {output.text[:200]}")
            if "execution_count" in output:
                assert output.execution_count == cell.execution_count


def test_no_timing_metadata(committed):
    path, nb = committed
    for cell in nb.cells:
        assert "execution" not in cell.metadata, f"{path.name}: timing in cell {cell.id}"
        assert "ExecuteTime" not in cell.metadata, f"{path.name}: timing in cell {cell.id}"


def test_widget_state_is_saved_with_its_state_key_and_stable_ids(committed):
    path, nb = committed
    views = widget_views(nb)
    if not views:
        assert "widgets" not in nb.metadata
        return
    saved = nb.metadata["widgets"][notebooks.WIDGET_STATE]
    assert "state" in saved  # GitHub refuses to render a notebook without it
    state = saved["state"]
    for model_id in views:
        assert model_id in state, f"{path.name}: displayed widget {model_id} has no saved state"
    for model in state.values():
        for ref in notebooks._references(model["state"]):
            assert ref in state, f"{path.name}: a widget references the unsaved model {ref}"
    # The ids are the renumbered ones: renumbering again changes nothing.
    assert notebooks.notebook_bytes(notebooks.renumber_widgets(nb, path.stem)) == notebooks.notebook_bytes(nb)
    assert views[0] == uuid.uuid5(notebooks._WIDGET_NAMESPACE, f"{path.stem}/0").hex


def test_every_widget_shows_a_static_figure_first(committed):
    """GitHub and MyST render no widgets: the cell before a widget shows a PNG of its default."""
    path, nb = committed
    cells = code_cells(nb)
    for index, cell in enumerate(cells):
        if any(notebooks.WIDGET_VIEW in o.get("data", {}) for o in cell.outputs):
            assert index > 0 and any("image/png" in o.get("data", {}) for o in cells[index - 1].outputs), (
                f"{path.name}: widget cell {cell.id} has no static figure before it")


def test_hidden_outputs_carry_a_reason(committed):
    path, nb = committed
    for cell in nb.cells:
        for tag in HIDING_TAGS & set(cell.metadata.get("tags", ())):
            assert re.search(rf"#\s*{re.escape(tag)}:\s*\S", cell.source), (
                f"{path.name}: cell {cell.id} is tagged {tag} without a '# {tag}: reason' comment")


def test_narrative_structure(committed):
    path, nb = committed
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    if path.stem != "00-index":
        assert "What you will learn" in text
        assert "## Summary" in text
    # The ZeRO paper is cited in full once (00 and 01): tests/notebooks/test_chapter_shape.py.


def test_links_between_notebooks_resolve(committed):
    path, nb = committed
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    for target in re.findall(r"\]\(([^)#\s]+\.ipynb)", text):
        assert (path.parent / target).is_file() or target in PLANNED, (
            f"{path.name} links to missing {target}")


def test_index_links_every_notebook():
    nb = read(NOTEBOOK_DIR / "00-index.ipynb")
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    for name in CHAPTER[1:]:
        assert f"]({name}.ipynb)" in text, f"the index does not link {name}.ipynb"


# ---------------------------------------------------------------------------------------------
# Notebook 01: the worked example, by hand and in zerolib

# Worked out by hand: 1B parameters, 4 workers, 2 + 2 + 12 bytes per parameter; a partitioned
# category is divided by 4. (parameters, gradients, optimizer, total) in GB per worker.
WORKSHEET_GB = {
    0: (2.0, 2.0, 12.0, 16.0),   # nothing partitioned
    1: (2.0, 2.0, 3.0, 7.0),     # optimizer / 4
    2: (2.0, 0.5, 3.0, 5.5),     # gradients and optimizer / 4
    3: (0.5, 0.5, 3.0, 4.0),     # everything / 4
}


def _cell(nb, cell_id):
    (cell,) = [cell for cell in nb.cells if cell.get("id") == cell_id]
    return cell


def test_01_recorded_worksheet_prints_the_hand_numbers():
    nb = read(NOTEBOOK_DIR / "01-bytes-per-parameter.ipynb")
    cell = _cell(nb, "worksheet")
    assert "assert" in cell.source and "[16.0, 7.0, 5.5, 4.0]" in cell.source
    text = "".join(o.text for o in cell.outputs if o.output_type == "stream")
    line = re.compile(r"stage (\d): parameters\s+([\d.]+) GB, gradients\s+([\d.]+) GB, "
                      r"optimizer\s+([\d.]+) GB, total\s+([\d.]+) GB")
    printed = {int(m[0]): tuple(float(v) for v in m[1:]) for m in line.findall(text)}
    assert printed == WORKSHEET_GB


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_01_worksheet_agrees_with_zerolib(stage):
    state = model_state(10**9, 4, stage, "mixed-adam")
    got = (state.parameters, state.gradients, state.optimizer, state.total)
    assert tuple(int(v) for v in got) == tuple(int(gb * GB) for gb in WORKSHEET_GB[stage])


def test_01_other_claims_hold_in_zerolib():
    # Per-worker versus cluster: 4 x 16 GB replicated, 16 GB once at stage 3.
    state = model_state(10**9, 4, [0, 1, 2, 3], "mixed-adam")
    assert state.cluster_total.tolist() == [64 * GB, 28 * GB, 22 * GB, 16 * GB]
    # fp32 gradients (2 + 4 + 12): 18, 2 + 4 + 3, 2 + 1 + 3, 0.5 + 1 + 3 GB; stage 2 saves 3 GB.
    fp32 = model_state(10**9, 4, [0, 1, 2, 3], "bf16-fp32-grads")
    assert fp32.total.tolist() == [18 * GB, 9 * GB, 6 * GB, 4_500_000_000]
    # The paper's GPT-2 example (Sec. III-A): 1.5B parameters, 3 GB fp16, at least 24 GB.
    gpt2 = model_state(1_500_000_000, 1, 0, "mixed-adam")
    assert (int(gpt2.parameters), int(gpt2.total)) == (3 * GB, 24 * GB)


# ---------------------------------------------------------------------------------------------
# Deterministic re-execution (zerolib/notebooks.py), without a kernel

def _synthetic(ids: list[str]) -> nbformat.NotebookNode:
    """A notebook as nbclient leaves it: a VBox view holding a slider, plus an undisplayed model."""
    box, slider, layout, hidden = ids
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                               "language": "python"}})
    nb.cells = [new_markdown_cell("# t", id="title"),
                new_code_cell("w", id="w", execution_count=1, metadata={"execution": {"x": "y"}},
                              outputs=[new_output("display_data", data={
                                  "text/plain": "VBox()",
                                  notebooks.WIDGET_VIEW: {"model_id": box, "version_major": 2,
                                                          "version_minor": 0}})])]

    def model(name, state):
        return {"model_name": name, "model_module": "@jupyter-widgets/controls",
                "model_module_version": "2.0.0", "state": state}
    nb.metadata["widgets"] = {notebooks.WIDGET_STATE: {"version_major": 2, "version_minor": 0, "state": {
        hidden: model("IntSliderModel", {"value": 1}),
        layout: model("LayoutModel", {}),
        slider: model("IntSliderModel", {"layout": f"IPY_MODEL_{layout}", "value": 3}),
        box: model("VBoxModel", {"children": [f"IPY_MODEL_{slider}"], "layout": f"IPY_MODEL_{layout}"}),
    }}}
    return nb


def _random_ids(n=4):
    return [uuid.uuid4().hex for _ in range(n)]


def test_normalise_gives_the_same_bytes_whatever_the_random_ids():
    first = notebooks.notebook_bytes(notebooks.normalise(_synthetic(_random_ids()), "demo"))
    second = notebooks.notebook_bytes(notebooks.normalise(_synthetic(_random_ids()), "demo"))
    assert first == second


def test_renumbering_follows_views_then_references_then_the_rest():
    ids = _random_ids()
    box, slider, layout, hidden = ids
    assert notebooks.widget_order(_synthetic(ids)) == [box, slider, layout, hidden]
    nb = notebooks.renumber_widgets(_synthetic(ids), "demo")
    state = nb.metadata["widgets"][notebooks.WIDGET_STATE]["state"]
    new_box = widget_views(nb)[0]
    assert new_box not in ids and len(state) == 4 and len(set(state)) == 4
    new_slider = state[new_box]["state"]["children"][0].removeprefix("IPY_MODEL_")
    assert new_slider in state and state[new_slider]["state"]["value"] == 3
    assert state[new_slider]["state"]["layout"] == state[new_box]["state"]["layout"]
    text = notebooks.notebook_bytes(nb).decode()
    assert not any(old in text for old in ids)
    # Another notebook's widgets get other ids.
    other = notebooks.renumber_widgets(_synthetic(ids), "other")
    assert widget_views(other)[0] != new_box


def test_normalise_fixes_kernelspec_and_drops_timing_and_keeps_input_unchanged():
    nb = _synthetic(_random_ids())
    before = copy.deepcopy(nb)
    out = notebooks.normalise(nb, "demo")
    assert nb == before
    # ipykernel's kernelspec, as JupyterLab writes it into a notebook it opens (ipykernel/kernelspec.py:
    # "Python %i (ipykernel)" % sys.version_info[0]).
    assert out.metadata["kernelspec"] == {"display_name": "Python 3 (ipykernel)", "language": "python",
                                          "name": "python3"}
    assert all("execution" not in cell.metadata for cell in out.cells)
    assert notebooks.notebook_bytes(out).endswith(b"}\n")


def test_kernelspec_is_ipykernels_own():
    import ipykernel.kernelspec
    spec = ipykernel.kernelspec.get_kernel_dict()
    assert notebooks.KERNELSPEC == {"display_name": spec["display_name"], "language": spec["language"],
                                    "name": "python3"}


def test_widget_state_numbers_are_written_as_javascript_writes_them():
    """JupyterLab saves a notebook's JSON from JavaScript, which writes 12.0 as 12: seen on saving
    notebook 02 in JupyterLab 4.6 (a FloatSlider's "max": 32.0, "min": 0.0, "value": 2.0 became
    32, 0 and 2). A re-execution writes the same, so an autosave rewrites nothing."""
    nb = _synthetic(_random_ids())
    state = nb.metadata["widgets"][notebooks.WIDGET_STATE]["state"]
    slider = next(m for m in state.values() if m["state"].get("value") == 3)
    slider["state"].update(value=2.0, max=32.0, min=-0.0, step=0.5)
    out = notebooks.normalise(nb, "demo")
    saved = next(m for m in out.metadata["widgets"][notebooks.WIDGET_STATE]["state"].values()
                 if m["state"].get("max") == 32)["state"]
    assert [(saved[k], type(saved[k])) for k in ("value", "max", "min", "step")] == [
        (2, int), (32, int), (0, int), (0.5, float)]
    assert b'"max": 32,' in notebooks.notebook_bytes(out) and b"32.0" not in notebooks.notebook_bytes(out)


def test_substance_ignores_view_state_and_the_kernels_display_name():
    nb = notebooks.normalise(_synthetic(_random_ids()), "demo")
    seen = copy.deepcopy(nb)
    seen.metadata["kernelspec"]["display_name"] = "Python 3 (my venv)"
    seen.cells[1].metadata.update(collapsed=True, scrolled=True, jupyter={"outputs_hidden": True})
    state = seen.metadata["widgets"][notebooks.WIDGET_STATE]["state"]
    next(iter(state.values()))["state"]["value"] = 1.0          # was 1: the same number
    assert notebooks.same_substance(notebooks.notebook_bytes(nb), notebooks.notebook_bytes(seen))


@pytest.mark.parametrize("change", ["source", "output", "tags", "kernel", "widget"])
def test_substance_sees_what_a_notebook_says(change):
    nb = notebooks.normalise(_synthetic(_random_ids()), "demo")
    edited = copy.deepcopy(nb)
    cell = edited.cells[1]
    if change == "source":
        cell.source = "w2"
    elif change == "output":
        cell.outputs[0]["data"]["text/plain"] = "HBox()"
    elif change == "tags":
        cell.metadata["tags"] = ["nbval-skip"]
    elif change == "kernel":
        edited.metadata["kernelspec"]["name"] = "julia"
    else:
        next(iter(edited.metadata["widgets"][notebooks.WIDGET_STATE]["state"].values()))["state"]["value"] = 9
    assert not notebooks.same_substance(notebooks.notebook_bytes(nb), notebooks.notebook_bytes(edited))


def test_notebook_without_widgets_is_left_without_widget_metadata():
    nb = new_notebook(cells=[new_code_cell("1", id="a", execution_count=1)])
    out = notebooks.normalise(nb, "demo")
    assert "widgets" not in out.metadata


def test_find_notebooks_by_number_name_file_or_path(tmp_path):
    for stem in ("00-index", "01-bytes", "02-gpus"):
        (tmp_path / f"{stem}.ipynb").write_text("{}")
    assert [p.name for p in notebooks.find_notebooks((), tmp_path)] == [
        "00-index.ipynb", "01-bytes.ipynb", "02-gpus.ipynb"]
    picked = notebooks.find_notebooks(["02", "01-bytes", "01-bytes.ipynb",
                                       str(tmp_path / "00-index.ipynb")], tmp_path)
    assert [p.name for p in picked] == ["02-gpus.ipynb", "01-bytes.ipynb", "00-index.ipynb"]
    with pytest.raises(ValueError, match="00-index, 01-bytes, 02-gpus.*got '7'"):
        notebooks.find_notebooks(["7"], tmp_path)
    with pytest.raises(ValueError, match="no notebooks"):
        notebooks.find_notebooks((), tmp_path / "empty")


# ---------------------------------------------------------------------------------------------
# Re-executing the committed notebooks gives their bytes


@pytest.mark.slow
@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.stem)
def test_reexecution_reproduces_the_committed_notebook(path):
    committed_bytes = path.read_bytes()
    fresh = notebooks.rerun(path)
    metadata = read(path).metadata
    recorded = {**metadata["zerolib"]["executed_with"], "python": metadata["language_info"]["version"]}
    current = {**notebooks.package_versions(), "python": platform.python_version()}
    if recorded == current:
        # What the notebook says (sources, outputs, figures, widget state): a reader's autosave
        # that rewrote only the kernel's display name or view state is not staleness.
        assert notebooks.same_substance(fresh, committed_bytes), (
            f"{path.name} is stale: run `zerolib notebooks {path.stem.split('-')[0]}` and commit it")
    else:
        # Other package versions draw other PNG bytes; a rerun must still reproduce itself.
        assert notebooks.rerun(path) == fresh
        pytest.skip(f"{path.name} was executed with {recorded}, this environment has "
                    f"{current}; checked run-to-run determinism only")
