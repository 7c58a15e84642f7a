"""``zerolib plan``: every configuration of a model on a cluster, which fit, ranked by step time."""
from __future__ import annotations

import argparse
import math

from zerolib.cli import _own_model as own_model_cli
from zerolib.cli import _run as run_cli
from zerolib.cli import _run_file as run_file_cli
from zerolib.cli import _trainer_files as trainer_files_cli
from zerolib.cli import _working_set as working_set_cli
from zerolib.cli._arguments import add_layout_arguments, layout_from
from zerolib.cli._communication import (
    HOST_LINKS,
    add_host_arguments,
    add_link_efficiency,
    fabric_from,
    host_link_from,
    host_options_from,
    link_efficiency_from,
)
from zerolib.cli._output import fitted_table, json_text, output_width, wrapped
from zerolib.cli._summaries import SUMMARIES
from zerolib.core.catalogue.devices import DEVICES
from zerolib.core.catalogue.links import LINKS
from zerolib.core.catalogue.nodes import NODES
from zerolib.core.inputs import MAX_BYTES, MAX_GPUS, echo
from zerolib.core.memory.accounting import STAGES
from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.memory.model_parallel import ALL_CHUNKS, MAX_CHUNKS, MAX_MICRO_BATCHES
from zerolib.core.memory.working_set import MAX_SEQ_LEN
from zerolib.core.parse import parse_fraction, parse_size, parse_whole
from zerolib.core.plan_table import plan_csv, plan_rows
from zerolib.core.planner import (
    DEFAULT_LINKS,
    MAX_PLAN_MICRO_BATCH,
    OFFLOADS,
    PLAN_HEADER,
    PLAN_LEFT_OUT,
    SEARCHED_COLUMNS,
    SHARD_GROUPS,
    plan,
)
from zerolib.core.step.engines import DEFAULT_ENGINE, ENGINE_NAMES
from zerolib.core.step.offload_traffic import DEFAULT_HOST_LINK
from zerolib.core.step.time import DEFAULT_MFU, MIN_MFU
from zerolib.core.units import UNITS, to_unit

DEFAULT_TOP = 20
# What fits judges (the engine's memory convention), in words
_JUDGED = {"peak": "peak", "peak_reserved": "reserved peak"}
SEQUENCE_PARALLEL = {"both": (False, True), "on": (True,), "off": (False,)}


