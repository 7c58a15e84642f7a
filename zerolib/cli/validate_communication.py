"""``zerolib validate-communication``: the bytes each rank hands to each collective in real
PyTorch or DeepSpeed runs on the CPU, beside zerolib's prediction, every difference explained.

PyTorch (the ``validate`` extra) or DeepSpeed (the ``deepspeed`` extra) is imported only inside
:func:`run`; without it the command says how to install it and exits 2.
"""
from __future__ import annotations

import importlib
import os
import sys

from zerolib.cli._arguments import add_run_arguments, worker_counts
from zerolib.cli._output import json_text, text_table
from zerolib.cli._summaries import SUMMARIES
from zerolib.crosscheck.validation import DEEPSPEED_INSTALL_HINT, INSTALL_HINT
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.crosscheck.validation.explain_communication import COMPARED_KINDS, ENGINES
from zerolib.crosscheck.validation.records import (
    COMMUNICATION_DEEPSPEED_FILE,
    COMMUNICATION_PYTORCH_FILE,
)


def register(commands) -> None:
    parser = commands.add_parser(
        "validate-communication",
        help=SUMMARIES["validate-communication"],
        description="Train tiny models under DDP, ZeroRedundancyOptimizer, FSDP2 and HSDP "
                    "(FSDP2 on a 2 x 2 mesh, with 4 workers) (--engine pytorch) or under "
                    "DeepSpeed's ZeRO stages 0-3 (--engine deepspeed) with "
                    "gloo on 127.0.0.1, count with the PyTorch profiler what every rank hands to "
                    "each kind of collective in one step after warm-up, and print it beside "
                    "zerolib's prediction with every difference attributed to a mechanism.")
    parser.add_argument("--engine", default="pytorch", choices=ENGINES,
                        help="which runs to make (default: pytorch)")
    add_run_arguments(parser, f"{COMMUNICATION_PYTORCH_FILE} or {COMMUNICATION_DEEPSPEED_FILE}")
    parser.add_argument("--format", default="table", choices=("table", "json"),
                        help="a text table (bytes) or JSON records (default: table)")
    parser.set_defaults(func=run)


def _missing(modules) -> str | None:
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return module
    return None


def run(args) -> int:
    counts = worker_counts(args.workers)
    deepspeed = args.engine == "deepspeed"
    if deepspeed:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    missing = _missing(("torch", "deepspeed") if deepspeed else ("torch",))
    if missing:
        hint = DEEPSPEED_INSTALL_HINT if deepspeed else INSTALL_HINT
        print(f"zerolib validate-communication: error: {missing} is not installed; {hint}",
              file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    from zerolib.paths import DATA_DIR
    if deepspeed:
        from zerolib.crosscheck.validation.deepspeed_comm_run import measure, record
    else:
        from zerolib.crosscheck.validation.comm_run import record
        from zerolib.crosscheck.validation.comm_run import validate_communication as measure
    try:
        frame = measure(counts)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        print(f"zerolib validate-communication: error: a worker process failed: "
              f"{lines[-1] if lines else type(error).__name__}", file=sys.stderr)
        return 1
    print(render(frame, args.format))
    if args.record:
        print(f"recorded {record(frame, args.data_dir or DATA_DIR)}", file=sys.stderr)
    return 0


def render(frame, form: str) -> str:
    """The comparison as a text table (one row per run and rank) or JSON records."""
    if form == "json":
        return json_text(frame.to_dict("records"))
    keys = ["engine", "strategy", "precision", "model", "workers", "rank"]
    rows = []
    for key, group in frame.groupby(keys, sort=False):
        by_kind = group.set_index("kind")
        cells = []
        for kind in COMPARED_KINDS:
            measured, predicted = by_kind.at[kind, "measured_bytes"], by_kind.at[kind, "predicted_bytes"]
            calls = (by_kind.at[kind, "measured_calls"], by_kind.at[kind, "predicted_calls"])
            cells.append("-" if not (measured or predicted) else
                         f"{measured:,} / {predicted:,} ({calls[0]} / {calls[1]})")
        effects = sorted({k for text in group["effects"] for k in text.split()})
        rows.append([key[1], key[2], key[3], str(key[4]), str(key[5]), *cells,
                     " ".join(effects) or "-"])
    bad = int(((frame["unexplained_bytes"] != 0) | (frame["unexplained_calls"] != 0)).sum())
    title = ("Bytes each rank hands to each kind of collective in one step, measured / zerolib's "
             "prediction (calls measured / predicted). Rows with unexplained bytes or calls: "
             f"{bad} of {len(frame)}.")
    headers = ["strategy", "precision", "model", "W", "rank",
               *(f"{kind} [B]" for kind in COMPARED_KINDS), "explained by"]
    used = {key for text in frame["effects"] for key in text.split()}
    legend = ["Mechanisms (the CSV's explanation column gives each row's numbers):",
              *(f"  {key}: {text}" for key, text in MECHANISMS.items() if key in used)]
    return "\n".join([title, text_table(headers, rows), "", *legend])
