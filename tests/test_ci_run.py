"""``.ci/run``: it parses, propagates failures, and its first phase runs the README's set-up
commands exactly as the README writes them, with Chromium hidden from the browser tests."""
from __future__ import annotations

import re
import subprocess

from browser_support import find_chromium
from conftest import REPO

CI = REPO / ".ci" / "run"


def _readme_setup() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return re.search(r"```bash\n(.*?)```", readme, re.S)[1].strip().splitlines()


def test_ci_script_parses_and_stops_on_the_first_failure():
    subprocess.run(["bash", "-n", str(CI)], check=True)
    text = CI.read_text(encoding="utf-8")
    assert "set -euo pipefail" in text.splitlines()[:12]
    assert "ZEROLIB_REQUIRE_OPTIONAL=1 .venv/bin/python -m pytest" in text


def test_ci_runs_every_benchmark_once_small():
    # A benchmark nothing runs breaks unseen (bench_explorer's step-time rebuild once did).
    text = CI.read_text(encoding="utf-8")
    assert "ZEROLIB_REQUIRE_OPTIONAL=1 .venv/bin/python benchmarks/run.py --smoke" in text.splitlines()
    for script in sorted((REPO / "benchmarks").glob("bench_*.py")):
        source = script.read_text(encoding="utf-8")
        assert "from timing import" in source, f"{script.name} has no smoke size (timing.size)"


def test_ci_runs_the_readme_commands_as_written():
    result = subprocess.run(["bash", str(CI), "--readme-commands"], capture_output=True, text=True,
                            check=True, cwd=REPO)
    assert result.stdout.splitlines() == _readme_setup()
    assert len(_readme_setup()) == 2 and "pytest" in _readme_setup()[1]


def test_zerolib_chromium_none_hides_every_chromium(monkeypatch):
    monkeypatch.setenv("ZEROLIB_CHROMIUM", "none")
    assert find_chromium() is None
