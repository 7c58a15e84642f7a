"""What each rank hands to each collective in a real sharded PyTorch step (needs PyTorch).

``measure_communication(workers)`` starts ``workers`` processes through the shared harness
(gloo on 127.0.0.1) and in each trains every model of ``setups.TINY_MODELS`` under every
strategy of ``setups.COMMUNICATION_STRATEGIES`` that runs on that many ranks (HSDP needs two
shard groups or more): :data:`WARMUP_STEPS` steps first (DDP broadcasts its rebuilt bucket
order during the second; see ``data/communication.md``), then one step (forward,
backward, ``optimizer.step()``, ``zero_grad()``) counted with the profiler
(:mod:`zerolib.crosscheck.validation.collective_count`). ``validate_communication`` sets the
counts beside zerolib's prediction (:mod:`zerolib.crosscheck.validation.explain_communication`).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from zerolib.crosscheck.validation.collective_count import count_collectives
from zerolib.crosscheck.validation.explain_communication import (
    COMPARED_KINDS,
    WARMUP_STEPS,
    compare_communication,
)
from zerolib.crosscheck.validation.harness import build_linear_stack, join_gloo, spawn
from zerolib.crosscheck.validation.records import COMMUNICATION_PYTORCH_FILE, with_versions, write_csv
from zerolib.crosscheck.validation.runner import versions
from zerolib.crosscheck.validation.setups import COMMUNICATION_STRATEGIES, TINY_MODELS, check_workers
from zerolib.crosscheck.validation.sharded_run import BATCH, SEED, wrap

MEASURED_COLUMNS = ("engine", "strategy", "precision", "model", "workers", "rank", "kind",
                    "measured_calls", "measured_bytes")


def _measure_one(strategy, spec, rank: int, workers: int) -> list[dict]:
    model, layers = build_linear_stack(spec, SEED)
    wrapped, optimizer, _ = wrap(strategy, model, layers, workers)
    generator = torch.Generator().manual_seed(SEED + rank)
    inputs = torch.randn(BATCH, spec.widths[0], generator=generator)

    def step():
        wrapped(inputs).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(WARMUP_STEPS):
        step()
    counts = count_collectives(step)
    precision = "bf16" if strategy.bf16_compute else "fp32"
    return [{"engine": "pytorch", "strategy": strategy.name, "precision": precision,
             "model": spec.name, "workers": workers, "rank": rank, "kind": kind,
             "measured_calls": counts[kind][0], "measured_bytes": counts[kind][1]}
            for kind in COMPARED_KINDS]


def _rank(rank: int, workers: int) -> list[dict]:
    join_gloo()
    return [row for spec in TINY_MODELS.values() for strategy in COMMUNICATION_STRATEGIES.values()
            if strategy.runs_on(workers) for row in _measure_one(strategy, spec, rank, workers)]


def measure_communication(workers: int) -> list[dict]:
    """Measured rows (one per strategy, model, rank and kind) from ``workers`` processes."""
    return [row for rows in spawn(_rank, workers) for row in rows]


def validate_communication(workers=(2, 4)) -> pd.DataFrame:
    """Measure every worker count; the comparison with zerolib, stamped with the versions."""
    counts = check_workers(workers)
    measured = pd.DataFrame([row for count in counts for row in measure_communication(count)],
                            columns=list(MEASURED_COLUMNS))
    return with_versions(compare_communication(measured), versions())


def record(frame: pd.DataFrame, data_dir: str | Path) -> Path:
    """Write the comparison into ``data_dir`` (atomically)."""
    return write_csv(frame, Path(data_dir, COMMUNICATION_PYTORCH_FILE))
