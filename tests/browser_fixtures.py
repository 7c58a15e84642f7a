"""The browser tests' shared fixtures: Debian's Chromium (or a skip / failure saying how to
install it) and one Playwright driver per module. A test module imports the ones it uses."""
from __future__ import annotations

import pytest
from browser_support import INSTALL_CHROMIUM, INSTALL_PLAYWRIGHT, find_chromium
from conftest import missing_optional, optional_import


@pytest.fixture(scope="module")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        missing_optional(f"Chromium is not installed: {INSTALL_CHROMIUM}")
    return path


@pytest.fixture(scope="module")
def playwright(chromium_path):
    sync_api = optional_import("playwright.sync_api", INSTALL_PLAYWRIGHT)
    with sync_api.sync_playwright() as driver:
        yield driver
