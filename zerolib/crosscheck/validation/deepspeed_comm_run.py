"""What each rank hands to each collective in a real DeepSpeed step, on the CPU.

    DS_ACCELERATOR=cpu zerolib validate-communication --engine deepspeed --record

Launches 2 and 4 ranks on 127.0.0.1 through the shared harness (DeepSpeed's CPU accelerator,
gloo), trains the Linear stacks of ``deepspeed_run.DEEPSPEED_MODELS`` under every configuration
of ``explain_communication.DEEPSPEED_CONFIGS`` in fp32 and bf16 with AdamW, and counts the third
step's collectives with the PyTorch profiler (the first two warm up: DeepSpeed traces the
module order and broadcasts bookkeeping then). Needs the ``deepspeed`` extra; the tests read
the recorded CSV and never run this.
"""
from __future__ import annotations

import platform
from pathlib import Path

import pandas as pd

from zerolib.crosscheck.validation.deepspeed_run import (
    DEEPSPEED_MODELS,
    MICRO_BATCH,
    start_deepspeed,
)
from zerolib.crosscheck.validation.explain_communication import (
    COMPARED_KINDS,
    DEEPSPEED_CONFIGS,
    DEEPSPEED_LAYOUTS,
    WARMUP_STEPS,
    compare_communication,
)
from zerolib.crosscheck.validation.records import COMMUNICATION_DEEPSPEED_FILE, write_csv
from zerolib.crosscheck.validation.setups import check_workers


def _config(config_name: str, precision: str) -> dict:
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
            "zero_optimization": DEEPSPEED_CONFIGS[config_name].as_config(),
            "bf16": {"enabled": precision == "bf16"}, "steps_per_print": 2**30,
            "wall_clock_breakdown": False}


def _measure_one(spec, config_name: str, precision: str, rank: int, workers: int) -> list[dict]:
    import deepspeed
    import torch

    from zerolib.crosscheck.validation.collective_count import count_collectives
    from zerolib.crosscheck.validation.harness import build_linear_stack

    model, _ = build_linear_stack(spec, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=_config(config_name, precision))
    generator = torch.Generator().manual_seed(1000 + rank)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    inputs = torch.randn(MICRO_BATCH, spec.widths[0], generator=generator).to(dtype)
    targets = torch.randn(MICRO_BATCH, spec.widths[-1], generator=generator).to(dtype)

    def step():
        loss = torch.nn.functional.mse_loss(engine(inputs).float(), targets.float())
        engine.backward(loss)
        engine.step()

    for _ in range(WARMUP_STEPS):
        step()
    counts = count_collectives(step)
    if hasattr(engine, "destroy"):   # drops ZeRO-3 hooks before the next engine
        engine.destroy()
    return [{"engine": "deepspeed", "strategy": config_name, "precision": precision,
             "model": spec.name, "workers": workers, "rank": rank, "kind": kind,
             "measured_calls": counts[kind][0], "measured_bytes": counts[kind][1]}
            for kind in COMPARED_KINDS]


def _rank(rank: int, workers: int, jobs: list) -> dict:
    backend = start_deepspeed()
    import torch

    rows = []
    for name, config_name, precision in jobs:
        spec = next(m for m in DEEPSPEED_MODELS if m.name == name)
        rows += _measure_one(spec, config_name, precision, rank, workers)
        torch.distributed.barrier()
    return {"rows": rows, "backend": backend}


def measure(workers_list=(2, 4), configs=tuple(DEEPSPEED_CONFIGS),
            precisions=tuple(DEEPSPEED_LAYOUTS)) -> pd.DataFrame:
    """The comparison with zerolib for every worker count, configuration, precision and model,
    stamped with the versions and the backend."""
    import deepspeed
    import torch

    from zerolib.crosscheck.validation.harness import spawn

    jobs = [(m.name, c, p) for m in DEEPSPEED_MODELS for p in precisions for c in configs]
    rows, backends = [], set()
    for workers in check_workers(workers_list):
        for result in spawn(_rank, workers, jobs):
            rows += result["rows"]
            backends.add(result["backend"])
    frame = compare_communication(pd.DataFrame(rows))
    return frame.assign(deepspeed_version=deepspeed.__version__, torch_version=torch.__version__,
                        python_version=platform.python_version(),
                        platform=f"{platform.system()}-{platform.machine()}",
                        backend=",".join(sorted(backends)))


def record(frame: pd.DataFrame, data_dir: str | Path) -> Path:
    """Write the comparison into ``data_dir`` (atomically)."""
    return write_csv(frame, Path(data_dir, COMMUNICATION_DEEPSPEED_FILE))
