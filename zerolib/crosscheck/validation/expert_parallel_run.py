"""A real expert-parallel MoE layer on the CPU, its all-to-alls counted per rank (needs PyTorch).

``measure_expert_parallel(workers)`` starts ``workers`` processes through the shared harness
(gloo on 127.0.0.1); each holds experts / workers experts of
:data:`~zerolib.crosscheck.validation.explain_expert_parallel.TINY_MOE` (gated MLPs, the same
initial weights as the whole layer would have) and the whole router, routes its own tokens top-k,
dispatches them with ``torch.distributed.all_to_all_single`` to the ranks holding their experts,
runs them, combines the outputs back, weights them by the routing probabilities and runs a real
backward pass (the reverse all-to-all of each, as DeepSpeed-MoE's ``_AllToAll`` does). One step
after a warm-up step is counted by the profiler
(:func:`~zerolib.crosscheck.validation.collective_count.count_collectives`), under both routings
of :data:`~zerolib.crosscheck.validation.explain_expert_parallel.ROUTINGS`.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from zerolib.crosscheck.validation.collective_count import count_collectives
from zerolib.crosscheck.validation.explain_expert_parallel import (
    CAPACITY_FACTOR,
    MEASURED_COLUMNS,
    ROUTINGS,
    SHAPE,
    TINY_MOE,
    compare_expert_parallel,
)
from zerolib.crosscheck.validation.harness import join_gloo, spawn
from zerolib.crosscheck.validation.records import EXPERT_PARALLEL_FILE, with_versions, write_csv
from zerolib.crosscheck.validation.runner import versions
from zerolib.crosscheck.validation.setups import check_workers

SEED = 0


class _AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward is the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, rows, send_splits, receive_splits):
        ctx.splits = (send_splits, receive_splits)
        out = rows.new_empty((sum(receive_splits), rows.shape[1]))
        dist.all_to_all_single(out, rows.contiguous(), receive_splits, send_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, receive_splits = ctx.splits
        out = grad.new_empty((sum(send_splits), grad.shape[1]))
        dist.all_to_all_single(out, grad.contiguous(), send_splits, receive_splits)
        return out, None, None


class ExpertParallelMoE(nn.Module):
    """One MoE layer whose experts are spread over the process group's ranks."""

    def __init__(self, rank: int, workers: int):
        super().__init__()
        h, f, n = TINY_MOE.hidden, TINY_MOE.ffn_hidden, TINY_MOE.experts
        torch.manual_seed(SEED)           # every rank draws the whole layer, keeps its experts
        self.router = nn.Linear(h, n, bias=False)
        experts = [nn.ModuleDict({"gate": nn.Linear(h, f, bias=False),
                                  "up": nn.Linear(h, f, bias=False),
                                  "down": nn.Linear(f, h, bias=False)}) for _ in range(n)]
        self.local = n // workers
        self.experts = nn.ModuleList(experts[rank * self.local:(rank + 1) * self.local])
        self.workers = workers

    def _run_experts(self, rows: torch.Tensor, per_expert: list[int]) -> torch.Tensor:
        outs = []
        for expert, chunk in zip(self.experts, rows.split(per_expert)):
            outs.append(expert["down"](F.silu(expert["gate"](chunk)) * expert["up"](chunk)))
        return torch.cat(outs)

    def forward(self, tokens: torch.Tensor, routing: str) -> tuple[torch.Tensor, int]:
        """The layer's output and the rows this rank received for its experts."""
        k, n, w = TINY_MOE.experts_per_token, TINY_MOE.experts, self.workers
        probs = self.router(tokens).softmax(-1)
        weights, chosen = probs.topk(k, dim=-1)               # (T, k)
        flat = chosen.flatten()                               # expert of each routed row
        token_of = torch.arange(tokens.shape[0]).repeat_interleave(k)
        if routing == "capacity":
            capacity = math.ceil(CAPACITY_FACTOR * k * tokens.shape[0] / n)
            buffer = tokens.new_zeros((n * capacity, tokens.shape[1]))
            slot = torch.zeros_like(flat)
            for e in range(n):                                # position of each row in its expert
                mine = flat == e
                slot[mine] = torch.arange(int(mine.sum()))
            kept = slot < capacity                            # rows past a buffer are dropped
            where = flat[kept] * capacity + slot[kept]
            buffer = buffer.index_copy(0, where, tokens[token_of[kept]])
            splits = [self.local * capacity] * w
            received = _AllToAll.apply(buffer, splits, splits)
            # rows arrive by source rank, then local expert: regroup per local expert
            per_source = received.view(w, self.local, capacity, -1).transpose(0, 1).reshape(
                self.local * w * capacity, -1)
            done = self._run_experts(per_source, [w * capacity] * self.local)
            back = done.view(self.local, w, capacity, -1).transpose(0, 1).reshape(
                w * self.local * capacity, -1)
            returned = _AllToAll.apply(back, splits, splits)
            out_rows = tokens.new_zeros((flat.shape[0], tokens.shape[1]))
            out_rows = out_rows.index_copy(0, kept.nonzero().flatten(), returned[where])
            return self._weighted(out_rows, weights, token_of, tokens), received.shape[0]
        order = flat.argsort(stable=True)                     # rows sorted by expert
        per_expert = torch.bincount(flat, minlength=n)
        send = [int(c) for c in per_expert.view(w, self.local).sum(1)]
        counts = torch.tensor(per_expert.tolist(), dtype=torch.int64).view(w, self.local)
        incoming = torch.empty_like(counts)
        dist.all_to_all_single(incoming, counts)              # rows per (source, local expert)
        receive = [int(c) for c in incoming.sum(1)]
        received = _AllToAll.apply(tokens[token_of[order]], send, receive)
        # regroup the received rows (by source, then expert) per local expert
        pieces = received.split([int(c) for c in incoming.flatten()])
        grouped = [pieces[s * self.local + e] for e in range(self.local) for s in range(w)]
        done = self._run_experts(torch.cat(grouped), [int(c) for c in incoming.sum(0)])
        by_expert = done.split([int(c) for c in incoming.t().flatten()])
        back = torch.cat([by_expert[e * w + s] for s in range(w) for e in range(self.local)])
        returned = _AllToAll.apply(back, receive, send)
        out_rows = torch.empty_like(returned).index_copy(0, order, returned)
        return self._weighted(out_rows, weights, token_of, tokens), received.shape[0]

    @staticmethod
    def _weighted(rows, weights, token_of, tokens):
        out = tokens.new_zeros(tokens.shape)
        return out.index_add(0, token_of, rows * weights.flatten()[:, None])


