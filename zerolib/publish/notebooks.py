"""Re-execute the chapter's notebooks so that a rerun in the same environment gives the same bytes.

A notebook is executed top to bottom in a fresh kernel of the current interpreter (not whatever
``python3`` kernelspec a user has installed), then normalised:

- no timing metadata (``record_timing=False``, and any left by an editor is dropped);
- the widget state is saved (``store_widget_state=True``: nbviewer and exported HTML show the
  widgets, and GitHub refuses ``metadata.widgets`` without its ``state`` key);
- adjacent outputs of one stream (stdout, stderr) are merged into one: the kernel flushes
  output on a timer, so one ``print`` can arrive as one output or as two, run to run (nbval
  merges them the same way before it compares);
- widget model ids, random uuids on every run, are renumbered in a fixed order (outputs first,
  in cell order, then the models they reference) into ids derived from the notebook's name;
- the widget state is saved as a saved explorer shows (:func:`zerolib.publish.saved_widgets.as_saved`):
  every control switched off and each explorer's note saying it is saved, not live, so the
  state drawn before the notebook runs (JupyterLab, nbviewer, an export) never looks live;
- the metadata is what JupyterLab writes when it saves the notebook in this project's
  environment (JupyterLab 4.6, ipykernel's ``python3`` kernelspec): the kernelspec's display name
  "Python 3 (ipykernel)", and the widget state's whole numbers as JavaScript writes them (``12``,
  not ``12.0``), so opening a notebook and letting autosave run rewrites nothing;
- the versions of the packages that shape the recorded bytes (PNG from matplotlib, tables from
  pandas...) are recorded in ``metadata.zerolib``, so a byte comparison knows when it is fair.

Writes are atomic and happen only when the bytes change. The checks (``is_current``,
``zerolib notebooks --check``) compare what matters, :func:`substance`: cell sources, outputs and
figures, the widget state, the metadata; not an editor's view state (collapsed outputs, scroll)
nor the kernelspec's display name, which JupyterLab rewrites to whatever kernel it ran. An
interrupted write's debris goes either way.
"""
from __future__ import annotations

import copy
import importlib.metadata
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path

import nbformat

from zerolib._io import write_files
from zerolib.paths import NOTEBOOK_DIR
from zerolib.publish.saved_widgets import as_saved

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# ipykernel's kernelspec (ipykernel/kernelspec.py, get_kernel_dict): JupyterLab writes its
# display name into the notebook as soon as the kernel starts.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# Cell metadata an editor writes for its view (collapsed or scrolled outputs, hidden sources,
# trust): not what a notebook says.
VIEW_STATE_KEYS = ("collapsed", "scrolled", "jupyter", "trusted")
# Packages whose versions change the recorded bytes (PNG drawing and encoding, tables, reprs).
VERSIONED_PACKAGES = ("matplotlib", "pillow", "numpy", "pandas", "ipywidgets")
# Namespace of the deterministic widget ids (uuid5 of "<notebook stem>/<index>").
_WIDGET_NAMESPACE = uuid.UUID("6f1d4c1e-3c64-5d1b-9a51-7a65726f6c69")
_REFERENCE = "IPY_MODEL_"


def find_notebooks(names: Iterable[str] = (), directory: str | Path | None = None) -> list[Path]:
    """The notebooks to run: all ``*.ipynb`` in ``directory``, or the ones ``names`` pick.

    A name is a path to an ``.ipynb`` file, a notebook's file name or stem
    (``01-bytes-per-parameter``), or its number (``01``).
    """
    directory = Path(directory) if directory is not None else NOTEBOOK_DIR
    available = sorted(directory.glob("*.ipynb")) if directory.is_dir() else []
    names = list(names)
    if not names:
        if not available:
            raise ValueError(f"no notebooks (*.ipynb) found in {directory}")
        return available
    chosen: list[Path] = []
    for name in names:
        if not isinstance(name, (str, os.PathLike)):
            raise TypeError(f"notebook names must be strings, got {type(name).__name__}")
        text = os.fspath(name)
        path = Path(text)
        if path.suffix == ".ipynb" and path.is_file():
            match = [path]
        else:
            stem = path.name.removesuffix(".ipynb")
            match = [p for p in available if stem in (p.stem, p.stem.split("-", 1)[0])]
        if len(match) != 1:
            known = ", ".join(p.stem for p in available) or "none"
            raise ValueError(f"notebook must be a path to an .ipynb file or one of {known} "
                             f"(or its number), got {text!r}")
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