def register(commands) -> None:
    parser = commands.add_parser(
        "plan", help=SUMMARIES["plan"],
        description="Enumerate every configuration of tensor, pipeline and data parallelism, "
                    "ZeRO stage, shard group, recomputation, micro-batch and offload for a model "
                    "on a cluster; reject what cannot run (by rule, with counts); report those "
                    "whose peak per GPU fits, with headroom, step time and network share, fastest "
                    "first. " + PLAN_HEADER,
        epilog="Left out: " + "; ".join(PLAN_LEFT_OUT) + ".")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--model", metavar="NAME", help="a preset from 'zerolib models'")
    own_model_cli.add_arguments(what)
    parser.add_argument("--gpus", metavar="N", help="GPUs in all")
    parser.add_argument("--gpus-per-node", metavar="K",
                        help="GPUs per node (tensor parallelism stays within a node); above "
                             "--gpus, the run's GPUs sit on one such node")
    parser.add_argument("--device", choices=list(DEVICES))
    parser.add_argument("--seq", metavar="TOKENS", help="sequence length")
    parser.add_argument("--global-batch", metavar="B",
                        help="sequences per step, over all data-parallel replicas")
    parser.add_argument("--links", metavar="NAME",
                        help="a node (" + ", ".join(NODES) + "), two links INTRA,NETWORK (e.g. "
                             "nvlink4,ib-ndr: one network port per GPU), or one link joining every "
                             "GPU alike (" + ", ".join(LINKS) + "); default: the node the device "
                             "comes in (" + ", ".join(f"{d}: {n}" for d, n in DEFAULT_LINKS.items()) + ")")
    add_layout_arguments(parser, default=None)
    add_link_efficiency(parser)
    parser.add_argument("--mfu", metavar="U",
                        help=f"fraction of the device's peak the compute reaches, e.g. 0.4 or 40%% "
                             f"(default {DEFAULT_MFU:g})")
    parser.add_argument("--host-link", metavar="NAME",
                        help=f"the PCIe link offload's copies run on ({', '.join(HOST_LINKS)}; "
                             f"default {DEFAULT_HOST_LINK})")
    add_host_arguments(parser)
    parser.add_argument("--host-memory", metavar="SIZE",
                        help="CPU memory per node, e.g. 1TiB: without it, offloaded configurations "
                             "are never reported as fitting")
    parser.add_argument("--max-micro-batch", metavar="N",
                        help="micro-batches tried: 1 to N (default 8)")
    parser.add_argument("--stages", metavar="LIST", help="ZeRO stages tried (default 0,1,2,3)")
    parser.add_argument("--recompute", metavar="LIST",
                        help="recomputations tried, from " + ",".join(RECOMPUTE) + " (default: "
                             "none,selective,full; under --engine torchtitan its own "
                             "none,op-selective,full); selective is Megatron-LM's (under flash "
                             "attention it equals none less the 4-byte log-sum-exp)")
    parser.add_argument("--chunks", metavar="LIST",
                        help="pipeline schedules tried: 1 is 1F1B, V >= 2 interleaved with V model "
                             "chunks per stage (default all: at each pipeline degree P, 1F1B and "
                             "every V >= 2 with P x V dividing the layers, Megatron-LM's rule)")
    parser.add_argument("--pipeline-layers", metavar="FIRST,LAST",
                        help="uneven pipeline stages searched beside the even split: FIRST,LAST "
                             "(the first and last stage's layers, the rest split evenly) wherever "
                             "it splits the layers, or 'even' for none (default: one layer fewer "
                             "on the first and last stage where the pipeline divides the layers "
                             "+ 2, as Meta ran Llama 3.1 405B)")
    parser.add_argument("--offload", metavar="LIST",
                        help="offloads tried, from " + ",".join(OFFLOADS) + " (to CPU memory; "
                             "default all three)")
    parser.add_argument("--sequence-parallel", choices=list(SEQUENCE_PARALLEL), default="both",
                        help="with tensor parallelism: try both (default), on or off")
    parser.add_argument("--shard-groups", choices=list(SHARD_GROUPS),
                        help="stages 1-3: every shard group G dividing d (default), or G = d only")
    parser.add_argument("--engine", choices=list(ENGINE_NAMES),
                        help=f"whose stages, pipeline rule, schedule, overlap and memory "
                             f"convention: the ZeRO paper's, DeepSpeed 0.19.8 at its defaults, "
                             f"PyTorch FSDP2, Megatron-LM's distributed optimizer, FSDP2 as "
                             f"torchtitan runs it (its loss, FSDP2's unsharded state beside a "
                             f"pipeline, fits judged on the reserved peak) (default "
                             f"{DEFAULT_ENGINE})")
    memory = parser.add_argument_group("the trainer's memory (as estimate counts it)")
    working_set_cli.add_memory_arguments(memory)
    parser.add_argument("--flash", action=argparse.BooleanOptionalAction, default=None,
                        help="flash-style attention, no s x s scores stored (default: on)")
    working_set_cli.add_capacity_factor(parser)
    parser.add_argument("--reserve", metavar="SIZE",
                        help="fixed reserve per GPU for CUDA context, NCCL and fragmentation "
                             "(default 2GiB: an assumption, not a measurement)")
    parser.add_argument("--top", metavar="N",
                        help=f"fitting configurations shown (default: {DEFAULT_TOP} in the table, "
                             "all in JSON and CSV)")
    parser.add_argument("--unit", choices=list(UNITS),
                        help="unit of the table (default GB; JSON and CSV are in bytes)")
    run_cli.add_argument(parser, run_cli.HELP + " (tokens per step: --global-batch x --seq)")
    parser.add_argument("--format", default="table", choices=("table", "json", "csv"),
                        help="table (header, ranking, rejections), json (all of it) or csv (the "
                             "fitting configurations only)")
    parser.add_argument("--wide", action="store_true",
                        help="print each table row and line whole, however wide (default: on a "
                             "terminal, the ranking's columns that do not fit its width go to a "
                             "further block, the rank repeated, and lines wrap; a pipe or file "
                             "gets whole rows)")
    parser.add_argument("--context-parallel", metavar="LIST",
                        help="context-parallel degrees C to search, e.g. 1,2,4 (default: 1,2,4,8,16 "
                             "under an --engine with ring attention, megatron or fsdp2, those "
                             "the GPUs and the sequence's 2C chunks allow; 1 under the others "
                             "or without --flash; above 1 needs both)")
    parser.add_argument("--expert-parallel", metavar="LIST",
                        help="expert-parallel degrees E to search, e.g. 1,8 (default: every "
                             "divisor of a mixture of experts' routed experts; 1 for a dense model)")
    parser.add_argument("--expert-tensor-parallel", metavar="LIST",
                        help="expert-tensor-parallel degrees ETP to search beside t, e.g. 1,2 "
                             "(Megatron-LM's --expert-tensor-parallel-size; default: under "
                             "--engine megatron every divisor of a mixture of experts' ffn width, "
                             "else ETP = t only)")
    parser.add_argument("--partition-activations", choices=("search", "on", "off"),
                        help="ZeRO-R P_a (DeepSpeed partition_activations) under full "
                             "recomputation with t > 1 and no sequence parallelism: search it "
                             "beside none, always, or never (default: off, DeepSpeed's own default; "
                             "the engines that offer it: deepspeed and paper)")
    parser.add_argument("--cpu-checkpointing", action="store_true", default=None,
                        help="also search ZeRO-R P_a+cpu (DeepSpeed cpu_checkpointing: "
                             "checkpoints in host memory, copied over the host link)")
    run_file_cli.add_arguments(parser, "the fastest fitting configuration's run")
    trainer_files_cli.add_arguments(parser)
    parser.set_defaults(func=run)


