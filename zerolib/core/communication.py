"""Communication volume per training step and per worker, for each stage.

The ZeRO paper (Sec. VII) counts what each worker sends with ring collectives: a
reduce-scatter or an all-gather of Psi elements sends (N - 1) chunks of Psi / N, so
- stage 0: an all-reduce of the gradients = reduce-scatter + all-gather: about 2 Psi;
- stages 1 and 2: reduce-scatter of gradients + all-gather of updated parameters: about 2 Psi,
  the same as plain data parallelism;
- stage 3: parameters all-gathered for the forward and again for the backward pass, plus the
  gradient reduce-scatter: about 3 Psi, 1.5x the baseline.
Chunks are padded to ceil(Psi / N) elements, so the counts are whole numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zerolib.core.accounting import Layout, get_layout
from zerolib.core.inputs import broadcast, check_gpus, check_params, check_stage
from zerolib.core.intmath import ceil_div

# Per stage: the collectives of one step, each with the category whose width it moves.
COLLECTIVES = {
    0: (("gradient reduce-scatter", "gradients"), ("gradient all-gather", "gradients")),
    1: (("gradient reduce-scatter", "gradients"), ("parameter all-gather", "parameters")),
    2: (("gradient reduce-scatter", "gradients"), ("parameter all-gather", "parameters")),
    3: (("forward parameter all-gather", "parameters"),
        ("backward parameter all-gather", "parameters"),
        ("gradient reduce-scatter", "gradients")),
}


@dataclass(frozen=True)
class Volume:
    elements: np.ndarray  # elements sent per worker per step
    bytes: np.ndarray     # the same in bytes, at each collective's width


def volume(params, gpus, stage, layout: str | Layout = "mixed-adam") -> Volume:
    """Elements and bytes each worker sends in one step (broadcast over the inputs)."""
    layout = get_layout(layout)
    params, gpus, stage = broadcast(params=check_params(params), gpus=check_gpus(gpus),
                                    stage=check_stage(stage))
    per_collective = (gpus - 1) * ceil_div(params, gpus)
    elements = np.zeros(params.shape, dtype=np.int64)
    n_bytes = np.zeros(params.shape, dtype=np.int64)
    for s, collectives in COLLECTIVES.items():
        here = stage == s
        for _, category in collectives:
            bits = layout.bits_per_param(category)
            elements = elements + np.where(here, per_collective, 0)
            n_bytes = n_bytes + np.where(here, ceil_div(per_collective * bits, 8), 0)
    return Volume(elements, n_bytes)
