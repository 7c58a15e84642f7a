"""Shared test helpers.

Optional parts (PyTorch, Chromium) skip with an install hint on a machine without them; CI
sets ZEROLIB_REQUIRE_OPTIONAL=1, under which a missing optional part is a failure instead.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# What a reader is told: the README and the reference pages it points to.
DOCUMENTATION = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))


def documentation_text(flat: bool = False) -> str:
    """The README and every page of docs/, one text (``flat``: whitespace runs as one space)."""
    text = "\n\n".join(path.read_text(encoding="utf-8") for path in DOCUMENTATION)
    return " ".join(text.split()) if flat else text

# The browser tests' shared fixtures (chromium_path, playwright), for every test module.
pytest_plugins = ["browser_fixtures"]


def optional_required() -> bool:
    return os.environ.get("ZEROLIB_REQUIRE_OPTIONAL", "") not in ("", "0")


def missing_optional(reason: str):
    """Skip (or, under ZEROLIB_REQUIRE_OPTIONAL=1, fail) because an optional part is missing."""
    if optional_required():
        pytest.fail(f"{reason} (ZEROLIB_REQUIRE_OPTIONAL is set, so this is a failure)")
    pytest.skip(reason)


def optional_import(module_name: str, install_hint: str):
    """Import an optional module, or skip/fail with how to install it."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        missing_optional(f"{module_name} is not installed: {install_hint}")
