"""``zerolib validate``: a real sharded step, the chapter's GPT block, the GPT-2 and Llama blocks
``transformers`` ships, and a tensor-parallel Llama-style model, measured with PyTorch on the CPU.

PyTorch and transformers are the optional ``validate`` extra and are imported only inside
:func:`run`; without them the command says how to install them and exits 2.
"""
from __future__ import annotations

import importlib
import sys

from zerolib.cli._arguments import add_run_arguments, worker_counts
from zerolib.cli._output import json_text, text_table
from zerolib.cli._summaries import SUMMARIES
from zerolib.core.memory.accounting import CATEGORIES
from zerolib.crosscheck.validation import INSTALL_HINT
from zerolib.crosscheck.validation.effects import MECHANISMS
from zerolib.crosscheck.validation.setups import (
    LAYOUT,
    STRATEGIES,
)


def register(commands) -> None:
    parser = commands.add_parser(
        "validate", help=SUMMARIES["validate"],
        description="Train tiny models for one step under DDP (stage 0), ZeroRedundancyOptimizer "
                    "(stage 1), FSDP2 fully_shard (stage 2 and 3 analogues, and bf16 compute) "
                    "and HSDP (fully_shard on a 2-D mesh: stage 3 over shard groups of 2) "
                    "with gloo on 127.0.0.1, measure the bytes of parameters, gradients and "
                    "optimizer state on every rank, and measure the activations one GPT block "
                    "saves for backward, and the same for one GPT-2 and one Llama block as the "
                    "transformers library ships them (micro-batch 1 and 2), and split a small "
                    "Llama-style model with torch.distributed.tensor.parallel (parameters and one "
                    "block's activations per rank); print them beside zerolib's numbers with each "
                    "difference explained. Needs the validate extra (PyTorch, CPU build, and "
                    "transformers).")
    add_run_arguments(parser, "validation_sharded.csv, validation_activations.csv, "
                              "shipped_activations.csv and validation_tensor_parallel.csv")
    parser.add_argument("--shipped-only", action="store_true",
                        help="measure only the shipped transformers blocks (seconds; --record then "
                             "writes shipped_activations.csv alone)")
    parser.add_argument("--format", default="table", choices=("table", "json"),
                        help="text tables (bytes) or JSON records of the comparisons "
                             "(default: table)")
    parser.set_defaults(func=run)


