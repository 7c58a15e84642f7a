"""``zerolib validate``: a real sharded step and one GPT block, measured with PyTorch on the CPU.

PyTorch is the optional ``validate`` extra and is imported only inside :func:`run`; without it
the command says how to install it and exits 2.
"""
from __future__ import annotations

import importlib
import json
import sys

from zerolib.cli._arguments import add_run_arguments, worker_counts
from zerolib.cli._output import text_table
from zerolib.core.accounting import CATEGORIES
from zerolib.crosscheck.validation import INSTALL_HINT
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.crosscheck.validation.setups import (
    LAYOUT,
    STRATEGIES,
)


def register(commands) -> None:
    parser = commands.add_parser(
        "validate", help="measure real PyTorch runs on the CPU against zerolib (needs torch)",
        description="Train tiny models for one step under DDP (stage 0), ZeroRedundancyOptimizer "
                    "(stage 1), FSDP2 fully_shard (stage 2 and 3 analogues, and bf16 compute) "
                    "and HSDP (fully_shard on a 2-D mesh: stage 3 over shard groups of 2) "
                    "with gloo on 127.0.0.1, measure the bytes of parameters, gradients and "
                    "optimizer state on every rank, and measure the activations one GPT block "
                    "saves for backward; print them beside zerolib's numbers with each "
                    "difference explained. Needs the validate extra (PyTorch, CPU build).")
    add_run_arguments(parser, "validation_sharded.csv and validation_activations.csv")
    parser.add_argument("--format", default="table", choices=("table", "json"),
                        help="text tables (bytes) or JSON records of both comparisons "
                             "(default: table)")
    parser.set_defaults(func=run)


def _torch_missing() -> bool:
    try:
        importlib.import_module("torch")
    except ImportError:
        return True
    return False


def _last_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def run(args) -> int:
    counts = worker_counts(args.workers)
    if _torch_missing():
        print(f"zerolib validate: error: PyTorch is not installed; {INSTALL_HINT}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    from zerolib.crosscheck.validation.runner import record, validate
    from zerolib.paths import DATA_DIR

    try:
        result = validate(counts)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        print(f"zerolib validate: error: a worker process failed: {_last_line(error)}",
              file=sys.stderr)
        return 1
    print(render(result.sharded, result.activations, args.format))
    if args.record:
        for path in record(result, args.data_dir or DATA_DIR):
            print(f"recorded {path}", file=sys.stderr)
    return 0


def render(sharded, activations, form: str) -> str:
    """The comparison as text tables (bytes) or JSON (records of both tidy tables)."""
    from zerolib.crosscheck.validation.explain_activations import totals

    if form == "json":
        return json.dumps({"sharded": sharded.to_dict("records"),
                           "activations": activations.to_dict("records"),
                           "activation_totals": totals(activations).to_dict("records")}, indent=2)
    return "\n\n".join([_sharded_table(sharded), _activation_table(activations),
                        _legend(sharded, activations)])


def _cell(measured: int, predicted: int) -> str:
    return f"{measured:,} / {predicted:,} ({(measured - predicted) / predicted:+.1%})"


def _sharded_table(frame) -> str:
    keys = ["strategy", "model", "workers", "rank", "phase"]
    rows = []
    for key, group in frame.groupby(keys, sort=False):
        by_category = group.set_index("category")
        effects = sorted({k for text in group["effects"] for k in text.split()})
        rows.append([f"{key[0]} (stage {STRATEGIES[key[0]].stage})", *map(str, key[1:]),
                     *(_cell(int(by_category.at[c, "measured_bytes"]),
                             int(by_category.at[c, "predicted_bytes"])) for c in CATEGORIES),
                     " ".join(effects) or "-"])
    unexplained = int((frame["unexplained_bytes"] != 0).sum())
    title = (f"Model state per rank: measured / zerolib's prediction in bytes (difference), layout "
             f"{LAYOUT} (4 + 4 + 8 B per parameter). rest = after one AdamW step; peak = largest "
             f"total during the next forward. Rows with unexplained bytes: {unexplained} of "
             f"{len(frame)}.")
    headers = ["strategy", "model", "W", "rank", "phase",
               *(f"{c} [B]" for c in CATEGORIES), "explained by"]
    return title + "\n" + text_table(headers, rows)


def _activation_table(frame) -> str:
    from zerolib.crosscheck.validation.explain_activations import totals

    first = frame.iloc[0]
    rows = []
    for record in totals(frame).to_dict("records"):
        group = frame[frame["case"] == record["case"]]
        effects = sorted({k for text in group["effects"] for k in text.split()})
        rows.append([record["case"], record["dtype"], record["dropout_kernel"], record["attention"],
                     record["recompute"], f"{record['measured_bytes']:,}",
                     f"{record['formula_bytes']:,}", f"{record['relative_difference']:+.1%}",
                     f"{record['unexplained_bytes']:,}", " ".join(effects) or "-"])
    title = (f"Activations one GPT block saves for backward (seq_len {first['seq_len']}, "
             f"micro_batch {first['micro_batch']}, hidden {first['hidden']}, heads "
             f"{first['heads']}): measured with saved_tensors_hooks against "
             f"zerolib.core.activations.layer_activation_bytes (Korthikanti et al. 2022, Table 2).")
    headers = ["case", "dtype", "dropout", "attention", "recompute", "measured [B]",
               "formula [B]", "difference", "unexplained [B]", "explained by"]
    return title + "\n" + text_table(headers, rows)


def _legend(sharded, activations) -> str:
    used = {key for frame in (sharded, activations)
            for text in frame["effects"] for key in text.split()}
    return "\n".join(["Mechanisms (the CSV's explanation column gives each row's numbers):",
                      *(f"  {key}: {text}" for key, text in MECHANISMS.items() if key in used)])
