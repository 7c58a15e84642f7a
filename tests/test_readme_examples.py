"""Every command-line example in README.md runs as printed, right after the set-up (exit 0, no
error output): a README whose examples fail is the first thing a newcomer meets."""
from __future__ import annotations

import shlex

import pytest
from cli_support import run
from conftest import REPO

# Long-running or server commands the README describes in prose; their own tests cover them.
NOT_HERE = {"lab", "app", "html", "notebooks", "validate", "validate-communication", "measure-deepspeed",
            "figures"}


def readme_examples() -> list[str]:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    return [line.removeprefix("$ ") for line in lines
            if line.startswith("$ .venv/bin/zerolib ") and shlex.split(line)[2] not in NOT_HERE]


def test_the_readme_has_examples():
    assert len(readme_examples()) >= 10


@pytest.mark.parametrize("command", readme_examples())
def test_readme_example_runs(capsys, command):
    status, out, err = run(capsys, *shlex.split(command)[1:])
    assert (status, err) == (0, ""), err
    assert out.strip()
