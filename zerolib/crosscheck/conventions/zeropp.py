"""The ZeRO++ blog's cross-node communication volume, ZeRO against ZeRO++ (3M -> 0.75M).

Source: the DeepSpeed team's ZeRO++ blog (Microsoft Research, June 2023; DeepSpeed
``blogs/zeropp``), the table "Communication Volume": per step, the forward all-gather on
weights, the backward all-gather on weights and the backward reduce-scatter on gradients cross
the nodes with M, M and M under ZeRO (stage 3), 0.5M, 0 and 0.25M under ZeRO++, M the model's
16-bit size. Transcribed in ``data/zeropp_cross_node.csv`` (see ``data/zeropp.md``).

The blog's convention: the bytes crossing between nodes, per node, each collective counted as
its whole buffer (the many-GPU limit). zerolib counts the bytes that leave one node exactly
(:mod:`zerolib.core.step.traffic`, ``cross_node``): a ring over n GPUs carries (n - 1)/n of
the buffer across each node boundary, qgZ's all-to-all across n nodes (n - 1)/n of the node's
partial sums. Dividing zerolib's count by that factor reproduces every cell exactly, for a
parameter count that splits evenly (no padding).
"""
from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType

import pandas as pd

from zerolib.core.inputs import check_gpus, check_params, check_single
from zerolib.core.memory.placement import Placement
from zerolib.core.step.traffic import traffic
from zerolib.crosscheck.conventions.common import Printed, exact, frame, read_transcription, row

SOURCE = "ZeRO++ blog"
CSV = "zeropp_cross_node.csv"
BLOG_COLUMNS = ("forward_all_gather", "backward_all_gather", "gradient_reduce_scatter")
COLUMNS = ("system", *BLOG_COLUMNS, "total")
SLOTS_PER_COLUMN = MappingProxyType({   # zerolib's slots behind each column of the blog's table
    "forward_all_gather": ("forward_all_gather",),
    "backward_all_gather": ("backward_all_gather",),
    "gradient_reduce_scatter": ("gradient_reduce_scatter", "gradient_all_to_all_node",
                                "gradient_all_to_all_nodes"),
})
# The blog's example-free table, checked at an example setting: 64 GPUs in 4 nodes of 16 (the
# DeepSpeed ZeRO++ tutorial's nodes of 16 V100) and 7 x 10^9 parameters, which split evenly.
GPUS, GPUS_PER_NODE, PARAMS = 64, 16, 7_000_000_000
DIFFERENCES: Mapping[str, str] = MappingProxyType({
    "ring-factor": "the blog counts each collective's whole buffer, the limit for many GPUs; a "
                   "ring over n GPUs (or qgZ's all-to-all over n nodes) sends (n - 1)/n of it",
})


def load(data_dir=None) -> pd.DataFrame:
    return read_transcription(data_dir, CSV, COLUMNS, COLUMNS, "the ZeRO++ blog's volume table")


def _in_m(printed: str) -> Decimal:
    """'0.25M' -> 0.25, 'M' -> 1, '0' -> 0 (multiples of M as printed)."""
    text = printed.strip()
    if text.endswith("M"):
        return Decimal(text[:-1] or "1")
    return Decimal(text)


def system_traffic(system: str, gpus: int = GPUS, gpus_per_node: int = GPUS_PER_NODE,
            params: int = PARAMS):
    """zerolib's stage-3 traffic for the blog's two systems: ZeRO, or ZeRO++ (hpZ over a node,
    qwZ, qgZ)."""
    if system not in ("ZeRO", "ZeRO++"):
        raise ValueError(f"system must be 'ZeRO' or 'ZeRO++', got {system!r}")
    plus = system == "ZeRO++"
    return traffic(params, gpus, 3, "mixed-adam", placement=Placement(
        hpz_partition=gpus_per_node if plus else 1, qwz=plus, qgz=plus, gpus_per_node=gpus_per_node))


def comparison(gpus: int = GPUS, gpus_per_node: int = GPUS_PER_NODE, params: int = PARAMS,
               data_dir=None) -> pd.DataFrame:
    """Every cell of the blog's table: zerolib's bytes leaving a node at the setting (``chapter``,
    in M) and divided by the ring factor (``reproduced``, the blog's convention)."""
    gpus = check_single(gpus, check_gpus, "gpus")
    per_node = check_single(gpus_per_node, check_gpus, "gpus_per_node")
    params = check_single(params, check_params, "params")
    if gpus % per_node or gpus <= per_node or params % gpus:
        raise ValueError("the check needs whole nodes, more than one, and params divisible by "
                         "gpus (no padding)")
    nodes = gpus // per_node
    m_bytes = 2 * params
    factors = {"forward_all_gather": Fraction(gpus - 1, gpus),
               "backward_all_gather": Fraction(gpus - 1, gpus),
               "gradient_reduce_scatter": Fraction(gpus - 1, gpus)}
    rows = []
    for record in load(data_dir).to_dict("records"):
        system = record["system"]
        result = system_traffic(system, gpus, per_node, params)
        if system == "ZeRO++":
            # hpZ's gather stays in the node; qgZ crosses once, from node to node.
            factors = {**factors, "backward_all_gather": Fraction(per_node - 1, per_node),
                       "gradient_reduce_scatter": Fraction(nodes - 1, nodes)}
        setting = f"{gpus} GPUs in {nodes} nodes of {per_node}, {params:,} parameters"
        total_reproduced = total_chapter = Fraction(0)
        for item in BLOG_COLUMNS:
            crossing = sum(int(result.cross_node[s]) for s in SLOTS_PER_COLUMN[item])
            chapter = Fraction(crossing, m_bytes)
            reproduced = chapter / factors[item]
            total_reproduced += reproduced
            total_chapter += chapter
            rows.append(_row(system, item, setting, record[item], reproduced, chapter))
        rows.append(_row(system, "total", setting, record["total"], total_reproduced,
                         total_chapter))
    return frame(rows)


def _row(system, item, setting, printed, reproduced: Fraction, chapter: Fraction) -> dict:
    how = ("bytes leaving one node per step (zerolib.core.step.traffic cross_node) / M, "
           "divided by the ring factor (n - 1)/n")
    shown = Printed(SOURCE, f"{system}: {item.replace('_', ' ')}", setting, printed,
                    "M (2 bytes x parameters)", value=_in_m(printed))
    return row(shown, exact(reproduced.numerator, reproduced.denominator), how,
               exact(chapter.numerator, chapter.denominator),
               "ring-factor" if chapter != reproduced else "")