def _missing(modules) -> str | None:
    """The first of ``modules`` that cannot be imported, if any."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            return name
    return None


def _last_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def run(args) -> int:
    counts = worker_counts(args.workers)
    missing = _missing(("torch", "transformers"))
    if missing:
        name = {"torch": "PyTorch"}.get(missing, missing)
        print(f"zerolib validate: error: {name} is not installed; {INSTALL_HINT}", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    from zerolib.crosscheck.validation.runner import Validation, record, validate, validate_shipped
    from zerolib.paths import DATA_DIR

    try:
        if args.shipped_only:
            result = Validation(sharded=None, activations=None, shipped=validate_shipped())
        else:
            result = validate(counts)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        print(f"zerolib validate: error: a worker process failed: {_last_line(error)}",
              file=sys.stderr)
        return 1
    print(render(result, args.format))
    if args.record:
        for path in record(result, args.data_dir or DATA_DIR):
            print(f"recorded {path}", file=sys.stderr)
    return 0


def render(result, form: str) -> str:
    """The comparisons a :class:`~zerolib.crosscheck.validation.runner.Validation` holds, as text
    tables (bytes) or JSON (records of the tidy tables)."""
    from zerolib.crosscheck.validation.explain_activations import totals
    from zerolib.crosscheck.validation.explain_shipped import totals as shipped_totals
    from zerolib.crosscheck.validation.explain_tensor_parallel import totals as parallel_totals

    frames = [frame for frame, _ in result.files()]
    if form == "json":
        out = {}
        if result.sharded is not None:
            out["sharded"] = result.sharded.to_dict("records")
        if result.activations is not None:
            out["activations"] = result.activations.to_dict("records")
            out["activation_totals"] = totals(result.activations).to_dict("records")
        if result.shipped is not None:
            out["shipped"] = result.shipped.to_dict("records")
            out["shipped_totals"] = shipped_totals(result.shipped).to_dict("records")
        if result.tensor_parallel is not None:
            out["tensor_parallel"] = result.tensor_parallel.to_dict("records")
            out["tensor_parallel_totals"] = parallel_totals(result.tensor_parallel).to_dict("records")
        return json_text(out)
    tables = []
    if result.sharded is not None:
        tables.append(_sharded_table(result.sharded))
    if result.activations is not None:
        tables.append(_activation_table(result.activations))
    if result.shipped is not None:
        tables.append(_shipped_table(result.shipped))
    if result.tensor_parallel is not None:
        tables.append(_tensor_parallel_table(result.tensor_parallel))
    return "\n\n".join([*tables, _legend(*frames)])


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
             f"zerolib.core.memory.activations.layer_activation_bytes (Korthikanti et al., MLSys 2023, Table 2).")
    headers = ["case", "dtype", "dropout", "attention", "recompute", "measured [B]",
               "formula [B]", "difference", "unexplained [B]", "explained by"]
    return title + "\n" + text_table(headers, rows)


def _shipped_table(frame) -> str:
    from zerolib.crosscheck.validation.explain_shipped import BLOCKS, totals

    rows = []
    for record in totals(frame).to_dict("records"):
        group = frame[frame["case"] == record["case"]]
        effects = [k for k in MECHANISMS if k in {k for text in group["effects"] for k in text.split()}]
        rows.append([record["case"], record["attention"], "on" if record["use_cache"] else "off",
                     record["micro_batch"], f"{record['measured_bytes']:,}", f"{record['formula_bytes']:,}",
                     f"{record['relative_difference']:+.1%}", f"{record['unexplained_bytes']:,}",
                     " ".join(effects) or "-"])
    shapes = "; ".join(f"{block.model}: seq_len {block.seq_len}, hidden {block.hidden}, heads "
                       f"{block.heads}/{block.kv_heads} x {block.head_dim}, ffn {block.ffn_hidden}"
                       for block in {b.model: b for b in BLOCKS.values()}.values())
    versions = frame.iloc[0]
    title = (f"Activations one transformers block saves for backward (transformers "
             f"{versions['transformers_version']}, torch {versions['torch_version']}, bf16; {shapes}): "
             f"measured with saved_tensors_hooks against zerolib.core.memory.activations.layer_activation_bytes.")
    headers = ["case", "attention", "cache", "micro-batch", "measured [B]", "formula [B]", "difference",
               "unexplained [B]", "explained by"]
    return title + "\n" + text_table(headers, rows)


def _legend(*frames) -> str:
    used = {key for frame in frames for text in frame["effects"] for key in text.split()}
    return "\n".join(["Mechanisms (the CSV's explanation column gives each row's numbers):",
                      *(f"  {key}: {text}" for key, text in MECHANISMS.items() if key in used)])

def _tensor_parallel_table(frame) -> str:
    from zerolib.crosscheck.validation.explain_tensor_parallel import TINY_LLAMA, totals

    rows = []
    for record in totals(frame).to_dict("records"):
        group = frame[(frame["workers"] == record["workers"]) & (frame["rank"] == record["rank"])
                      & (frame["kind"] == record["kind"])]
        effects = sorted({k for text in group["effects"] for k in text.split()})
        rows.append([str(record["workers"]), str(record["rank"]), record["kind"],
                     f"{record['measured_bytes']:,}", f"{record['formula_bytes']:,}",
                     f"{record['relative_difference']:+.1%}", f"{record['unexplained_bytes']:,}",
                     " ".join(effects) or "-"])
    c = TINY_LLAMA
    title = (f"Tensor parallelism (torch.distributed.tensor.parallel, bf16) on a Llama-style model "
             f"(hidden {c.hidden}, {c.layers} layers, {c.heads} heads, {c.kv_heads} key/value heads, "
             f"MLP {c.ffn_hidden}, vocabulary {c.vocab}): per rank, the parameters against "
             f"zerolib.core.memory.model_parallel and one block's saved activations against "
             f"zerolib.core.memory.activations. Rows with unexplained bytes: "
             f"{int((frame['unexplained_bytes'] != 0).sum())} of {len(frame)}.")
    headers = ["W", "rank", "kind", "measured [B]", "zerolib [B]", "difference",
               "unexplained [B]", "explained by"]
    return title + "\n" + text_table(headers, rows)
