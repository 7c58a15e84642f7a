"""Run every benchmark of the project: ``python benchmarks/run.py``.

Each ``benchmarks/bench_*.py`` runs in its own interpreter (so import costs are measured
fresh) and prints one line per benchmark:
``NAME: RATIOx (WHAT IS COMPARED; target TARGET)``.
The machines are shared and noisy: every figure is a median over repeats, and each ratio is
measured against its baseline within the same run.

``--smoke`` runs each benchmark once at a small size (see ``timing.py``), as CI does: it fails
when a benchmark raises or its two sides stop agreeing, never on a ratio. Under
``ZEROLIB_REQUIRE_OPTIONAL=1`` a benchmark that skips for want of an optional part fails too.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


USAGE = """usage: python benchmarks/run.py [--smoke] [NAME ...]

Runs every benchmarks/bench_*.py (or those whose name contains a NAME) in a fresh interpreter;
each prints NAME: RATIOx (WHAT IS COMPARED; target TARGET), medians measured in the same run.
--smoke: each once at a small size; fails on an exception or a broken equality, not on a ratio."""


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(USAGE)
        return 0
    smoke = "--smoke" in argv
    selected = [a for a in argv if not a.startswith("-")]
    env = dict(os.environ, ZEROLIB_BENCH_SMOKE="1" if smoke else "0")
    required = os.environ.get("ZEROLIB_REQUIRE_OPTIONAL", "") not in ("", "0")
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        if selected and not any(s in script.stem for s in selected):
            continue
        start = time.monotonic()
        result = subprocess.run([sys.executable, str(script)], cwd=HERE.parent, env=env,
                                stdout=subprocess.PIPE, text=True)
        print(result.stdout, end="", flush=True)
        skipped = ": skipped (" in result.stdout
        if result.returncode != 0 or (smoke and required and skipped):
            failed.append(script.stem)
        if smoke:
            verdict = ("failed" if script.stem in failed else
                       "skipped" if skipped else "ran")
            print(f"smoke {script.stem}: {verdict} in {time.monotonic() - start:.0f} s", flush=True)
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