# the plan's flags that a run file can fill: the rest (the layout, stage, recomputation,
# micro-batch) the plan searches
_FILLED = ("gpus", "gpus_per_node", "device", "seq", "global_batch", "links", "layout", "bytes",
           "mfu", "host_link", "host", "cpu_adam_rate", "host_memory", "engine", "flash",
           "capacity_factor", "reserve", "link_efficiency", "leaf_nodes", "oversubscription",
           # the trainer's memory (estimate's): a run file's are the plan's
           "recompute_method", "recompute_layers", "loss", "loss_chunks", "norms", "fp8",
           "fp8_all_gather", "compile", "reserved_ppm", "reshard_after_forward")
_REQUIRED = {"gpus": "--gpus", "gpus_per_node": "--gpus-per-node", "device": "--device",
             "seq": "--seq", "global_batch": "--global-batch"}


def _fill_from_run_file(args) -> None:
    """A --run file's fields for the flags not given; then every flag a plan needs, present."""
    described = run_file_cli.read(args)
    if described is not None:
        searched = {dest: getattr(args, dest, None) for dest in vars(args) if dest not in _FILLED}
        run_file_cli.fill_args(args, described, renamed={"link": "links", "seq_len": "seq"})
        for dest, value in searched.items():   # the search is the plan's, not the run's
            setattr(args, dest, value)
        if args.seq is None:   # the run's own: the model's context length, at most 4,096
            args.seq = str(described.seq_len)

    if not any(getattr(args, name, None) is not None
               for name in ("model", "config", "megatron_args")) \
            and getattr(args, "run_model", None) is None:
        raise ValueError("one of the arguments --model --config --megatron-args --run is required")
    missing = [flag for dest, flag in _REQUIRED.items() if getattr(args, dest, None) is None
               and not (dest == "gpus_per_node" and described is not None)]   # the node's own
    if missing:
        raise ValueError(f"the following arguments are required: {', '.join(missing)} (or a "
                         "--run file that gives them)")
    if args.device not in DEVICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICES)}, got {echo(args.device)}")


