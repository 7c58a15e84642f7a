"""Core arithmetic: 10**6 (params, workers, stage) points through the array API versus the
seed's dict-and-loop form in pure Python, measured in the same run (medians)."""
from __future__ import annotations

import numpy as np
import pandas as pd
from timing import median_seconds, size

from zerolib.core.memory.accounting import model_state

POINTS = size(10**6, 10**3)


def seed_loop(params, gpus, stages):
    """The handbook seed's form: a dict of widths and a Python loop per point."""
    bytes_per_parameter = {"parameters": 2, "gradients": 2, "optimizer": 4 + 4 + 4}
    partitioned = {0: set(), 1: {"optimizer"}, 2: {"optimizer", "gradients"},
                   3: {"optimizer", "gradients", "parameters"}}
    totals = []
    for parameters, workers, stage in zip(params, gpus, stages):
        parts = {}
        for name, width in bytes_per_parameter.items():
            divisor = workers if name in partitioned[stage] else 1
            parts[name] = parameters * width / divisor / 1_000_000_000
        totals.append(sum(parts.values()))
    return totals


def main():
    rng = np.random.default_rng(0)
    params = rng.integers(10**6, 10**12, POINTS)
    gpus = rng.integers(1, 4097, POINTS)
    stages = rng.integers(0, 4, POINTS)
    as_lists = params.tolist(), gpus.tolist(), stages.tolist()

    array_s = median_seconds(lambda: model_state(params, gpus, stages).total, 15)
    loop_s = median_seconds(lambda: seed_loop(*as_lists), 3)
    # Same numbers (the seed divides exactly; zerolib pads to whole elements per worker).
    check = model_state(params[:1000], gpus[:1000], stages[:1000]).total / 1e9
    assert np.allclose(seed_loop(*(a[:1000] for a in as_lists)), check, rtol=1e-6)
    columns = model_state(params, gpus, stages).as_dict()  # every category, computed once
    frame_s = median_seconds(lambda: pd.DataFrame({"params": params, "gpus": gpus, "stage": stages,
                                                   **columns}), 7)
    print(f"core-vs-seed-loop: {loop_s / array_s:.0f}x (10^6 points: array API {array_s * 1e3:.1f} ms "
          f"vs seed dict-and-loop {loop_s * 1e3:.0f} ms, medians; target >= 30x and < 50 ms)")
    print(f"core-dataframe: {frame_s / array_s:.2f}x (building the tidy DataFrame from 10^6 points: "
          f"{frame_s * 1e3:.1f} ms vs the arithmetic {array_s * 1e3:.1f} ms; timed on its own)")


if __name__ == "__main__":
    main()
