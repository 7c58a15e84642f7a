"""The communication options of ``zerolib estimate`` (``--link``, ``--gpus-per-node``,
``--tokens-per-gpu``, ``--mfu``, ``--qwz``, ``--qgz``, ``--host-link``, ``--link-efficiency``
(shared with ``zerolib plan``), ``--engine``, and ``--micro-batches`` as gradient
accumulation with ``--link``): parsing them, and the table and CSV columns they add.

Kept apart from ``estimate.py`` so that file only gains a few calls.
"""
from __future__ import annotations

import re

from zerolib.core.catalogue.hosts import DEFAULT_HOST, HOSTS
from zerolib.core.catalogue.links import (
    EFFICIENCY_NAMES,
    HOST_LINKS,
    LINKS,
    get_link,
    link_efficiency,
)
from zerolib.core.catalogue.nodes import NODES, interconnect
from zerolib.core.defaults import (
    DEFAULT_ENGINE,
    DEFAULT_HOST_LINK,
    DEFAULT_MFU,
    DEFAULT_TOKENS_PER_GPU,
    ENGINE_NAMES,
    MAX_CPU_ADAM_RATE,
    MAX_OVERSUBSCRIPTION,
    MAX_TOKENS_PER_GPU,
    MIN_MFU,
)
from zerolib.core.inputs import MAX_GPUS, echo
from zerolib.core.parse import parse_fraction, parse_whole
from zerolib.core.units import to_unit

# The step's modules (engines, traffic, collectives) are imported where a command uses them:
# registering these flags and answering without --link import none of the step's arithmetic.

OPTIONS = {"tokens_per_gpu": "--tokens-per-gpu",
           "mfu": "--mfu", "qwz": "--qwz", "qgz": "--qgz", "host_link": "--host-link",
           "host": "--host", "cpu_adam_rate": "--cpu-adam-rate",
           "link_efficiency": "--link-efficiency", "leaf_nodes": "--leaf-nodes",
           "oversubscription": "--oversubscription"}
LINK_EFFICIENCY_HELP = ("the rate every link runs at: achieved (the default: the bus bandwidth "
                        "NCCL reaches at large messages, e.g. 370 of NVLink 4's 450 GB/s, and "
                        "480 GB/s for an all-reduce inside an H100 node on NVLink SHARP), ring "
                        "(the same without NVLS, as NCCL_NVLS_ENABLE=0), "
                        "line-rate (the vendor's figure), or a fraction of the line rate in "
                        "(0, 1] such as 0.8 or 80%%")
SECONDS = ("communication_seconds", "compute_seconds", "exposed_seconds", "step_seconds")
# Appended after the columns above (which keep their places): qgZ's all-to-alls, the group,
# the bytes leaving a node and the offload transfers' seconds.
LATER_COLUMNS = ("all_to_all_calls", "all_to_all_handed_bytes", "all_to_all_sent_bytes",
                 "shard_group", "replicas", "cross_node_bytes", "host_seconds",
                 "cpu_step_seconds")


def add_arguments(parser) -> None:
    group = parser.add_argument_group(
        "communication (needs --link)",
        "Bytes each GPU hands to, sends and receives from every collective of one training step "
        "(ring algorithm), their time at the link's bus bandwidth, the compute time from 6 FLOPs "
        "per parameter and token (8 with --recompute full; selective and full also repeat the "
        "attention core) at the device's peak x --mfu, and "
        "the step time with collectives overlapping compute as far as the schedule allows. "
        "With tensor, pipeline, context or expert parallelism the step is timed as zerolib plan "
        "times the configuration (needs --device; one row of the planner's step model).")
    group.add_argument("--engine", choices=list(ENGINE_NAMES),
                       help=f"whose schedule, overlap and stages: the ZeRO paper's, DeepSpeed "
                            f"0.19.8 at its defaults, PyTorch FSDP2, Megatron-LM's distributed "
                            f"optimizer (default {DEFAULT_ENGINE}); decides which stages exist and "
                            f"which run beside a pipeline, with or without --link")
    group.add_argument("--link", metavar="NAME",
                       help=f"a node ({', '.join(NODES)}) or a link joining every GPU alike "
                            f"({', '.join(LINKS)})")
    group.add_argument("--tokens-per-gpu", metavar="T",
                       help=f"tokens each GPU processes per step (default: --seq x --micro-batch "
                            f"with --model, else {DEFAULT_TOKENS_PER_GPU:,})")
    group.add_argument("--mfu", metavar="U",
                       help=f"fraction of the device's peak reached, e.g. 0.4 or 40%% (default "
                            f"{DEFAULT_MFU:g})")
    group.add_argument("--qwz", action="store_true", default=None,
                       help="ZeRO++ qwZ (stage 3): all-gather the weights in 8 bits")
    group.add_argument("--qgz", action="store_true", default=None,
                       help="ZeRO++ qgZ (stage 3): reduce the gradients in 4 bits through two "
                            "all-to-alls (inside the node, then across nodes)")
    group.add_argument("--host-link", metavar="NAME",
                       help=f"the PCIe link offload copies and NVMe reads and writes run on "
                            f"({', '.join(HOST_LINKS)}; default {DEFAULT_HOST_LINK})")
    add_host_arguments(group)
    add_link_efficiency(group)


