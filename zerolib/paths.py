"""Where the chapter's folders are: the checkout that holds this package.

zerolib is installed in editable mode from its repository (see the README), so figures/,
data/ and notebooks/ sit beside the zerolib/ folder.
"""
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def data_file(data_dir, filename: str, what: str) -> Path:
    """The path of ``filename`` in ``data_dir`` (None: the repository's ``data/``), which must
    exist; ``what`` says what the file holds, for the error message."""
    if data_dir is None:
        data_dir = DATA_DIR
    if not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"data_dir must be a path to the folder holding {filename}, "
                        f"got {type(data_dir).__name__}")
    path = Path(data_dir) / filename
    if not path.is_file():
        raise ValueError(f"data_dir {str(data_dir)!r} has no {filename} ({what})")
    return path
