"""Writing files: one atomic writer for every file zerolib produces (figures, data, notebooks, HTML).

A file is written to a temporary file in its own folder, flushed to disk, given the mode of the
file it replaces (0o644 for a new one), then renamed over the target, so a reader sees the old
bytes or the new ones, never a mixture. Temporary files are named ``.<name>.<random>.zerolib-tmp``:
a run killed mid-write can leave one behind, and the next write of the same file removes it,
whether its bytes change or not (:func:`stale_temporaries` lists them, for the ``--check``
commands; :func:`remove_stale_temporaries` clears a folder a writer owns).

:func:`write_files` writes a set of files all-or-nothing as far as a rename allows: every
temporary file is written first, then all are renamed in a row, so a kill during the slow part
(producing and writing the bytes) leaves the set as it was.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

TEMP_SUFFIX = ".zerolib-tmp"
NEW_FILE_MODE = 0o644  # published files are world-readable (mkstemp makes 0600)


def _temporaries_of(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{_glob_escape(path.name)}.*{TEMP_SUFFIX}"))


def _glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def stale_temporaries(folder: str | os.PathLike, recursive: bool = True) -> list[Path]:
    """Temporary files an interrupted zerolib write left under ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = f".*{TEMP_SUFFIX}"
    return sorted(folder.rglob(pattern) if recursive else folder.glob(pattern))


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files interrupted writes left in ``folder`` (not below it).

    For a writer that owns the folder, after its own writes: what its ``--check`` reports there
    is then gone, changed files or not. Returns the paths removed.
    """
    removed = stale_temporaries(folder, recursive=False)
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _write_temporary(path: Path, content: bytes) -> Path:
    """``content`` in a fresh temporary file beside ``path``, on disk, with the final mode."""
    for leftover in _temporaries_of(path):  # from an earlier run that was killed
        leftover.unlink(missing_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    temporary = Path(name)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(content)
            stream.flush()
            os.fsync(stream.fileno())
        mode = path.stat().st_mode & 0o777 if path.is_file() else NEW_FILE_MODE
        os.chmod(temporary, mode)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def _sync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def atomic_write(path: str | os.PathLike, content: bytes | str) -> None:
    """Replace ``path`` with ``content`` (text is written as UTF-8) in one rename."""
    write_files({Path(path): content}, only_changed=False)


def write_files(files: Mapping[str | os.PathLike, bytes | str], root: str | os.PathLike = ".",
                only_changed: bool = True) -> list[tuple[Path, str]]:
    """Write every file (paths relative to ``root``): all temporaries first, then the renames.

    With ``only_changed`` a file whose bytes are already right is not touched. Returns
    ``(path, "wrote" | "unchanged")`` per file, in the order given.
    """
    root = Path(root)
    encoded = {root / Path(relative): (content.encode("utf-8") if isinstance(content, str) else content)
               for relative, content in files.items()}
    report, pending = [], []
    try:
        for path, content in encoded.items():
            if path.is_dir():   # found before any file of the set is replaced
                raise IsADirectoryError(21, "Is a directory", str(path))
            if only_changed and path.is_file() and path.read_bytes() == content:
                for leftover in _temporaries_of(path):  # an earlier, interrupted write
                    leftover.unlink(missing_ok=True)
                report.append((path, "unchanged"))
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            pending.append((_write_temporary(path, content), path))
            report.append((path, "wrote"))
        for temporary, path in pending:
            os.replace(temporary, path)
    except BaseException:
        for temporary, _ in pending:
            temporary.unlink(missing_ok=True)
        raise
    for folder in {path.parent for _, path in pending}:
        _sync_folder(folder)
    return report