def add_host_arguments(parser) -> None:
    """``--host`` and ``--cpu-adam-rate`` (estimate and plan)."""
    parser.add_argument("--host", metavar="NAME",
                        help=f"the node whose CPUs run the offloaded optimizer step and whose NVMe "
                             f"drives hold offloaded state ({', '.join(HOSTS)}; default: the "
                             f"node of the link when it is one of them, else {DEFAULT_HOST})")
    parser.add_argument("--cpu-adam-rate", metavar="RATE",
                        help="parameters per second the node's CPUs update in the optimizer step, "
                             "as measured, e.g. 2e9 (default: none, the host memory-bandwidth "
                             "roofline alone, a lower bound on the step's time)")


def host_options_from(args, offload_optimizer: bool, offloads: bool) -> dict:
    """``host`` and ``cpu_adam_rate`` from ``--host`` and ``--cpu-adam-rate``, refused where
    nothing is offloaded (or, for the rate, no optimizer)."""
    out = {}
    if args.host is not None:
        if not offloads:
            raise ValueError("--host needs an offload (its CPUs and drives serve only offloaded "
                             "state)")
        key = args.host.strip().lower()
        if key not in HOSTS:
            raise ValueError(f"--host must be one of {', '.join(HOSTS)}, got {args.host!r}")
        out["host"] = key
    if args.cpu_adam_rate is not None:
        if not offload_optimizer:
            raise ValueError("--cpu-adam-rate needs an offloaded optimizer (the CPU steps only "
                             "an offloaded optimizer)")
        out["cpu_adam_rate"] = parse_whole(
            args.cpu_adam_rate, "--cpu-adam-rate", maximum=MAX_CPU_ADAM_RATE,
            example="parameters per second like 2e9, 2B or 2,000,000,000")
    return out


def add_link_efficiency(parser) -> None:
    """``--link-efficiency``, ``--leaf-nodes`` and ``--oversubscription`` (estimate's
    communication group, plan)."""
    parser.add_argument("--link-efficiency", metavar="E", help=LINK_EFFICIENCY_HELP)
    parser.add_argument("--leaf-nodes", metavar="N",
                        help="nodes under one rail leaf switch of a rail-optimised fabric (32 in "
                             "NVIDIA's DGX H100 SuperPOD); a ring over more crosses the spine "
                             "(default: one leaf holds every node)")
    parser.add_argument("--oversubscription", metavar="R",
                        help="the spine's oversubscription R:1 beyond --leaf-nodes, e.g. 2 or 2:1: "
                             "a ring across leaves gets 1/R of the ports' rate (default 1, "
                             "non-blocking, as the DGX SuperPOD builds it)")


_RATIO = re.compile(r"^\s*(\d{1,3}(?:\.\d{1,6})?)\s*(?::\s*1)?\s*$", re.ASCII)


def fabric_from(args) -> dict:
    """``leaf_nodes`` and ``oversubscription`` from ``--leaf-nodes`` and ``--oversubscription``
    (R or R:1, from 1 to the bound)."""
    out = {}
    if args.leaf_nodes is not None:
        out["leaf_nodes"] = parse_whole(args.leaf_nodes, "--leaf-nodes", maximum=MAX_GPUS)
    if args.oversubscription is not None:
        text = args.oversubscription
        found = _RATIO.match(text) if len(text) <= 40 else None
        if found is None or not 1 <= float(found.group(1)) <= MAX_OVERSUBSCRIPTION:
            raise ValueError(f"--oversubscription must be a number from 1 to {MAX_OVERSUBSCRIPTION:g} "
                             f"like 2 or 2:1, got {echo(text)}")
        out["oversubscription"] = float(found.group(1))
    return out


def link_efficiency_from(text: str) -> str | float:
    """``--link-efficiency``: achieved, ring, line-rate, or a fraction in (0, 1]."""
    name = text.strip().lower()
    if name in EFFICIENCY_NAMES:
        return name
    try:
        return parse_fraction(text, "--link-efficiency")
    except ValueError:
        raise ValueError(f"--link-efficiency must be {' or '.join(EFFICIENCY_NAMES)} or a "
                         f"fraction above 0 and at most 1, got {text!r}") from None


