"""Communication volume: 10**6 (params, GPUs, stage) settings through the array API versus a
plain-Python loop over the same settings computing the same bytes, in the same run (medians).

Both sides give, per setting, the bytes one GPU sends in each collective kind (all-reduce,
reduce-scatter, all-gather) for mixed-precision Adam; the check below compares them exactly.
"""
from __future__ import annotations

import numpy as np
from timing import median_seconds, size

from zerolib.core.step.traffic import flat_traffic

POINTS = size(10**6, 10**3)
WIDTH = 2   # bytes per element: 16-bit parameters and gradients


def python_loop(params, gpus, stages):
    """The same arithmetic one setting at a time: ring chunks of ceil(P / n) elements."""
    out = []
    for p, n, stage in zip(params, gpus, stages):
        one_pass = 0 if n == 1 else (n - 1) * (-(-p // n)) * WIDTH
        if stage == 0:
            out.append((2 * one_pass, 0, 0))
        elif stage in (1, 2):
            out.append((0, one_pass, one_pass))
        else:
            out.append((0, one_pass, 2 * one_pass))
    return out


def array_api(params, gpus, stages):
    kinds = flat_traffic(params, gpus, stages, "mixed-adam").by_kind("sent")
    return kinds["all_reduce"], kinds["reduce_scatter"], kinds["all_gather"]


def main():
    rng = np.random.default_rng(0)
    params = rng.integers(10**6, 10**12, POINTS)
    gpus = rng.integers(1, 4097, POINTS)
    stages = rng.integers(0, 4, POINTS)
    as_lists = params.tolist(), gpus.tolist(), stages.tolist()

    looped = np.array(python_loop(*as_lists), dtype=np.int64)
    assert np.array_equal(np.stack(array_api(params, gpus, stages), axis=1), looped)
    array_s = median_seconds(lambda: array_api(params, gpus, stages), 11)
    loop_s = median_seconds(lambda: python_loop(*as_lists), 3)
    print(f"communication-volume-sweep: {loop_s / array_s:.0f}x (10^6 (params, GPUs, stage) "
          f"settings, bytes sent per collective kind: array API {array_s * 1e3:.0f} ms vs a "
          f"plain-Python loop {loop_s * 1e3:.0f} ms, medians; target >= 30x)")


if __name__ == "__main__":
    main()