def _list(text: str | None, name: str, parse):
    if text is None:
        return None
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or not all(parts):
        raise ValueError(f"{name} must be a comma-separated list, got {echo(text)}")
    return tuple(parse(part) for part in parts)


def _named(allowed, name):
    def parse(part):
        if part not in allowed:
            raise ValueError(f"{name} entries must be from {','.join(allowed)}, got {echo(part)}")
        return part
    return parse


def options_from(args, config) -> dict:
    """Keyword arguments for :func:`zerolib.core.planner.plan` from the flags."""
    # the layout: the flag's, else the engine's own (torchtitan's fp32-adam, the others' mixed-adam)
    options = {"layout": layout_from(args), "links": args.links,
               "sequence_parallel": SEQUENCE_PARALLEL[args.sequence_parallel],
               "shard_groups": args.shard_groups or "all"}
    if args.mfu is not None:
        options["mfu"] = parse_fraction(args.mfu, "--mfu", minimum=MIN_MFU)
    if args.host_link is not None:
        options["host_link"] = host_link_from(args.host_link)
    if args.link_efficiency is not None:
        options["link_efficiency"] = link_efficiency_from(args.link_efficiency)
    options.update(fabric_from(args))
    if args.host_memory is not None:
        options["host_memory"] = parse_size(args.host_memory, "--host-memory", maximum=MAX_BYTES)
    if args.max_micro_batch is not None:
        options["max_micro_batch"] = parse_whole(args.max_micro_batch, "--max-micro-batch",
                                                 maximum=MAX_PLAN_MICRO_BATCH)
    lists = {"stages": (args.stages, "--stages", lambda x: parse_whole(
                 x, "--stages", minimum=0, maximum=STAGES[-1])),
             "recompute": (args.recompute, "--recompute", _named(RECOMPUTE, "--recompute")),
             "chunks": (None if args.chunks == ALL_CHUNKS else args.chunks, "--chunks",
                        lambda x: parse_whole(x, "--chunks", maximum=MAX_CHUNKS)),
             "offload": (args.offload, "--offload", _named(tuple(OFFLOADS), "--offload"))}
    for key, (text, name, parse) in lists.items():
        value = _list(text, name, parse)
        if value is not None:
            options[key] = value
    if args.flash is not None:
        options["flash_attention"] = args.flash
    capacity_factor = working_set_cli.capacity_factor_from(args, config)
    if capacity_factor is not None:
        options["capacity_factor"] = capacity_factor
    if args.reserve is not None:
        options["reserve_bytes"] = parse_size(args.reserve, "--reserve", maximum=MAX_BYTES)
    offloads = set(options.get("offload", OFFLOADS)) - {"none"}
    options.update(host_options_from(args, bool(offloads), bool(offloads)))
    if args.engine is not None:
        options["engine"] = args.engine
    options.update(working_set_cli.memory_fields_from(args))
    for key, flag in (("context_parallel", "--context-parallel"), ("expert_parallel", "--expert-parallel"),
                      ("expert_tensor_parallel", "--expert-tensor-parallel")):
        value = _list(getattr(args, key), flag, lambda x, flag=flag: parse_whole(x, flag, maximum=MAX_GPUS))
        if value is not None:
            options[key] = value
    zero_r = _zero_r_from(args)
    if zero_r is not None:
        options["zero_r"] = zero_r
    if args.pipeline_layers is not None:
        options["pipeline_layers"] = ("even" if args.pipeline_layers.strip().lower() == "even"
                                      else working_set_cli.parse_first_last(args.pipeline_layers))
    refuse_no_effect(args, options)
    return options