def _current_env_kernel_manager():
    """A kernel manager class that always starts ipykernel in this interpreter."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class CurrentEnvKernelSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())

    class CurrentEnvKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _kernel_spec_manager_default(self):
            return CurrentEnvKernelSpecs(data_dir=self.data_dir)

        @default("transport_encryption")
        def _transport_encryption_default(self):
            # CurveZMQ keys when pyzmq has them: the kernel then has no plain-TCP warning to print.
            import zmq
            return "auto" if zmq.has("curve") else "disabled"

    return CurrentEnvKernelManager


def execute(nb: nbformat.NotebookNode, cwd: str | Path, timeout: int = 600) -> nbformat.NotebookNode:
    """Execute a copy of ``nb`` top to bottom in a fresh kernel; raises on the first error."""
    from nbclient import NotebookClient

    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)  # state of an earlier run must not outlive it
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", record_timing=False,
        store_widget_state=True, kernel_manager_class=_current_env_kernel_manager(),
        resources={"metadata": {"path": str(cwd)}})
    return client.execute()


def _widget_view_ids(nb) -> list[str]:
    ids = []
    for cell in nb.cells:
        for output in cell.get("outputs", ()):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view and view.get("model_id") not in ids:
                ids.append(view["model_id"])
    return ids


def _references(value) -> list[str]:
    """Model ids referenced (``IPY_MODEL_<id>``) anywhere in a widget state, in order."""
    if isinstance(value, str):
        return [value[len(_REFERENCE):]] if value.startswith(_REFERENCE) else []
    if isinstance(value, dict):
        return [ref for key in sorted(value) for ref in _references(value[key])]
    if isinstance(value, (list, tuple)):
        return [ref for item in value for ref in _references(item)]
    return []


def widget_order(nb) -> list[str]:
    """Every widget model id in a fixed order: displayed views first (cell order), each followed
    depth-first by the models it references; then models never displayed, in creation order."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    order: list[str] = []
    seen: set[str] = set()

    def visit(model_id):
        if model_id in seen:
            return
        seen.add(model_id)
        order.append(model_id)
        for ref in _references(state.get(model_id, {}).get("state", {})):
            visit(ref)

    for model_id in [*_widget_view_ids(nb), *state]:
        visit(model_id)
    return order


def _replace_ids(value, pattern: re.Pattern, new_ids: dict[str, str]):
    if isinstance(value, str):
        return pattern.sub(lambda m: new_ids[m.group(0)], value)
    if isinstance(value, dict):
        return type(value)((_replace_ids(k, pattern, new_ids), _replace_ids(v, pattern, new_ids))
                           for k, v in value.items())
    if isinstance(value, list):
        return [_replace_ids(item, pattern, new_ids) for item in value]
    return value


def renumber_widgets(nb: nbformat.NotebookNode, namespace: str) -> nbformat.NotebookNode:
    """A copy of ``nb`` whose widget model ids are uuid5(``namespace``/index) in widget_order."""
    order = widget_order(nb)
    if not order:
        return copy.deepcopy(nb)
    new_ids = {old: uuid.uuid5(_WIDGET_NAMESPACE, f"{namespace}/{index}").hex
               for index, old in enumerate(order)}
    pattern = re.compile("|".join(re.escape(old) for old in sorted(order, key=len, reverse=True)))
    return nbformat.from_dict(_replace_ids(nb, pattern, new_ids))


def package_versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in VERSIONED_PACKAGES}


