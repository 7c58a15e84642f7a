"""The expert-parallel MoE layer's all-to-alls beside zerolib's prediction, every byte explained.

The run (``expert_parallel_run``, needs PyTorch) puts :data:`TINY_MOE`'s one MoE layer on W gloo
ranks, E = W: each rank holds experts / W of its experts, routes its own T = s x b tokens top-k,
and moves them with ``torch.distributed.all_to_all_single`` (dispatch, then combine; the
backward pass runs the reverse all-to-all of each). The profiler counts what each rank hands to
every ``gloo:all_to_all`` (:mod:`~zerolib.crosscheck.validation.collective_count`).

zerolib's prediction per rank is :func:`zerolib.core.step.expert_parallel_traffic.expert_traffic`:
4 calls per MoE layer per micro-batch, each handing the rows the GPU routes x hidden x the
activation width. Two routings are run:

- ``capacity``: factor c, every expert a buffer of ceil(c k T / X) rows from each rank, padded
  (GShard's, DeepSpeed-MoE's): the buffers have fixed sizes, so every call hands exactly the
  prediction whatever the router chose;
- ``dropless``: each rank sends exactly its T x k routed rows, split by destination as the
  router chose. Two mechanisms, both sized by the run's own numbers:

  * ``split-sizes-exchange``: before the dispatch each rank tells the others how many rows it
    will send each of their experts, one all-to-all of X int64 counts (8 X bytes, X the routed
    experts); Megatron-LM's dispatcher exchanges the same tokens-per-expert counts;
  * ``routing-imbalance``: the combine forward and the dispatch backward hand the rows this rank
    *received* (R), not the T x k it sent; zerolib's uniform routing takes R = T k. The
    difference, 2 (R - T k) x h x width per layer, sums to zero over the ranks.

Plain Python: the tests check the record without PyTorch.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.step.expert_parallel_traffic import expert_traffic

ELEMENT_BYTES = 4          # the run computes in fp32 (gloo on the CPU)
COUNT_BYTES = 8            # int64 split sizes
ROUTINGS = ("capacity", "dropless")
CAPACITY_FACTOR = 1.25

# 8 experts so both 2 and 4 ranks hold whole experts; top-2 as Mixtral.
TINY_MOE = TransformerConfig(
    "tiny-moe", hidden=16, layers=1, heads=2, kv_heads=2, ffn_hidden=24, vocab=64,
    max_positions=32, tied_embeddings=False, gated_mlp=True, norm="rmsnorm",
    position_embedding="rotary", experts=8, experts_per_token=2,
    source="zerolib's expert-parallel validation model")


@dataclass(frozen=True)
class MoeShape:
    seq_len: int = 12
    micro_batch: int = 3


SHAPE = MoeShape()
MEASURED_COLUMNS = ("routing", "workers", "rank", "kind", "measured_calls", "measured_bytes",
                    "received_rows")
COLUMNS = ("routing", "workers", "rank", "kind", "measured_calls", "measured_bytes",
           "predicted_calls", "predicted_bytes", "difference_bytes", "explained_bytes", "effects",
           "explanation")


def predicted(routing: str, workers: int) -> tuple[int, int, int]:
    """(calls, bytes handed per step, rows per call) per rank: zerolib's prediction."""
    factor = CAPACITY_FACTOR if routing == "capacity" else None
    traffic = expert_traffic(TINY_MOE, SHAPE.seq_len, SHAPE.micro_batch, workers,
                             options=ActivationOptions(capacity_factor=factor,
                                                       element_bytes=ELEMENT_BYTES))
    return traffic.calls, traffic.step_handed_bytes, traffic.rows


def _row(measured: dict) -> dict:
    routing, workers = measured["routing"], int(measured["workers"])
    calls, handed, rows = predicted(routing, workers)
    effects, extra_calls = [], 0
    if routing == "dropless":
        effects.append(("split-sizes-exchange", COUNT_BYTES * TINY_MOE.experts * TINY_MOE.sparse_layers,
                        f"one all-to-all of {TINY_MOE.experts} int64 rows-per-expert counts per layer"))
        extra_calls = TINY_MOE.sparse_layers
        imbalance = 2 * (int(measured["received_rows"]) - rows) * TINY_MOE.hidden * ELEMENT_BYTES
        effects.append(("routing-imbalance", imbalance,
                        f"combine forward and dispatch backward hand the {measured['received_rows']} "
                        f"rows received, not {rows}"))
    difference = int(measured["measured_bytes"]) - handed
    explained = sum(b for _, b, _ in effects)
    shown = [e for e in effects if e[1] != 0]
    parts = [f"{why} ({b:+,} B)" for _, b, why in shown]
    if difference != explained:
        parts.append(f"UNEXPLAINED ({difference - explained:+,} B)")
    text = "; ".join(parts) or "matches"
    return {**{k: measured[k] for k in ("routing", "workers", "rank", "kind", "measured_calls",
                                         "measured_bytes")},
            "predicted_calls": calls + extra_calls, "predicted_bytes": handed,
            "difference_bytes": difference, "explained_bytes": explained,
            "effects": " ".join(key for key, _, _ in shown), "explanation": text}


def compare_expert_parallel(measured: pd.DataFrame) -> pd.DataFrame:
    """One row per routing, worker count and rank: measured beside predicted, explained."""
    rows = [_row(record) for record in measured.to_dict("records")]
    return pd.DataFrame(rows, columns=list(COLUMNS))