def _zero_r_from(args) -> tuple[str, ...] | None:
    """The ZeRO-R options searched (None: the engine's default)."""
    mode, cpu = args.partition_activations, bool(args.cpu_checkpointing)
    if mode == "off":
        if cpu:
            raise ValueError("--cpu-checkpointing needs --partition-activations search or on "
                             "(P_a+cpu keeps the partitioned checkpoints on the host)")
        return ("none",)
    if mode == "on":
        return ("partition+cpu",) if cpu else ("partition",)
    if mode == "search" or cpu:
        return ("none", "partition", *(("partition+cpu",) if cpu else ()))
    return None


def refuse_no_effect(args, options: dict) -> None:
    """Flags that would change nothing in this plan are refused in one line."""
    if args.unit is not None and args.format != "table":
        raise ValueError(f"--unit changes only the table; {args.format.upper()} is in bytes")
    if args.wide and args.format != "table":
        raise ValueError(f"--wide changes only the table; {args.format.upper()} has one record "
                         f"per row already")
    if set(options.get("offload", OFFLOADS)) == {"none"}:
        given = [flag for flag, value in (("--host-link", args.host_link),
                                          ("--host-memory", args.host_memory)) if value is not None]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} an offload in --offload (with none, no "
                             "state leaves the GPU)")
    if args.shard_groups is not None and set(options.get("stages", STAGES)) == {0}:
        raise ValueError("--shard-groups changes only ZeRO stages 1-3, and --stages is 0 alone")


def run(args) -> int:
    fixed = trainer_files_cli.plan_fixed(args, own_model_cli.model_from(args))
    _fill_from_run_file(args)
    top = None if args.top is None else parse_whole(args.top, "--top", maximum=MAX_GPUS)
    tokens = run_cli.tokens_from(args)
    model = own_model_cli.model_from(args) or getattr(args, "run_model", None)
    result = plan(model, parse_whole(args.gpus, "--gpus", maximum=MAX_GPUS),
                  None if args.gpus_per_node is None else
                  parse_whole(args.gpus_per_node, "--gpus-per-node", maximum=MAX_GPUS),
                  args.device, parse_whole(args.seq, "--seq", maximum=MAX_SEQ_LEN),
                  parse_whole(args.global_batch, "--global-batch", maximum=MAX_MICRO_BATCHES),
                  **{**options_from(args, model), **fixed})
    run_file_cli.save(args, result.run(result.fits.iloc[0]) if len(result.fits) else None)
    if args.format == "json":
        out = as_json(result, top)
        print(json_text(out if tokens is None else run_cli.add_to_plan(out, result, tokens)))
    elif args.format == "csv":
        print(as_csv(result, top, tokens))
    else:
        width = output_width(args.wide)
        table = as_table(result, DEFAULT_TOP if top is None else top, args.unit or "GB", width)
        print(table if tokens is None else "\n".join(
            [table, "", *wrapped(run_cli.plan_lines(result, tokens), width)]))
    return 0


def as_json(result, top=None) -> dict:
    return {"header": PLAN_HEADER, "left_out": list(PLAN_LEFT_OUT), "settings": result.settings.as_dict(),
            "counts": result.counts(), "fits": plan_rows(result.fits, top),
            "rejected": plan_rows(result.rejected)}


def as_csv(result, top=None, tokens=None) -> str:
    return plan_csv(result, top, None if tokens is None else run_cli.plan_cost(result, tokens))


# What tells two fitting configurations apart besides their recomputation and what it changes
# (the peak, its headroom and stage): rows equal in these and in step time are one choice shown
# twice. Selective and full recomputation repeat FLOPs none does not, so such ties are rare.
_TWIN_KEY = ("tensor_parallel", "pipeline_parallel", "data_parallel", "sequence_parallel",
             "chunks", "schedule", "stage", "shard_group", "micro_batch", "micro_batches",
             "offload", "step_seconds")
SEARCHED = SEARCHED_COLUMNS     # columns only when searched
_ZERO_R_KEY = ("partition_activations", "cpu_checkpointing")
_SPLIT_KEY = ("first_layers", "last_layers")


