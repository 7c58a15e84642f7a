"""Group traffic: 10**6 (params, GPUs, shard group, stage) settings through the array API versus
a plain-Python loop over the same settings computing the same bytes, in the same run (medians).

Both sides give, per setting, the bytes one GPU sends in each collective kind and the bytes
that leave one node, for mixed-precision Adam on nodes of 8 GPUs with a flat buffer; the check
below compares them exactly. The target is lower than the volume sweep's 30x: the array side
also checks, per setting, that the group divides the GPUs and sits inside a node or spans whole
nodes (three integer divisions the loop, given valid settings, skips).
"""
from __future__ import annotations

import numpy as np
from timing import median_seconds, size

from zerolib.core.memory.placement import Placement
from zerolib.core.step.traffic import flat_traffic

POINTS = size(10**6, 10**3)
WIDTH = 2          # bytes per element: 16-bit parameters and gradients
PER_NODE = 8


def ceil_div(a, b):
    return -(-a // b)


def python_loop(params, gpus, groups, stages):
    """The same arithmetic one setting at a time: (all-reduce, reduce-scatter, all-gather sent,
    bytes leaving a node)."""
    out = []
    for p, n, g, stage in zip(params, gpus, groups, stages):
        r = n // g
        shard = ceil_div(p, g)
        in_group = (g - 1) * shard * WIDTH
        across = 2 * (r - 1) * ceil_div(shard, r) * WIDTH
        if stage == 0:
            reduce = 2 * (n - 1) * ceil_div(p, n) * WIDTH if n > 1 else 0
            sent = (reduce, 0, 0)
            crossing = reduce if n > PER_NODE else 0
        else:
            gathers = 2 if stage == 3 else 1
            sent = (across, in_group, gathers * in_group)
            crossing = (in_group * (1 + gathers) if g > PER_NODE else 0) + (
                min(g, PER_NODE) * across if ceil_div(n, max(g, PER_NODE)) > 1 else 0)
        out.append((*sent, crossing))
    return out


def array_api(params, gpus, groups, stages):
    result = flat_traffic(params, gpus, stages, "mixed-adam", groups, Placement(gpus_per_node=PER_NODE))
    kinds = result.by_kind("sent")
    return kinds["all_reduce"], kinds["reduce_scatter"], kinds["all_gather"], result.total_cross_node


def main():
    rng = np.random.default_rng(0)
    params = rng.integers(10**6, 10**12, POINTS)
    gpus = PER_NODE * 2 ** rng.integers(0, 10, POINTS)          # 8 to 4,096 GPUs, whole nodes
    groups = 2 ** rng.integers(0, 13, POINTS)
    groups = np.minimum(groups, gpus)                           # powers of two: divide the node
    stages = rng.integers(0, 4, POINTS)
    as_lists = params.tolist(), gpus.tolist(), groups.tolist(), stages.tolist()

    looped = np.array(python_loop(*as_lists), dtype=np.int64)
    assert np.array_equal(np.stack(array_api(params, gpus, groups, stages), axis=1), looped)
    array_s = median_seconds(lambda: array_api(params, gpus, groups, stages), 5)
    loop_s = median_seconds(lambda: python_loop(*as_lists), 3)
    print(f"group-traffic-sweep: {loop_s / array_s:.0f}x (10^6 (params, GPUs, shard group, stage) "
          f"settings, bytes sent per collective kind and leaving a node: array API "
          f"{array_s * 1e3:.0f} ms vs a plain-Python loop {loop_s * 1e3:.0f} ms, medians; "
          "target >= 20x)")


if __name__ == "__main__":
    main()
