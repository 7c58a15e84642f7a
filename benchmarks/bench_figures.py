"""``zerolib figures`` wall time against the floor of any matplotlib + pandas program.

The floor is ``python -c "import matplotlib.pyplot, pandas"``: the cost of starting Python and
importing the plotting stack, which no figure command can avoid. Each side runs as a fresh
process, alternately, several times in this run (the command writes into a new temporary
folder each time, so every run really writes); the figures are medians.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import size

ROOT = Path(__file__).resolve().parents[1]
REPEATS = size(7, 1)
LIBRARY_ONLY = ("import sys; from pathlib import Path; from zerolib.chapter import figures; "
                "figures.write(figures.build(), Path(sys.argv[1]))")


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    floor_command = [sys.executable, "-c", "import matplotlib.pyplot, pandas"]
    wall(floor_command)  # warm the OS file cache and matplotlib's font cache
    floor, ours, library = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-figures-") as scratch:
        for run in range(REPEATS):
            floor.append(wall(floor_command))
            ours.append(wall([sys.executable, "-m", "zerolib", "figures",
                              "--out", str(Path(scratch) / f"cli{run}")]))
            # The same work without the command line (whose other subcommands import more).
            library.append(wall([sys.executable, "-c", LIBRARY_ONLY, str(Path(scratch) / f"lib{run}")]))
    ours_s, floor_s, library_s = (statistics.median(t) for t in (ours, floor, library))
    print(f"figures_command: {ours_s / floor_s:.2f}x (`zerolib figures` into a new folder, median "
          f"{ours_s:.2f} s, vs `python -c \"import matplotlib.pyplot, pandas\"`, median "
          f"{floor_s:.2f} s, {REPEATS} fresh processes each; target <= 2.5x)")
    print(f"figures_library: {library_s / floor_s:.2f}x (zerolib.chapter.figures.build + write in a fresh "
          f"process, no CLI, median {library_s:.2f} s, vs the same floor; diagnostic: the "
          f"command's cost beyond this is its imports of other subcommands; target <= 2.5x)")


if __name__ == "__main__":
    main()