def _measure(rank: int, workers: int, routing: str) -> dict:
    layer = ExpertParallelMoE(rank, workers)
    generator = torch.Generator().manual_seed(SEED + rank)    # each rank its own tokens
    tokens = torch.randn(SHAPE.seq_len * SHAPE.micro_batch, TINY_MOE.hidden, generator=generator)
    tokens.requires_grad_(True)     # the output of earlier layers: the dispatch has a backward
    received = []

    def step():
        tokens.grad = None
        out, rows = layer(tokens, routing)
        out.square().mean().backward()
        received.append(rows)

    step()                                                    # warm-up
    calls, handed = count_collectives(step)["all_to_all"]
    return {"routing": routing, "workers": workers, "rank": rank, "kind": "all_to_all",
            "measured_calls": calls, "measured_bytes": handed, "received_rows": received[-1]}


def _rank(rank: int, workers: int) -> list[dict]:
    join_gloo()
    return [_measure(rank, workers, routing) for routing in ROUTINGS]


def measure_expert_parallel(workers: int) -> list[dict]:
    """Measured rows (one per routing and rank) from ``workers`` processes (E = workers)."""
    return [row for rows in spawn(_rank, workers) for row in rows]


def validate_expert_parallel(workers=(2, 4)) -> pd.DataFrame:
    """Measure every worker count; the comparison with zerolib, stamped with the versions."""
    counts = check_workers(workers)
    measured = pd.DataFrame([row for count in counts for row in measure_expert_parallel(count)],
                            columns=list(MEASURED_COLUMNS))
    return with_versions(compare_expert_parallel(measured), versions())


def record(frame: pd.DataFrame, data_dir: str | Path) -> Path:
    """Write the comparison into ``data_dir`` (atomically)."""
    return write_csv(frame, Path(data_dir, EXPERT_PARALLEL_FILE))


if __name__ == "__main__":      # python -m zerolib.crosscheck.validation.expert_parallel_run DATA_DIR
    import sys
    print(record(validate_expert_parallel(), sys.argv[1] if len(sys.argv) > 1 else "data"))