def tied_rows(fits, top: int) -> list[list[dict]]:
    """The first ``top`` distinct configurations of ``fits`` (ranked), each as the list of its
    rows that differ only in recomputation and tie on step time, best-ranked first."""
    key = [*_TWIN_KEY, *(c for c in (*SEARCHED[:2], *_ZERO_R_KEY, *_SPLIT_KEY)
                         if c in fits.columns)]
    group = fits.groupby(key, sort=False, dropna=False, observed=True).ngroup()
    first = list(dict.fromkeys(group.to_numpy().tolist()))[:top]
    chosen = fits[group.isin(first).to_numpy()]
    by_group: dict[int, list[dict]] = {g: [] for g in first}
    for g, record in zip(group[chosen.index].tolist(), plan_rows(chosen)):
        by_group[g].append(record)
    return list(by_group.values())


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 2 and ranks[1] == ranks[0] + 1:
        return f"{ranks[0]}-{ranks[1]}"
    return ",".join(str(r) for r in ranks)


def _cpu_step_basis(s) -> str:
    """How the plan times the CPU's optimizer step."""
    if s.host.cpu_adam_rate is None:
        return (f"CPU step at the {s.host.host.memory_bandwidth / 1e9:,.1f} GB/s memory-bandwidth "
                "roofline")
    return f"CPU step at {s.host.cpu_adam_rate:,.0f} parameters/s or the roofline if slower"


def _zero_r_label(row) -> str:
    pa, cpu = bool(row["partition_activations"]), bool(row["cpu_checkpointing"])
    return {(True, True): "P_a+cpu", (True, False): "P_a", (False, True): "cpu"}.get((pa, cpu), "-")


