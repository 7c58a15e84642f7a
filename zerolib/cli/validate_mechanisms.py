"""``zerolib validate-mechanisms``: what trainers' memory mechanisms keep, measured with the real
PyTorch code on the CPU (recompute policies, the loss chain, FSDP2 under a pipeline schedule),
beside counts worked out by hand.

PyTorch, transformers and megatron-core (the ``validate`` extra) are imported only inside
:func:`run`; without them the command says how to install them and exits 2.
"""
from __future__ import annotations

import importlib
import logging
import sys
import warnings

from zerolib.cli._output import json_text, text_table
from zerolib.cli._summaries import SUMMARIES
from zerolib.crosscheck.validation import INSTALL_HINT
from zerolib.crosscheck.validation.records import MECHANISMS_FILE


def register(commands) -> None:
    parser = commands.add_parser(
        "validate-mechanisms",
        help=SUMMARIES["validate-mechanisms"],
        description="Run transformers' Llama layers under each recompute policy (none, "
                    "torchtitan's op-level selective policy, Megatron-LM's selective, full, "
                    "uniform and block recomputation, with and without Megatron's dropout), "
                    "the loss from bf16 logits to their gradient (eager fp32 and bf16, chunked, "
                    "compiled, Megatron's vocabulary-parallel loss), FSDP2 as torchtitan runs "
                    "it under pipeline parallelism (fake ranks, with and without torchao's fp8 "
                    "all-gather) and a whole training step at Llama-3-8B's width on fake tensors, "
                    "on the CPU, and print each measurement beside its count by hand (about a "
                    "minute). Needs the validate extra.")
    parser.add_argument("--record", action="store_true",
                        help=f"also write {MECHANISMS_FILE} into the data folder (atomically)")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="folder --record writes to (default: the repository's data/)")
    parser.add_argument("--format", default="table", choices=("table", "json"),
                        help="a text table (bytes) or JSON records (default: table)")
    parser.set_defaults(func=run)


def run(args) -> int:
    # torchao says on import that its CUDA-only extensions do not load on a CPU build
    logging.getLogger("torchao").setLevel(logging.ERROR)
    for module, name in (("torch", "PyTorch"), ("transformers", "transformers"),
                         ("megatron.core", "megatron-core")):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # megatron-core says TransformerEngine is absent
                importlib.import_module(module)
        except ImportError:
            print(f"zerolib validate-mechanisms: error: {name} is not installed; {INSTALL_HINT}",
                  file=sys.stderr)
            return 2
    from pathlib import Path

    from zerolib.crosscheck.validation.mechanism_run import validate_mechanisms
    from zerolib.crosscheck.validation.records import write_csv
    from zerolib.paths import DATA_DIR

    frame = validate_mechanisms()
    print(render(frame, args.format))
    if args.record:
        path = write_csv(frame, Path(args.data_dir or DATA_DIR, MECHANISMS_FILE))
        print(f"recorded {path}", file=sys.stderr)
    return 0


def render(frame, form: str) -> str:
    """The measurements beside their hand counts: a text table or JSON records."""
    if form == "json":
        return json_text(frame.to_dict("records"))
    rows = [[r["mechanism"], r["case"], r["counted"].split(":")[0], f"{r['measured_bytes']:,}",
             f"{r['hand_bytes']:,}", f"{r['ratio']:.6f}", r["unit"],
             f"{r['measured_per_unit']:.3f}", r["formula"].split(":")[0]]
            for r in frame.to_dict("records")]
    headers = ["mechanism", "case", "counted", "measured [B]", "by hand [B]", "ratio", "per",
               "measured per", "formula"]
    return ("Trainers' memory mechanisms measured on the CPU with the real PyTorch code, beside "
            "the count by hand (data/mechanisms_measured.md explains each).\n"
            + text_table(headers, rows))