def engine_from(args) -> dict:
    """``--engine``: the engine's name (the API's default without it)."""
    return {} if args.engine is None else {"engine": args.engine}


def engine_stages(args, stages, placement, gpus: int, pipeline_parallel: int = 1):
    """Without ``--stage``: the stages the engine offers (with a shard group smaller than every
    GPU, stage 0 and those it shards in groups: DeepSpeed's MiCS is stage 3's; with a pipeline,
    those it runs beside one); else ``stages``."""
    if args.stage is not None:
        return stages
    from zerolib.core.step.engines import get_engine
    engine = get_engine(args.engine or DEFAULT_ENGINE)
    group = None if placement is None else placement.shard_group
    grouped = group is not None and 1 < group < gpus
    kept = tuple(s for s in stages if s in engine.stages
                 and (not grouped or s == 0 or s in engine.group_stages)
                 and (pipeline_parallel == 1 or s in engine.pipeline_stages))
    return kept or stages


def micro_batches_from(args) -> dict:
    """``--micro-batches`` with ``--link`` and no pipeline: micro-batches per step (gradient
    accumulation), which the step's traffic and time follow."""
    if args.link is None or args.micro_batches is None:
        return {}
    if args.pipeline_parallel is not None and args.pipeline_parallel.strip() != "1":
        return {}
    from zerolib.core.step.traffic import MAX_MICRO_BATCHES
    return {"micro_batches": parse_whole(args.micro_batches, "--micro-batches",
                                         maximum=MAX_MICRO_BATCHES)}


def options_from(args) -> dict:
    """The run fields of ``estimate``; the flags need ``--link``."""
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
        out["mfu"] = parse_fraction(args.mfu, "--mfu", minimum=MIN_MFU)
    out.update(qwz=bool(args.qwz), qgz=bool(args.qgz))
    if args.link_efficiency is not None:
        out["link_efficiency"] = link_efficiency_from(args.link_efficiency)
    out.update(fabric_from(args))
    if args.host_link is not None:
        if args.offload_optimizer is None and args.offload_params is None:
            raise ValueError("--host-link needs --offload-optimizer or --offload-params (it "
                             "times the offload's copies)")
        out["host_link"] = host_link_from(args.host_link)
    out.update(host_options_from(args, args.offload_optimizer is not None,
                                 args.offload_optimizer is not None
                                 or args.offload_params is not None))
    return out


def host_link_from(text: str) -> str:
    """``--host-link``: the name of a PCIe link of the catalogue."""
    if text.strip().lower() not in HOST_LINKS:
        raise ValueError(f"--host-link must be one of {', '.join(HOST_LINKS)}, got {text!r}")
    return get_link(text).name


def default_stages(args, stages):
    """``--stage`` when given; stage 3 alone with ``--qwz`` or ``--qgz`` (ZeRO++ is stage 3);
    else None."""
    return (3,) if stages is None and (args.qwz or args.qgz) else stages


def has_communication(result: dict) -> bool:
    return bool(result["stages"]) and "communication" in result["stages"][0]


def describe(result: dict) -> str:
    ic, compute = result["interconnect"], result["compute_settings"]
    where = ic["name"]
    if ic["gpus_per_node"] is not None:
        where += f" ({ic['gpus_per_node']} GPUs and {ic['nics_per_node']} network ports per node)"
    time = (f"{compute['tokens_per_gpu']:,} tokens per GPU at {compute['flops_per_param_token']} "
            f"FLOPs per parameter and token, mfu {compute['mfu']:g}")
    if compute["recomputed_attention_flops_per_token"]:   # the recompute setting's other part
        time += (f"; {compute['recompute']} recomputation repeats the attention core, "
                 f"{compute['recomputed_attention_flops_per_token']:,} FLOPs per token")
    overlap = result["overlap"]
    hidden = ", ".join(map(str, overlap["backward_hidden"])) or "none"
    runs = (f"Engine {result['engine']}, {result['micro_batches']} micro-batch"
            f"{'es' if result['micro_batches'] != 1 else ''} per step; overlap rule "
            f"{overlap['name']} (backward collectives hidden at stages {hidden}; post-step "
            f"all-gather {'hidden behind the next forward' if overlap['post_step_gather_hidden'] else 'exposed'}"
            f"{'; first gather exposed' if overlap['first_gather_exposed'] else ''}"
            f"{'; latency charged' if overlap['latency_exposed'] else ''}).")
    line = (f"Communication over {where}: bus bandwidth {ic['bus_bandwidth'] / 1e9:,.1f} GB/s per "
            f"GPU and direction ({efficiency_words(ic['link_efficiency'])}{fabric_words(ic)}); {time}. {runs}")
    hosts = [row["communication"]["host"] for row in result["stages"]
             if row["communication"]["host"] is not None]
    return line if not hosts else line + "\n" + _host_line(hosts[0])


