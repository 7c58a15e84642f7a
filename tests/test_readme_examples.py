"""Every command-line example in README.md runs as printed, right after the set-up (exit 0, no
error output): a README whose examples fail is the first thing a newcomer meets."""
from __future__ import annotations

import shlex

import pytest
from cli_support import run
from conftest import REPO, documentation_text

# Long-running or server commands the README describes in prose; their own tests cover them.
NOT_HERE = {"lab", "app", "html", "notebooks", "validate", "validate-communication", "measure-deepspeed",
            "figures"}


def readme_examples() -> list[str]:
    lines = documentation_text().splitlines()
    return [line.removeprefix("$ ") for line in lines
            if line.startswith("$ .venv/bin/zerolib ") and shlex.split(line)[2] not in NOT_HERE]


def test_the_readme_has_examples():
    assert len(readme_examples()) >= 10


@pytest.mark.parametrize("command", readme_examples())
def test_readme_example_runs(capsys, command):
    status, out, err = run(capsys, *shlex.split(command)[1:])
    assert (status, err) == (0, ""), err
    assert out.strip()


def test_the_readme_reads_in_five_minutes():
    # At most 2,500 words (about ten minutes aloud, five skimmed); the reference lives in docs/.
    assert len((REPO / "README.md").read_text(encoding="utf-8").split()) <= 2500


def test_every_page_the_readme_points_to_exists():
    import re
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for target in re.findall(r"\]\(((?:docs|data|notebooks)/[^)#]+)\)", readme):
        assert (REPO / target).exists(), target


def test_the_readme_python_runs():
    # The README's Python block, as printed: the run, its estimate, the plan of it and a row's run
    import re
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", readme, re.S)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    answer, best, run = scope["answer"], scope["best"], scope["run"]
    assert answer.run == run and len(best.fits) > 0
    assert best.run(best.fits.iloc[0]).model == run.model
