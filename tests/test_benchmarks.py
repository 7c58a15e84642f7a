"""The benchmarks' own checks hold: each compares two sides that must agree, and a side that
drifts breaks the benchmark. CI runs every benchmark once small (``benchmarks/run.py --smoke``);
this holds the step-time explorer's rebuild, which once drew the paper's schedule for an
explorer that defaults to DeepSpeed's (``AssertionError: gpus``)."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def test_the_step_time_rebuild_draws_the_explorers_engine():
    code = ("import bench_explorer as b\n"
            "from zerolib.chapter.explorers import StepTimeExplorer\n"
            "e = StepTimeExplorer()\n"
            "e._renderer.shown_kept = 0\n"
            "assert e.engine == 'deepspeed', e.engine\n"
            "b.measure(e, 'step_time', [('gpus', 8), ('engine', 'paper'), ('gpus', 64)])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO / "benchmarks",
                            env=dict(os.environ, ZEROLIB_BENCH_SMOKE="1"), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
