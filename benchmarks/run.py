"""Run every benchmark of the project: ``python benchmarks/run.py``.

Each ``benchmarks/bench_*.py`` runs in its own interpreter (so import costs are measured
fresh) and prints one line per benchmark:
``NAME: RATIOx (WHAT IS COMPARED; target TARGET)``.
The machines are shared and noisy: every figure is a median over repeats, and each ratio is
measured against its baseline within the same run.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


USAGE = """usage: python benchmarks/run.py [NAME ...]

Runs every benchmarks/bench_*.py (or those whose name contains a NAME) in a fresh interpreter;
each prints NAME: RATIOx (WHAT IS COMPARED; target TARGET), medians measured in the same run."""


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(USAGE)
        return 0
    selected = [a for a in argv if not a.startswith("-")]
    status = 0
    for script in sorted(HERE.glob("bench_*.py")):
        if selected and not any(s in script.stem for s in selected):
            continue
        result = subprocess.run([sys.executable, str(script)], cwd=HERE.parent)
        status = status or result.returncode
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
