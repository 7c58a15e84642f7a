"""docs/trainer-files.md: every example runs and prints what the page shows.

A ``$ .venv/bin/zerolib ...`` or ``$ zerolib ...`` line is run (the short form for the examples
that need the validate extra or show a refusal: tests/test_readme_examples.py runs the others
too, which must succeed everywhere); the lines after it (up to the next command or the end
of the block) are what it prints, in order, each whole (``...`` stands for lines left out); a
shown ``error:`` line means exit status 2 and that line on standard error, else exit 0. Python
examples (``>>>``) run as doctests.
"""
from __future__ import annotations

import doctest
import os
import shlex

import pytest
from cli_support import run
from conftest import REPO, optional_import

PAGE = REPO / "docs" / "trainer-files.md"
# configs zerolib does not read itself: transformers builds them (the validate extra)
BUILT_BY_TRANSFORMERS = ("olmoe-1b-7b.json",)


def examples() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    inside = False
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```console"
            continue
        if not inside:
            continue
        if line.startswith(("$ .venv/bin/zerolib ", "$ zerolib ")):
            found.append((line.removeprefix("$ "), []))
        elif found:
            found[-1][1].append(line)
    return found


def test_the_page_has_examples():
    assert len(examples()) >= 6


def _shown_in_order(shown: list[str], printed: list[str]) -> bool:
    at = 0
    for line in shown:
        if line == "...":
            continue
        try:
            at = printed.index(line, at) + 1
        except ValueError:
            return False
    return True


@pytest.mark.parametrize("command,shown", examples(), ids=[c for c, _ in examples()])
def test_page_example(capsys, monkeypatch, command, shown):
    if any(name in command for name in BUILT_BY_TRANSFORMERS):
        optional_import("transformers", "pip install -e '.[validate]'")
    monkeypatch.chdir(REPO)
    status, out, err = run(capsys, *shlex.split(command)[1:])
    fails = any(" error: " in line for line in shown)
    assert status == (2 if fails else 0), (out, err)
    printed = (err if fails else out).splitlines()
    if not fails:
        assert err == ""
    assert _shown_in_order(shown, printed), (out, err)


def test_page_python_examples(monkeypatch):
    monkeypatch.chdir(REPO)
    result = doctest.testfile(os.fspath(PAGE), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
