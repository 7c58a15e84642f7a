"""Where the chapter's folders are: the checkout that holds this package.

zerolib is installed in editable mode from its repository (see the README), so figures/,
data/ and notebooks/ sit beside the zerolib/ folder.
"""
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"

# The chapter's three parts, in reading order (notebook stems in notebooks/): a main path read in
# one sitting, optional notebooks that each stand on their own, and the appendix of checks.
INDEX = "00-index"
MAIN_PATH = ("01-bytes-per-parameter", "02-memory-vs-gpu-count", "03-memory-vs-model-size",
             "04-will-it-fit", "05-the-price-of-zero", "06-when-zero-is-not-enough")
GOING_FURTHER = ("07-shard-groups-and-offload", "08-zero-beside-model-parallelism",
                 "09-size-your-own-model", "10-experts-and-other-architectures")
APPENDIX = ("11-appendix-papers-and-other-systems", "12-appendix-real-runs")
CHAPTER = (INDEX, *MAIN_PATH, *GOING_FURTHER, *APPENDIX)


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
