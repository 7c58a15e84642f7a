"""One answer is fast too: ``zl.estimate(7e9, 64)`` (every stage of one setting, as a user's
loop calls it) against the seed's plain-Python loop over the same four stages, and the
command line's start-up against ``python -c "import numpy"``; all in the same run, medians."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_core import seed_loop
from timing import median_seconds, size

import zerolib as zl

ROOT = Path(__file__).resolve().parents[1]
CALLS = size(2000, 10)   # calls per timed batch
REPEATS = 15             # batches (the median is reported)
PROCESSES = size(9, 1)   # fresh interpreters per command
COMMANDS = {"estimate": ["estimate", "--params", "7B", "--gpus", "64"], "help": ["--help"]}


def per_call(fn) -> float:
    def batch():
        for _ in range(CALLS):
            fn()
    return median_seconds(batch, REPEATS) / CALLS


def wall(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def main():
    stages = [0, 1, 2, 3]
    seed_args = ([7_000_000_000] * 4, [64] * 4, stages)
    # The same numbers: the seed's GB are zerolib's bytes / 10^9 (64 divides 7e9).
    totals = [row["total"] / 1e9 for row in zl.estimate(7e9, 64).stages]
    assert totals == seed_loop(*seed_args), (totals, seed_loop(*seed_args))
    ours, seed = per_call(lambda: zl.estimate(7e9, 64)), per_call(lambda: seed_loop(*seed_args))
    print(f"estimate-one-answer: {ours / seed:.1f}x (zl.estimate(7e9, 64) {ours * 1e6:.1f} us vs "
          f"the seed's loop over the same four stages {seed * 1e6:.1f} us, medians; target <= 5x)")

    floor_command = [sys.executable, "-c", "import numpy"]
    # The command a user types, `zerolib ...`: the script the install put beside this Python
    # (`python -m zerolib` where there is none; runpy adds about 15 ms of its own).
    script = Path(sys.executable).with_name("zerolib")
    launcher = [str(script)] if script.is_file() else [sys.executable, "-m", "zerolib"]
    print(f"cli-start: launched as {'the zerolib script' if script.is_file() else 'python -m zerolib'}")
    commands = {name: [*launcher, *args] for name, args in COMMANDS.items()}
    with tempfile.TemporaryDirectory(prefix="bench-start-") as cache:
        # Bytecode cached as a user's install has it (in a scratch folder, not the checkout),
        # even where the environment turns caching off: start-up, not compilation, is timed.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        for command in (floor_command, *commands.values()):
            wall(command, env)   # warm the file cache and write the bytecode
        runs = {"floor": [], **{name: [] for name in commands}}
        for _ in range(PROCESSES):   # alternately, so that load on the machine hits both sides
            runs["floor"].append(wall(floor_command, env))
            for name, command in commands.items():
                runs[name].append(wall(command, env))
    floor = statistics.median(runs["floor"])
    for name, args in COMMANDS.items():
        took = statistics.median(runs[name])
        # Paired: each run against the floor's run just before it, so that a moment of load
        # on the machine falls on both sides of one ratio; the median of those ratios.
        paired = statistics.median(t / f for t, f in zip(runs[name], runs["floor"]))
        print(f"cli-start-{name}: {paired:.2f}x (zerolib {' '.join(args)} {took * 1e3:.0f} ms "
              f"vs python -c 'import numpy' {floor * 1e3:.0f} ms, medians; the median of paired "
              f"ratios; target <= 1.5x)")

if __name__ == "__main__":
    main()
