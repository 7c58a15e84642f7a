"""One model, one data-parallel degree, every convention: per-GPU model state per ZeRO stage.

The conventions of this package, with the ZeRO paper's (the chapter's) and DeepSpeed's estimator,
applied to one setting (by default the Ultra-Scale Playbook's: Llama-3-8B on 8 data-parallel
GPUs), as a tidy table a figure draws: one row per convention and stage it defines, in bytes.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig, get_model, largest_layer, parameter_count
from zerolib.core.inputs import check_gpus, check_single
from zerolib.core.memory.accounting import STAGES, model_state
from zerolib.core.units import GiB
from zerolib.crosscheck.conventions import megatron_distributed_optimizer as megatron
from zerolib.crosscheck.conventions import playbook, zero_infinity
from zerolib.crosscheck.deepspeed_estimator import DEEPSPEED_VERSION, estimate_zero2, estimate_zero3

CONVENTIONS = ("ZeRO paper (the chapter)", "DeepSpeed estimator", "Megatron-LM",
               "Ultra-Scale Playbook plots", "ZeRO-Infinity paper")
COLUMNS = ("convention", "stage", "bytes", "bytes_per_parameter", "counts")
# What each convention counts, in a few words (the figure's legend and the table's last column).
COUNTS: Mapping[str, str] = MappingProxyType({
    CONVENTIONS[0]: "2 + 2 + 12 B per parameter, ceil(P / N) per GPU",
    CONVENTIONS[1]: f"v{DEEPSPEED_VERSION} code: 2 + 18 / N B, + 4 B x largest layer at stage 3",
    CONVENTIONS[2]: "bf16 parameters, fp32 gradients: 18, or 6 + 12 / d B",
    CONVENTIONS[3]: "norms left out, Adam moments only (12 B), GiB rounded, then / N",
    CONVENTIONS[4]: "20 B per parameter (fp32 gradients too)",
})


def model_state_by_convention(model: str | TransformerConfig = "llama-3-8b", gpus: int = 8) -> pd.DataFrame:
    """Per convention and stage it defines: model-state bytes on one GPU (tidy).

    Megatron-LM defines stage 0 (without) and 1 (with its distributed optimizer); DeepSpeed's
    estimator stages 2 and 3 (no offload, one node of ``gpus`` GPUs); the ZeRO-Infinity paper
    stage 0 and stage 3 (its 20 bytes per parameter, partitioned). ``attrs``: model, gpus.
    """
    config = get_model(model)
    gpus = check_single(gpus, check_gpus, "gpus")
    params = parameter_count(config)
    rows = []

    def add(convention, stage, n_bytes):
        rows.append({"convention": convention, "stage": stage, "bytes": int(n_bytes),
                     "bytes_per_parameter": int(n_bytes) / params, "counts": COUNTS[convention]})

    chapter = model_state(params, gpus, list(STAGES), "mixed-adam").total
    for stage in STAGES:
        add(CONVENTIONS[0], stage, chapter[stage])
    add(CONVENTIONS[1], 2, estimate_zero2(params, gpus, 1, cpu_offload=False).per_gpu)
    add(CONVENTIONS[1], 3, estimate_zero3(params, largest_layer(config), gpus, 1, cpu_offload=False,
                                          cpu_offload_params=False).per_gpu)
    bf16 = megatron.DTYPE_LAYOUTS[("bf16", "fp32")]
    for stage in (0, 1):
        add(CONVENTIONS[2], stage, model_state(params, gpus, stage, bf16).total)
    for stage in STAGES:
        plotted = sum(playbook.zero_figure_value(config, component, 1024, stage, gpus)
                      for component in ("parameters", "gradients", "optimizer"))
        add(CONVENTIONS[3], stage, int(plotted * GiB))
    for stage in (0, 3):
        add(CONVENTIONS[4], stage, model_state(params, gpus, stage, zero_infinity.LAYOUT).total)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table.attrs.update(model=config, gpus=gpus)
    return table