def _host_line(host: dict) -> str:
    """What the offload's host was taken to be: its CPUs, the CPU step's basis, NVMe's rates."""
    settings = host["host_settings"]
    node = settings["host"]
    step = f"the {node['memory_bandwidth'] / 1e9:,.1f} GB/s memory-bandwidth roofline"
    if settings["cpu_adam_rate"] is not None:
        step = f"{settings['cpu_adam_rate']:,.0f} parameters/s for the node, or {step} if slower"
    step = (f"the CPU's optimizer step at {step}, after the backward, hidden behind nothing"
            if host["cpu_step"]["elements"] else "no CPU step (the optimizer stays on the GPU)")
    return (f"Offload host: {node['cpus']} ({node['name']}); {step}; NVMe at "
            f"{host['nvme_read_bandwidth'] / 1e9:,.2f} GB/s read, "
            f"{host['nvme_write_bandwidth'] / 1e9:,.2f} GB/s written per GPU.")


def fabric_words(ic: dict) -> str:
    """An answer's rail fabric in words ("" when it changes nothing)."""
    if ic.get("leaf_nodes") is None or ic.get("oversubscription", 1) == 1:
        return ""
    return f"; {ic['leaf_nodes']:,} nodes per rail leaf, spine {ic['oversubscription']:g}:1 beyond"


def efficiency_words(name: str) -> str:
    """How the text says which link efficiency an answer used (``name`` from its JSON)."""
    return link_efficiency(name if name in EFFICIENCY_NAMES else float(name)).words


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def _beyond_zero(result: dict) -> tuple[bool, bool]:
    """(a shard group, hpZ, qwZ or qgZ is in use; offload is)."""
    rows = [row["communication"] for row in result["stages"]]
    placement = result.get("placement") or {}
    grouped = any(c["replicas"] > 1 or c["qwz"] or c["qgz"] for c in rows) or (
        placement.get("hpz_partition", 1) > 1)
    return grouped, any(c["host"] is not None for c in rows)


def table_columns(result: dict, unit: str) -> tuple[list[str], list[list[str]]]:
    """Bytes sent per GPU (each GPU receives as much), then the times and the waiting share;
    with a shard group or ZeRO++ the bytes leaving each node, with offload the host's seconds."""
    grouped, offloaded = _beyond_zero(result)
    headers = [f"sent/GPU [{unit}]", *([f"leaves node [{unit}]"] if grouped else []),
               "comm [s]", *(["host [s]", "CPU step [s]"] if offloaded else []), "compute [s]",
               "step [s]",
               "network wait"]
    cells = []
    for row in result["stages"]:
        c = row["communication"]
        wait = c["network_wait_fraction"]
        crossing = ("-" if c["cross_node_bytes"] is None
                    else f"{to_unit(c['cross_node_bytes'], unit):,.2f}")
        cells.append([f"{to_unit(c['sent_bytes'], unit):,.2f}", *([crossing] if grouped else []),
                      _seconds(c["communication_seconds"]),
                      *([_seconds(c["host_seconds"]), _seconds(c["cpu_step_seconds"])]
                        if offloaded else []),
                      _seconds(c["compute_seconds"]), _seconds(c["step_seconds"]),
                      "-" if wait is None else f"{wait:.1%}"])
    return headers, cells


def csv_columns(result: dict) -> tuple[list[str], list[list]]:
    """Per kind the calls, bytes handed and sent; the totals; the seconds (empty when unknown)."""
    from zerolib.core.step.collectives import KINDS
    headers = [f"{kind}_{what}" for kind in KINDS for what in ("calls", "handed_bytes",
                                                               "sent_bytes")]
    headers += ["sent_bytes", "received_bytes", *SECONDS, "network_wait_fraction",
                *LATER_COLUMNS]
    cells = []
    for row in result["stages"]:
        c = row["communication"]
        values = [c["collectives"][kind][what] for kind in KINDS
                  for what in ("calls", "handed_bytes", "sent_bytes")]
        values += [c["sent_bytes"], c["received_bytes"]]
        values += ["" if c[key] is None else c[key] for key in (*SECONDS, "network_wait_fraction")]
        values += [c["collectives"]["all_to_all"][what]
                   for what in ("calls", "handed_bytes", "sent_bytes")]
        values += ["" if c[key] is None else c[key] for key in LATER_COLUMNS[3:]]
        cells.append(values)
    return headers, cells