def as_table(result, top: int, unit: str, width: int | None = None) -> str:
    """The plan as text: its header lines, the ranking and the rejections, fitting ``width``
    characters (None: no limit)."""
    s = result.settings
    counts = result.counts()
    judges = s.working_set.convention.judges
    ic = s.interconnect
    links = ic.label if ic.network is None else (f"{ic.name}: {ic.intra.label} inside, "
                                                 f"{ic.network.label} across")
    lines = [
        f"Plan for {s.model.name} on {s.gpus:,} x {s.device.label} ({s.gpus_per_node} per node; "
        f"{links}; {ic.efficiency.words}{ic.fabric_words}), sequence {s.seq_len:,}, global batch "
        f"{s.global_batch:,} sequences, layout {s.layout.name}, mfu {s.mfu:g}, engine "
        f"{s.engine.name} (overlap rule {(s.overlap or s.engine.overlap).name})"
        + ("" if s.host_memory is None else f", {to_unit(s.host_memory, unit):,.2f} {unit} of CPU "
                                            f"memory per node")
        + (f", offload over {s.host_link.label} on {s.host.host.label}'s CPUs and drives "
           f"({_cpu_step_basis(s)})" if set(s.offload) - {"none"} else "") + ".",
        PLAN_HEADER, "Left out: " + "; ".join(PLAN_LEFT_OUT) + ".",
        *([f"The run's {s.gpus:,} GPUs sit on one node of {s.gpus_per_node:,} (--gpus-per-node "
           f"is above --gpus)."]
          if s.gpus < s.gpus_per_node else []),
        f"{counts['configurations']:,} configurations: {counts['fit']:,} fit, "
        f"{counts['rejected']:,} rejected; fits means the {_JUDGED[judges]} per GPU is at most "
        f"{to_unit(s.device.capacity, unit):,.1f} {unit}.", ""]
    fits = result.fits
    if len(fits):
        headers = ["rank", "t", "SP", "p", "schedule", "d", "ZeRO", "group", "recompute",
                   "micro-batch", "offload", f"peak [{unit}]", f"reserved [{unit}]",
                   f"headroom [{unit}]", "step [s]",
                   "network", "bubble"]
        searched = [c for c in SEARCHED[:2] if c in fits.columns]   # C, E: shown when searched
        headers[3:3] = [{"context_parallel": "C", "expert_parallel": "E"}[c] for c in searched]
        etp = bool(s.model.experts)      # a mixture of experts: each row's ETP (t unless searched)
        if etp:
            headers.insert(3 + len(searched), "ETP")
        zero_r = "partition_activations" in fits.columns     # ZeRO-R searched: which option
        if zero_r:
            headers.insert(headers.index("recompute") + 1, "ZeRO-R")
        split = "first_layers" in fits.columns    # uneven stages searched: FIRST,LAST or even
        if split:
            headers.insert(headers.index("schedule") + 1, "stages")
        rows, shown, extra_peak = [], 0, 0
        for twins in tied_rows(fits, top):
            r = twins[0]
            shown += len(twins)
            extra_peak = max(extra_peak, *(t["peak_bytes"] - r["peak_bytes"] for t in twins))
            rows.append([_ranks([t["rank"] for t in twins]), r["tensor_parallel"],
                         "yes" if r["sequence_parallel"] else "no",
                         *(r[c] for c in searched),
                         *([r.get("expert_tensor_parallel", r["tensor_parallel"])] if etp else []),
                         r["pipeline_parallel"], r["schedule"],
                         *([f"{r['first_layers']},{r['last_layers']}" if r["first_layers"]
                            else "even"] if split else []),
                         r["data_parallel"], r["stage"],
                         r["shard_group"], "|".join(str(t["recompute"]) for t in twins),
                         *([_zero_r_label(r)] if zero_r else []),
                         f"{r['micro_batch']} x {r['micro_batches']}", r["offload"],
                         f"{to_unit(r['peak_bytes'], unit):,.2f}",
                         f"{to_unit(r['peak_reserved_bytes'], unit):,.2f}",
                         f"{to_unit(r['headroom_bytes'], unit):,.2f}", f"{r['step_seconds']:,.2f}",
                         f"{r['network_wait_fraction']:.1%}", f"{r['bubble_fraction']:.1%}"])
        lines.append([fitted_table(headers, rows, width)])    # a list: laid out already
        if len(fits) > shown:
            lines.append(f"... {len(fits) - shown:,} more fit (--top N shows more)")
        lines.append("micro-batch b x m: b sequences per micro-batch, m micro-batches per step "
                     "and pipeline; peak: the allocated peak (torch.cuda.max_memory_allocated) "
                     "plus the reserve outside PyTorch's allocator; reserved: with the caching "
                     "allocator's reserve (max_memory_reserved); headroom: capacity less the "
                     f"{_JUDGED[judges]}; network and bubble: shares of the step."
                     + (" stages FIRST,LAST: the layers of the first and last pipeline stage, "
                        "the rest split evenly (even: L // p each, one more on the first L mod p)." if split
                        else ""))
        if shown > len(rows):
            lines.append(
                f"recompute a|b: one configuration under two recomputations that tie on step "
                f"time, shown once with both ranks; peak and headroom are the first-named's, the other's "
                f"peak is at most {to_unit(extra_peak, unit):,.2f} {unit} higher; JSON and CSV "
                f"list each.")
    else:
        lines.append("Nothing fits.")
    if len(result.rejected):
        lines += ["", "Rejected, by the first rule each configuration breaks (count, rule, an "
                      "example):"]
        count = max(len(f"{n:,}") for n in result.rejected["configurations"])
        for r in result.rejected.to_dict("records"):
            example = f"e.g. {r['example']}"
            if r["example_bytes"] is not None and not (isinstance(r["example_bytes"], float)
                                                       and math.isnan(r["example_bytes"])):
                example = (f"closest: {r['example']}, "
                           f"{to_unit(r['example_bytes'], unit):,.2f} {unit}")
            lines += [wrapped([f"{r['configurations']:>{count},}  {r['reason']}"], width,
                              indent=" " * (count + 2)), f"{'':>{count}}  {example}"]
    out = []
    for part in lines:     # prose wrapped to the width; a list is laid out already
        out += part if isinstance(part, list) else wrapped([part], width)
    return "\n".join(out)


