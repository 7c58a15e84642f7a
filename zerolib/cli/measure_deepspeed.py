"""``zerolib measure-deepspeed``: what DeepSpeed's ZeRO stages really hold per rank, on the CPU.

DeepSpeed is the optional ``deepspeed`` extra and is imported only inside :func:`run`; without
it the command says how to install it and exits 2.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from zerolib.cli._arguments import add_run_arguments, worker_counts
from zerolib.cli._summaries import SUMMARIES
from zerolib.crosscheck.validation import DEEPSPEED_INSTALL_HINT


def register(commands) -> None:
    parser = commands.add_parser(
        "measure-deepspeed", help=SUMMARIES["measure-deepspeed"],
        description="Train two small Linear stacks for two steps under DeepSpeed ZeRO stages 0-3 "
                    "(fp32 and bf16) in 2 and 4 processes on the CPU, count the bytes every rank "
                    "holds (parameters, gradients, optimizer state, fp32 master weights, buckets) "
                    "and print a summary; --record writes data/deepspeed_measured.csv and its "
                    "_buffers list. Needs the deepspeed extra: " + DEEPSPEED_INSTALL_HINT)
    add_run_arguments(parser, "deepspeed_measured.csv and deepspeed_measured_buffers.csv")
    parser.add_argument("--bf16-optimizer", action="store_true",
                        help="instead: bf16 with fp32 gradient accumulation at ZeRO stage 1 "
                             "(DeepSpeed's BF16_Optimizer); --record writes "
                             "deepspeed_bf16_optimizer.csv and its _buffers list")
    parser.set_defaults(func=run)


def run(args) -> int:
    counts = worker_counts(args.workers)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for module in ("torch", "deepspeed"):
        try:
            importlib.import_module(module)
        except ImportError:
            print(f"zerolib measure-deepspeed: error: {module} is not installed; install with: "
                  f"{DEEPSPEED_INSTALL_HINT}", file=sys.stderr)
            return 2
    from zerolib.crosscheck.validation.deepspeed_run import (
        BF16_OPTIMIZER_FILE,
        BF16_OPTIMIZER_PRECISION,
        RECORD_FILE,
        record,
    )
    from zerolib.crosscheck.validation.deepspeed_run import run as measure
    from zerolib.paths import DATA_DIR

    name = RECORD_FILE
    if getattr(args, "bf16_optimizer", False):
        rows, buffers = measure(counts, stages=(1,), precisions=(BF16_OPTIMIZER_PRECISION,))
        name = BF16_OPTIMIZER_FILE
    else:
        rows, buffers = measure(counts)
    print(f"measured {len(rows)} rows and {len(buffers)} buffers on {', '.join(map(str, counts))} ranks")
    if args.record:
        for path in record(rows, buffers, Path(args.data_dir or DATA_DIR) / name):
            print(f"recorded {path}", file=sys.stderr)
    return 0
