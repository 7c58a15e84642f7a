"""The reader's working copy of the chapter: what ``zerolib lab`` serves (docs/reading.md).

JupyterLab writes what a reader does into the notebook it serves (autosave every 120 s, Ctrl-S):
the outputs of the reader's run, whose widgets are not in the saved widget state, and new
execution counts. Served from ``notebooks/``, that changed the committed chapter: ``git status``
showed it modified and a static copy of it showed a repr line in place of each explorer. So
``zerolib lab`` serves a copy, in a folder of its own (``build/lab/`` of the repository unless
told otherwise, git-ignored):

- ``notebooks/``: every notebook of the chapter, and beside it the files the notebooks read by
  a relative path (``tests/data/``, which a notebook opens as ``../tests/data/...``);
- ``state/``: ``copies.json`` (per notebook, the SHA-256 of the committed bytes its copy was
  taken from), the signature store that marks the copies trusted, and the server's log.

:func:`prepare` brings the copy up to date on every start without losing a reader's work: a
notebook missing from the copy is copied; a copy the reader has not changed is refreshed when
the committed notebook changed (a pull); a copy the reader changed is kept, and reported when
the committed notebook changed since it was taken. ``reset=True`` removes the copy first.

Trust: JupyterLab draws widgets only in trusted outputs (ipywidgets' renderer is not "safe"),
so an untrusted notebook shows each saved explorer as its ``text/plain`` line until it is run.
The copies are the project's own executed notebooks (``zerolib notebooks`` wrote their outputs
with the code the reader runs), so :func:`prepare` signs each copy that is as committed, as
``jupyter trust`` would, in a signature store of the working copy's own, which the server is
pointed at (:func:`notary_arguments`): the reader's own Jupyter data folder is not written.
A notebook the reader saves is signed by JupyterLab when every output in it is trusted.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat.sign import NotebookNotary

from zerolib._io import atomic_write
from zerolib.paths import NOTEBOOK_DIR, REPO_ROOT

# Folders the notebooks read by a path relative to theirs (``../tests/data/x.json``), copied
# beside the working copy's notebooks/ (repository-relative).
READ_BESIDE = ("tests/data",)
STATE = "state"
MANIFEST = "copies.json"
SIGNATURES = "signatures.db"
SIGNING_KEY = "signing-key"
LOG = "jupyterlab.log"


@dataclass(frozen=True)
class WorkingCopy:
    """Where a working copy lives: ``folder`` holds ``notebooks/``, what they read, ``state/``."""

    folder: Path

    @property
    def notebooks(self) -> Path:
        return self.folder / "notebooks"

    @property
    def state(self) -> Path:
        return self.folder / STATE

    @property
    def log(self) -> Path:
        return self.state / LOG


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` did: the copy, and the notebooks (file names) it copied fresh,
    those the reader changed (kept), and of those the ones whose committed notebook changed
    since their copy was taken (``behind``)."""

    copy: WorkingCopy
    copied: tuple[str, ...]
    kept: tuple[str, ...]
    behind: tuple[str, ...]


def default_folder() -> Path:
    return REPO_ROOT / "build" / "lab"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def notary(copy: WorkingCopy) -> NotebookNotary:
    """The working copy's own notebook notary (its signature store and key under ``state/``)."""
    return NotebookNotary(db_file=str(copy.state / SIGNATURES),
                          secret_file=str(copy.state / SIGNING_KEY))


def notary_arguments(copy: WorkingCopy) -> list[str]:
    """The server's options that make it read (and write) trust in the working copy's store."""
    return [f"--NotebookNotary.db_file={copy.state / SIGNATURES}",
            f"--NotebookNotary.secret_file={copy.state / SIGNING_KEY}"]


def is_trusted(copy: WorkingCopy, path: str | Path) -> bool:
    """Whether the working copy's store holds the signature of the notebook at ``path``."""
    with notary(copy) as signer:
        return signer.check_signature(nbformat.read(path, as_version=4))


def _check_folder(folder: Path, source: Path) -> WorkingCopy:
    copy = WorkingCopy(folder)
    if copy.notebooks.resolve() == source.resolve():
        raise ValueError(f"the working copy must not be the chapter's own notebooks: {folder} "
                         f"holds {source}")
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the working copy's folder {folder} is a file")
    ours = (copy.state / MANIFEST).is_file()
    if not ours and folder.is_dir() and any(folder.iterdir()):
        raise ValueError(f"{folder} holds files but no working copy of the chapter "
                         f"({STATE}/{MANIFEST}): pick an empty or new folder")
    return copy


def _remove(copy: WorkingCopy) -> None:
    """Remove a working copy (only what :func:`prepare` made: its notebooks, state and data)."""
    for part in (copy.notebooks, copy.state, *(copy.folder / p for p in READ_BESIDE)):
        if part.is_dir():
            shutil.rmtree(part)


def _manifest(copy: WorkingCopy) -> dict[str, str]:
    try:
        recorded = json.loads((copy.state / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    taken = recorded.get("taken_from") if isinstance(recorded, dict) else None
    return {k: v for k, v in taken.items() if isinstance(v, str)} if isinstance(taken, dict) else {}


def prepare(folder: str | Path | None = None, source: str | Path | None = None,
            reset: bool = False) -> Prepared:
    """Make or bring up to date the working copy in ``folder`` (default
    :func:`default_folder`) of the notebooks in ``source`` (default ``notebooks/``) and sign the
    copies that are as committed; ``reset`` removes an earlier copy first (the reader's changes
    with it)."""
    source = Path(source) if source is not None else NOTEBOOK_DIR
    if not any(source.glob("*.ipynb")):
        raise ValueError(f"no notebooks (*.ipynb) in {source}: zerolib lab reads the chapter from "
                         f"the repository it is installed from (pip install -e)")
    copy = _check_folder(Path(folder) if folder is not None else default_folder(), source)
    if reset:
        _remove(copy)
    copy.notebooks.mkdir(parents=True, exist_ok=True)
    copy.state.mkdir(parents=True, exist_ok=True)
    taken = _manifest(copy)
    copied, kept, behind, signed = [], [], [], []
    for committed_path in sorted(source.glob("*.ipynb")):
        name = committed_path.name
        committed = committed_path.read_bytes()
        now = _digest(committed)
        target = copy.notebooks / name
        mine = target.read_bytes() if target.is_file() else None
        if mine is None or (_digest(mine) != now and taken.get(name) == _digest(mine)):
            atomic_write(target, committed)       # new, or untouched by the reader: refreshed
            copied.append(name)
        elif _digest(mine) != now:                # the reader's: kept
            kept.append(name)
            if taken.get(name) != now:
                behind.append(name)
            continue
        taken[name] = now
        signed.append(committed)
    with notary(copy) as signer:
        for data in signed:
            signer.sign(nbformat.reads(data.decode("utf-8"), as_version=4))
    for part in READ_BESIDE:
        if (REPO_ROOT / part).is_dir():
            shutil.copytree(REPO_ROOT / part, copy.folder / part, dirs_exist_ok=True)
    atomic_write(copy.state / MANIFEST,
                 json.dumps({"taken_from": dict(sorted(taken.items()))}, indent=1) + "\n")
    return Prepared(copy, tuple(copied), tuple(kept), tuple(behind))
