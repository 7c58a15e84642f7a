"""Model-parallel arithmetic over a planner's sweep: Llama-2-70B on 1,024 GPUs, every tensor-
parallel degree within a node (1-8) x every pipeline degree that divides the rest x 1-64
micro-batches per step, through the vectorised functions versus one call per setting (the same
functions, scalar), measured in the same run (medians)."""
from __future__ import annotations

import numpy as np
from timing import median_seconds, size

from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.memory.model_parallel import Pipeline, parameters_per_gpu
from zerolib.core.memory.pipeline_schedule import (
    _unit_terms_cached,
    activation_bytes_per_gpu,
    stage_activation_terms,
)

MODEL, GPUS, SEQ = "llama-2-70b", 1024, 4096
OPTIONS = ActivationOptions(sequence_parallel=True, recompute="selective", flash_attention=True)


def grid():
    t = np.array([1, 2, 4, 8])
    p = np.array([n for n in range(1, 81) if GPUS % n == 0])
    m = np.arange(1, size(65, 5))
    return np.meshgrid(t, p, m, indexing="ij")


def vectorised(t, p, m):
    params = parameters_per_gpu(MODEL, t, p)
    acts = activation_bytes_per_gpu(MODEL, SEQ, 1, t, Pipeline(p, micro_batches=m), options=OPTIONS)
    return params, acts


def one_at_a_time(t, p, m):
    params, acts = [], []
    for ti, pi, mi in zip(t.ravel().tolist(), p.ravel().tolist(), m.ravel().tolist()):
        params.append(int(parameters_per_gpu(MODEL, ti, pi)))
        stages = {0, pi - 1}
        acts.append(max(sum(stage_activation_terms(MODEL, SEQ, 1, ti, Pipeline(pi, micro_batches=mi),
                                                   r, OPTIONS).values()) for r in stages))
    return params, acts


def main():
    t, p, m = grid()
    params, acts = vectorised(t, p, m)
    slow_params, slow_acts = one_at_a_time(t, p, m)
    assert params.ravel().tolist() == slow_params and acts.ravel().tolist() == slow_acts
    fast = median_seconds(lambda: vectorised(t, p, m), 15, before=_unit_terms_cached.cache_clear)
    slow = median_seconds(lambda: one_at_a_time(t, p, m), 3, before=_unit_terms_cached.cache_clear)
    print(f"model-parallel-sweep: {slow / fast:.0f}x ({t.size:,} settings: vectorised "
          f"{fast * 1e3:.1f} ms vs one call per setting {slow * 1e3:.0f} ms, medians; "
          f"target >= 20x and < 50 ms)")


if __name__ == "__main__":
    main()
