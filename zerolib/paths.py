"""Where the chapter's folders are: the checkout that holds this package.

zerolib is installed in editable mode from its repository (see the README), so figures/,
data/ and notebooks/ sit beside the zerolib/ folder.
"""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = REPO_ROOT / "data"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