def _as_javascript_writes(value):
    """``value`` with whole floats as ints: JupyterLab's JSON comes from JavaScript, which has one
    number type and writes 12.0 as 12."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return type(value)((k, _as_javascript_writes(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_as_javascript_writes(item) for item in value]
    return value


def as_jupyterlab_saves(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` with the metadata JupyterLab writes on saving it (see the module doc):
    ipykernel's kernelspec and the widget state's numbers as JavaScript writes them."""
    nb = copy.deepcopy(nb)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    if "widgets" in nb.metadata:
        nb.metadata["widgets"] = nbformat.from_dict(_as_javascript_writes(nb.metadata["widgets"]))
    return nb


def substance(nb: nbformat.NotebookNode) -> dict:
    """What the checks compare: every cell's type, id, source, tags and other metadata (without
    :data:`VIEW_STATE_KEYS`), execution count and outputs (figures included), and the notebook's
    metadata without the kernelspec's display name. Numbers compare by value (12 == 12.0)."""
    metadata = copy.deepcopy(dict(nb.metadata))
    metadata["kernelspec"] = {k: v for k, v in metadata.get("kernelspec", {}).items()
                              if k != "display_name"}
    cells = [{"cell_type": cell.cell_type, "id": cell.get("id"), "source": cell.source,
              "metadata": {k: v for k, v in cell.metadata.items() if k not in VIEW_STATE_KEYS},
              "execution_count": cell.get("execution_count"), "outputs": cell.get("outputs"),
              "attachments": cell.get("attachments")} for cell in nb.cells]
    return {"nbformat": (nb.nbformat, nb.nbformat_minor), "metadata": metadata, "cells": cells}


def coalesce_streams(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """``nb`` with each run of adjacent outputs of one stream merged into one (in place)."""
    for cell in nb.cells:
        merged = []
        for output in cell.get("outputs", ()):
            last = merged[-1] if merged else None
            if (last is not None and output.output_type == last.output_type == "stream"
                    and output.name == last.name):
                last.text += output.text
            else:
                merged.append(output)
        if cell.cell_type == "code":
            cell.outputs = merged
    return nb


def normalise(nb: nbformat.NotebookNode, namespace: str) -> nbformat.NotebookNode:
    """Stable ids, the widget state as saved explorers show, adjacent pieces of one stream
    merged, no timing metadata, the metadata JupyterLab writes, recorded package versions."""
    nb = coalesce_streams(as_jupyterlab_saves(as_saved(renumber_widgets(nb, namespace))))
    nb.metadata["zerolib"] = {"executed_with": package_versions()}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    nbformat.validate(nb)
    return nb


def notebook_bytes(nb: nbformat.NotebookNode) -> bytes:
    """The file's bytes, as nbformat writes them (sorted keys, one-space indent, final newline)."""
    text = nbformat.writes(nb)
    return (text if text.endswith("\n") else text + "\n").encode("utf-8")


def rerun(path: str | Path, timeout: int = 600) -> bytes:
    """The bytes ``path`` has after a deterministic re-execution (nothing is written)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    return notebook_bytes(normalise(execute(nb, path.parent, timeout), path.stem))


def refresh(path: str | Path, timeout: int = 600) -> bool:
    """Re-execute ``path`` in place; True when its bytes changed (only then is it written).

    Either way, temporary files an interrupted earlier write of ``path`` left are removed.
    """
    path = Path(path)
    [(_, status)] = write_files({path.name: rerun(path, timeout)}, root=path.parent)
    return status == "wrote"


def same_substance(a: bytes, b: bytes) -> bool:
    """True when two notebook files say the same (:func:`substance`), whatever their bytes."""
    return substance(nbformat.reads(a.decode("utf-8"), as_version=4)) == substance(
        nbformat.reads(b.decode("utf-8"), as_version=4))


def is_current(path: str | Path, timeout: int = 600) -> bool:
    """True when re-executing ``path`` would change nothing of substance (:func:`substance`): an
    editor's save that rewrote only view state or the kernel's display name does not count."""
    path = Path(path)
    return same_substance(path.read_bytes(), rerun(path, timeout))
