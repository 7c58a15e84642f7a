"""The communication options of ``zerolib estimate`` (``--link``, ``--gpus-per-node``,
``--tokens-per-gpu``, ``--mfu``): parsing them, and the table and CSV columns they add.

Kept apart from ``estimate.py`` so that file only gains a few calls.
"""
from __future__ import annotations

from zerolib.core.collectives import KINDS
from zerolib.core.inputs import MAX_GPUS
from zerolib.core.links import LINKS
from zerolib.core.nodes import NODES, interconnect
from zerolib.core.parse import parse_fraction, parse_whole
from zerolib.core.step import DEFAULT_MFU, DEFAULT_TOKENS_PER_GPU, MAX_TOKENS_PER_GPU
from zerolib.core.units import to_unit

OPTIONS = {"tokens_per_gpu": "--tokens-per-gpu",
           "mfu": "--mfu"}
SECONDS = ("communication_seconds", "compute_seconds", "exposed_seconds", "step_seconds")


def add_arguments(parser) -> None:
    group = parser.add_argument_group(
        "communication (needs --link)",
        "Bytes each GPU hands to, sends and receives from every collective of one training step "
        "(ring algorithm), their time at the link's bus bandwidth, the compute time from 6 FLOPs "
        "per parameter and token (8 with --recompute full) at the device's peak x --mfu, and "
        "the step time with collectives overlapping compute as far as the schedule allows.")
    group.add_argument("--link", metavar="NAME",
                       help=f"a node ({', '.join(NODES)}) or a link joining every GPU alike "
                            f"({', '.join(LINKS)})")
    group.add_argument("--tokens-per-gpu", metavar="T",
                       help=f"tokens each GPU processes per step (default: --seq x --micro-batch "
                            f"with --model, else {DEFAULT_TOKENS_PER_GPU:,})")
    group.add_argument("--mfu", metavar="U",
                       help=f"fraction of the device's peak reached, e.g. 0.4 or 40%% (default "
                            f"{DEFAULT_MFU:g})")


def options_from(args) -> dict:
    """Keyword arguments for ``estimate`` / ``estimate_model``; the flags need ``--link``."""
    if args.link is None:
        given = [flag for dest, flag in OPTIONS.items() if getattr(args, dest) is not None]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} --link (a node such as dgx-h100 or a "
                             "link such as ib-ndr)")
        return {}
    try:   # the library names the argument "link"; the message names the flag
        interconnect(args.link)
    except ValueError as error:
        raise ValueError(f"--{error}") from None
    out = {"link": args.link}
    if args.gpus_per_node is not None and args.link.strip().lower() in NODES:
        out["gpus_per_node"] = parse_whole(args.gpus_per_node, "--gpus-per-node", maximum=MAX_GPUS)
    if args.tokens_per_gpu is not None:
        out["tokens_per_gpu"] = parse_whole(args.tokens_per_gpu, "--tokens-per-gpu",
                                            maximum=MAX_TOKENS_PER_GPU)
    if args.mfu is not None:
        out["mfu"] = parse_fraction(args.mfu, "--mfu")
    return out


def has_communication(result: dict) -> bool:
    return bool(result["stages"]) and "communication" in result["stages"][0]


def describe(result: dict) -> str:
    ic, compute = result["interconnect"], result["compute_settings"]
    where = ic["name"]
    if ic["gpus_per_node"] is not None:
        where += f" ({ic['gpus_per_node']} GPUs and {ic['nics_per_node']} network ports per node)"
    time = (f"{compute['tokens_per_gpu']:,} tokens per GPU at {compute['flops_per_param_token']} "
            f"FLOPs per parameter and token, mfu {compute['mfu']:g}")
    return (f"Communication over {where}: bus bandwidth {ic['bus_bandwidth'] / 1e9:,.1f} GB/s per "
            f"GPU and direction; {time}.")


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def table_columns(result: dict, unit: str) -> tuple[list[str], list[list[str]]]:
    """Bytes sent per GPU (each GPU receives as much), then the times and the waiting share."""
    headers = [f"sent/GPU [{unit}]", "comm [s]", "compute [s]", "step [s]", "network wait"]
    cells = []
    for row in result["stages"]:
        c = row["communication"]
        wait = c["network_wait_fraction"]
        cells.append([f"{to_unit(c['sent_bytes'], unit):,.2f}", _seconds(c["communication_seconds"]),
                      _seconds(c["compute_seconds"]), _seconds(c["step_seconds"]),
                      "-" if wait is None else f"{wait:.1%}"])
    return headers, cells


def csv_columns(result: dict) -> tuple[list[str], list[list]]:
    """Per kind the calls, bytes handed and sent; the totals; the seconds (empty when unknown)."""
    headers = [f"{kind}_{what}" for kind in KINDS for what in ("calls", "handed_bytes",
                                                               "sent_bytes")]
    headers += ["sent_bytes", "received_bytes", *SECONDS, "network_wait_fraction"]
    cells = []
    for row in result["stages"]:
        c = row["communication"]
        values = [c["collectives"][kind][what] for kind in KINDS
                  for what in ("calls", "handed_bytes", "sent_bytes")]
        values += [c["sent_bytes"], c["received_bytes"]]
        values += ["" if c[key] is None else c[key] for key in (*SECONDS, "network_wait_fraction")]
        cells.append(values)
    return headers, cells
