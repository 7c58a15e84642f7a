"""``zerolib estimate``: the per-stage breakdown for one model size and GPU count."""
from __future__ import annotations

import csv
import io

from zerolib.cli import _communication as communication_cli
from zerolib.cli import _fake_run as fake_run_cli
from zerolib.cli import _own_model as own_model_cli
from zerolib.cli import _placement as placement_cli
from zerolib.cli import _run as run_cli
from zerolib.cli import _run_file as run_file_cli
from zerolib.cli import _trainer_files as trainer_files_cli
from zerolib.cli import _working_set as working_set_cli
from zerolib.cli._arguments import (
    add_layout_arguments,
    gpu_count,
    layout_from,
    stage_number,
)
from zerolib.cli._output import fitted_table, json_text, output_width, wrapped
from zerolib.cli._summaries import SUMMARIES
from zerolib.core.catalogue.devices import CAPACITY_BASES, DEVICES, device_at
from zerolib.core.defaults import DEFAULT_GPUS_PER_NODE
from zerolib.core.estimate import estimate
from zerolib.core.inputs import MAX_GPUS
from zerolib.core.memory.accounting import CATEGORIES, STAGES, STRATEGY_NAMES
from zerolib.core.parse import parse_count, parse_whole
from zerolib.core.run import Run
from zerolib.core.units import UNITS, to_unit


def register(commands) -> None:
    parser = commands.add_parser(
        "estimate", help=SUMMARIES["estimate"],
        description="Persistent model state (parameters, gradients, optimizer state) per GPU "
                    "under plain data parallelism and ZeRO stages 1-3.")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--params", metavar="COUNT",
                      help="parameter count: 7B, 350M, 1.5T, 7e9 or 7000000000")
    what.add_argument("--model", metavar="NAME",
                      help="a preset from 'zerolib models' (exact count; adds the working set)")
    own_model_cli.add_arguments(what)
    parser.add_argument("--gpus", metavar="N",
                        help="GPUs: data-parallel workers (x tensor x pipeline parallel degrees)")
    add_layout_arguments(parser, default=None)
    parser.add_argument("--stage", metavar="N", help="only this stage (0-3); default: all four")
    parser.add_argument("--device", choices=list(DEVICES), help="judge fit against this device")
    parser.add_argument("--capacity", choices=CAPACITY_BASES,
                        help="read the device's capacity as its nominal GiB (default), the same "
                             "figure in decimal GB, or what nvidia-smi reports (needs --device)")
    parser.add_argument("--unit", choices=list(UNITS),
                        help="unit of the table (GB = 10^9 bytes, GiB = 2^30; default GB); JSON "
                             "and CSV are in bytes")
    parser.add_argument("--format", default="table", choices=("table", "json", "csv"))
    parser.add_argument("--wide", action="store_true",
                        help="print each table row whole, however wide (default: on a terminal, "
                             "columns that do not fit its width go to a further block, the "
                             "strategy repeated; a pipe or file gets whole rows)")
    working_set_cli.add_arguments(parser)
    placement_cli.add_arguments(parser)
    communication_cli.add_arguments(parser)
    run_cli.add_argument(parser, run_cli.HELP + " (needs --link and --device; tokens per step: "
                         "tokens per GPU x --gpus)")
    experts = parser.add_argument_group("expert parallelism (a --model with experts)")
    experts.add_argument("--expert-parallel", metavar="E",
                         help="spread each MoE layer's routed experts over E GPUs (E divides the "
                              "experts); their state is sharded over the expert-data-parallel "
                              "group t x d / (ETP x E) (default 1)")
    experts.add_argument("--expert-tensor-parallel", metavar="ETP",
                         help="split each expert over ETP GPUs (Megatron-LM's "
                              "--expert-tensor-parallel-size; default: --tensor-parallel)")
    parser.add_argument("--gpus-per-node", metavar="N",
                        help="GPUs per node: with a --link node, its GPU count (default: the "
                             "node's own); with a placement flag, the GPUs sharing a node's CPU "
                             f"memory and NVMe (default {DEFAULT_GPUS_PER_NODE}, or --gpus when "
                             "fewer; --gpus must fill whole nodes). Above --gpus: the run's GPUs "
                             "sit on one such node, and only they share its CPU memory and NVMe")
    run_file_cli.add_arguments(parser)
    trainer_files_cli.add_arguments(parser)
    fake_run_cli.add_argument(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    described = run_file_cli.read(args)
    if described is not None:
        run_file_cli.fill_args(args, described)
    if not any(getattr(args, name, None) is not None
               for name in ("params", "model", "config", "megatron_args")) \
            and getattr(args, "run_model", None) is None:
        raise ValueError("one of the arguments --params --model --config --megatron-args --run is "
                         "required")
    fields = trainer_files_cli.fill_estimate(args, _model_named(args))
    if args.gpus is None:
        raise ValueError("the following arguments are required: --gpus (or a --run file)")
    layout = layout_from(args)
    if layout is not None:
        fields["layout"] = layout
    if args.capacity is not None and args.device is None:
        raise ValueError("--capacity needs --device")
    if args.device is not None:
        device_at(args.device, args.capacity or "nominal")   # a bad name is one line here
        fields.update(device=args.device, capacity=args.capacity or "nominal")
    stages = None if args.stage is None else (stage_number(args.stage),)
    stages = getattr(args, "run_stages", None) if stages is None else stages
    gpus = gpu_count(args.gpus, "--gpus")
    host_memory = placement_cli.host_memory_from(args)
    communication = communication_cli.options_from(args)
    tokens = run_cli.tokens_from(args)
    if tokens is not None and (args.link is None or args.device is None):
        raise ValueError("--tokens needs --link and --device (the run takes its steps x the step "
                         "time, which needs both)")
    accumulation = communication_cli.micro_batches_from(args)
    if accumulation:   # gradient accumulation: not the pipeline's flag here
        args.micro_batches = None
    communication.update(accumulation, **communication_cli.engine_from(args))
    refuse_no_effect(args)
    stages = communication_cli.default_stages(args, stages)
    if args.gpus_per_node is not None and not (placement_cli.requested(args)
                                               or "gpus_per_node" in communication):
        raise ValueError("--gpus-per-node needs a --link node or a placement flag (--shard-group, "
                         "--hpz, --offload-optimizer, --offload-params, --host-memory)")
    if args.gpus_per_node is not None:
        fields["gpus_per_node"] = parse_whole(args.gpus_per_node, "--gpus-per-node", maximum=MAX_GPUS)
    fields.update(communication, **placement_cli.fields_from(args))
    if host_memory is not None:
        fields["host_memory"] = host_memory
    if tokens is not None:
        fields["tokens"] = tokens
    config = own_model_cli.model_from(args) or getattr(args, "run_model", None)
    if config is not None:
        fields.update(working_set_cli.fields_from(args, config), **_experts_from(args))
        if stages is not None:
            fields["stages"] = stages
        answer = _run_of(config, gpus, fields)
        working_set_cli.refuse_no_effect(args, answer.working_set_settings(), stages or STAGES)
    else:
        if args.expert_parallel is not None or args.expert_tensor_parallel is not None:
            raise ValueError("--expert-parallel and --expert-tensor-parallel need --model (a "
                             "model with experts)")
        working_set_cli.without_model(args)
        if stages is not None:
            fields["stages"] = stages
        answer = _run_of(parse_count(args.params, "--params"), gpus, fields)
    if args.fake_run:
        fake_run_cli.check(args, answer)
    result = estimate(answer)
    run_file_cli.save(args, answer)
    out = result.as_dict()
    if args.fake_run:
        out["fake_run"] = fake_run_cli.answer(answer, out)
    if config is None:     # model state only: say what that leaves out, in every format
        out.update(working_set_cli.left_out())
    if tokens is not None:
        out = run_cli.add_to_estimate(out, tokens)
    width = output_width(args.wide) if args.format == "table" else None
    print(render(out, args.format, args.unit or "GB", partial_node_note(args, gpus), width))
    return 0


def _model_named(args):
    """The model the flags name (a preset, a config, a launch line's, a run file's, a count)."""
    model = own_model_cli.model_from(args) or getattr(args, "run_model", None)
    if model is None and getattr(args, "params", None) is not None:
        return parse_count(args.params, "--params")
    return model


def _run_of(model, gpus: int, fields: dict) -> Run:
    """The run the flags describe; a field's message names its flag."""
    try:
        return Run.of(model, gpus, **fields)
    except (ValueError, TypeError) as error:
        raise type(error)(run_file_cli.in_flags(str(error))) from None


def _experts_from(args) -> dict:
    out = {}
    if args.expert_parallel is not None:
        out["expert_parallel"] = parse_whole(args.expert_parallel, "--expert-parallel",
                                             maximum=MAX_GPUS)
    if args.expert_tensor_parallel is not None:
        out["expert_tensor_parallel"] = parse_whole(args.expert_tensor_parallel,
                                                    "--expert-tensor-parallel", maximum=MAX_GPUS)
    return out


def _experts_line(result: dict) -> str | None:
    rows = [row for row in result["stages"] if "expert_parallel" in row]
    if not rows:
        return None
    e, traffic = rows[0]["expert_parallel"], rows[0]["expert_traffic"]
    return (f"Expert parallelism: E = {e['expert_parallel']}, expert tensor parallelism "
            f"{e['expert_tensor_parallel']}; the dense part is sharded over d = "
            f"{e['data_parallel']}, the routed experts over the expert-data-parallel group of "
            f"{e['expert_data_parallel']}; {traffic['all_to_all_calls']:,} all-to-alls per step "
            f"send {traffic['sent_bytes_per_step']:,} bytes per GPU ({traffic['routing']} routing)"
            + (f"; {traffic['etp_calls']:,} all-gathers and reduce-scatters over the "
               f"{traffic['expert_tensor_parallel']} expert-tensor-parallel ranks send "
               f"{traffic['etp_sent_bytes_per_step']:,}" if traffic.get("etp_calls") else ""))


def _has_parallel_step(result: dict) -> bool:
    return bool(result["stages"]) and "parallel_step" in result["stages"][0]


def _parallel_step_line(result: dict) -> str:
    step, compute, ws = (result["stages"][0]["parallel_step"], result["compute_settings"],
                         result["working_set_settings"])
    degrees = (("t", ws["tensor_parallel"]), ("p", ws["pipeline_parallel"]),
               ("C", step["context_parallel"]), ("E", step["expert_parallel"]))
    spread = [f"{name} = {value}" for name, value in degrees if value > 1]
    if step["expert_parallel"] > 1 or step["expert_tensor_parallel"] != ws["tensor_parallel"]:
        spread.append(f"ETP = {step['expert_tensor_parallel']}")   # (the experts' own t)
    not_overlapped = [what for what, shown in (
        ("the tensor-parallel collectives", ws["tensor_parallel"] > 1),
        ("the pipeline's sends", ws["pipeline_parallel"] > 1),
        ("ring attention", step["context_parallel"] > 1),
        ("the experts' all-to-alls", step["expert_parallel"] > 1)) if shown]
    m = result["micro_batches"]
    return (f"Step timed as zerolib plan times it ({', '.join(spread) or 'E = 1'}): on "
            f"{result['interconnect']['name']}, engine {result['engine']}, {m} micro-batch"
            f"{'es' if m > 1 else ''} of {compute['tokens_per_gpu'] // m:,} tokens per GPU, mfu "
            f"{compute['mfu']:g}" + (f"; {_and(not_overlapped)} "
                                     f"{'is' if not_overlapped == ['ring attention'] else 'are'} "
                                     "not overlapped" if not_overlapped else ""))


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _parallel_step_columns(result: dict) -> tuple[list[str], list[list[str]]]:
    # compute, context, expert and data-parallel always; the tensor-parallel, pipeline and bubble
    # parts where some row has them
    shown = [part for part in _parts(result) if part in ("compute", "context", "expert", "data_parallel")
             or any(row["parallel_step"]["parts"][part] for row in result["stages"])]
    headers = [f"{part.replace('_', '-')} [s]" for part in shown] + ["step [s]", "network wait"]
    cells = [[f"{row['parallel_step']['parts'][part]:,.3f}" for part in shown]
             + [f"{row['parallel_step']['step_seconds']:,.3f}",
                f"{row['parallel_step']['network_wait_fraction']:.1%}"]
             for row in result["stages"]]
    return headers, cells


def _parts(result: dict) -> list[str]:
    """The step's named parts, in the order the step model gives them (its JSON's)."""
    return list(result["stages"][0]["parallel_step"]["parts"])


def _parallel_step_csv(result: dict) -> tuple[list[str], list[list]]:
    parts = _parts(result)
    headers = [f"{part}_seconds" for part in parts] + ["step_seconds", "network_wait_fraction"]
    cells = [[row["parallel_step"]["parts"][part] for part in parts]
             + [row["parallel_step"]["step_seconds"], row["parallel_step"]["network_wait_fraction"]]
             for row in result["stages"]]
    return headers, cells


def refuse_no_effect(args) -> None:
    """Flags of the table, the compute time or the host judgement that would change nothing."""
    if args.unit is not None and args.format != "table":
        raise ValueError(f"--unit changes only the table; {args.format.upper()} is in bytes")
    if args.wide and args.format != "table":
        raise ValueError(f"--wide changes only the table; {args.format.upper()} has one record "
                         f"per row already")
    if args.device is None:
        given = [flag for flag, value in (("--mfu", args.mfu), ("--tokens-per-gpu",
                                                                  args.tokens_per_gpu))
                 if value is not None]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} --device (the compute time is the "
                             "device's peak FLOP/s x mfu; without a device no time is computed)")
    if (args.host_memory is not None and args.offload_optimizer is None
            and args.offload_params is None):
        raise ValueError("--host-memory needs --offload-optimizer or --offload-params (it judges "
                         "the CPU memory offload uses; without offload that is nothing)")


def partial_node_note(args, gpus: int) -> str | None:
    """What ``--gpus-per-node`` above ``--gpus`` means, said in the table (JSON and CSV carry
    both numbers): the run sits on one node, using some of its GPUs."""
    if args.gpus_per_node is None:
        return None
    per_node = parse_whole(args.gpus_per_node, "--gpus-per-node", maximum=MAX_GPUS)
    if per_node <= gpus:
        return None
    return (f"Node: --gpus-per-node {per_node:,} is above --gpus {gpus:,}: the run's {gpus:,} "
            f"GPUs sit on one node of {per_node:,}; only they share its CPU memory and NVMe, "
            f"and its rings join only them.")


def render(result: dict, form: str, unit: str, note: str | None = None,
           width: int | None = None) -> str:
    """The answer as JSON, CSV or a table; a table and its lines fit ``width`` characters (None:
    no limit)."""
    if form == "json":
        return json_text(result)
    columns = [*CATEGORIES, "total", "cluster_total"]
    if form == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        extra_headers, extra_cells = (working_set_cli.csv_columns(result)
                                      if working_set_cli.has_working_set(result) else ([], None))
        tier_headers, tier_cells = (placement_cli.csv_columns(result)
                                    if placement_cli.has_tiers(result) else ([], None))
        comm_headers, comm_cells = (communication_cli.csv_columns(result)
                                    if communication_cli.has_communication(result) else ([], None))
        if _has_parallel_step(result):
            comm_headers, comm_cells = _parallel_step_csv(result)
        if "run" in result:   # after every other column, so theirs keep their places
            run_headers, run_cells = run_cli.estimate_csv(result)
            comm_headers = comm_headers + run_headers
            comm_cells = [a + b for a, b in zip(comm_cells, run_cells)]
        if "leaves_out" in result:   # last of all, likewise
            left_headers, left_cells = working_set_cli.left_out_csv(result)
            comm_headers = comm_headers + left_headers
            comm_cells = [a + left_cells for a in (comm_cells or [[] for _ in result["stages"]])]
        writer.writerow(["params", "gpus", "layout", "stage", *columns, *extra_headers,
                         *tier_headers, "fits", *comm_headers])
        for index, row in enumerate(result["stages"]):
            writer.writerow([result["params"], result["gpus"], result["layout"]["name"], row["stage"],
                             *(row[c] for c in columns), *(extra_cells[index] if extra_cells else ()),
                             *(tier_cells[index] if tier_cells else ()),
                             "" if row["fits"] is None else row["fits"],
                             *(comm_cells[index] if comm_cells else ())])
        return out.getvalue().rstrip("\n")
    layout = result["layout"]
    device = result["device"]
    lines = [f"{result['params']:,} parameters on {result['gpus']} GPUs, layout {layout['name']} "
             f"({layout['parameters']:g} + {layout['gradients']:g} + {layout['optimizer']:g} bytes per parameter)"]
    if device:
        lines[0] += f"; {device['name']} holds {to_unit(device['capacity'], unit):,.1f} {unit}"
    if "engine" in result:   # whose stages these are
        lines[0] += f"; engine {result['engine']}"
    if note:
        lines.append(note)
    if "leaves_out" in result:
        lines.append(working_set_cli.left_out_line(result))
    extra_headers, extra_cells = [], [[] for _ in result["stages"]]
    if working_set_cli.has_working_set(result):
        extra_headers, extra_cells = working_set_cli.table_columns(result, unit)
        lines.append(working_set_cli.describe(result))
    if placement_cli.has_tiers(result):
        tier_headers, tier_cells = placement_cli.table_columns(result, unit)
        extra_headers = extra_headers + tier_headers
        extra_cells = [a + b for a, b in zip(extra_cells, tier_cells)]
        lines.append(placement_cli.describe(result, unit))
        note = placement_cli.host_note(result, unit)
        lines += [note] if note else []
    experts_line = _experts_line(result)
    lines += [experts_line] if experts_line else []
    comm_headers, comm_cells = [], [[] for _ in result["stages"]]
    if communication_cli.has_communication(result):
        comm_headers, comm_cells = communication_cli.table_columns(result, unit)
        lines.append(communication_cli.describe(result))
    if _has_parallel_step(result):
        comm_headers, comm_cells = _parallel_step_columns(result)
        lines.append(_parallel_step_line(result))
    judged = [f"{result['fits_judges']} fits"] if device else []
    headers = ["strategy", *(f"{c} [{unit}]" for c in CATEGORIES), f"per GPU [{unit}]",
               f"all GPUs [{unit}]", *extra_headers, *judged, *comm_headers]
    rows = [[STRATEGY_NAMES[row["stage"]], *(f"{to_unit(row[c], unit):,.2f}" for c in columns), *extra]
            + (["yes" if row["fits"] else "no"] if device else []) + comm
            for row, extra, comm in zip(result["stages"], extra_cells, comm_cells)]
    run = run_cli.estimate_lines(result) if "run" in result else []
    if "fake_run" in result:
        run = [*run, fake_run_cli.line(result["fake_run"], unit)]
    return "\n".join(wrapped(lines, width) + ["", fitted_table(headers, rows, width)]
                     + (["", *wrapped(run, width)] if run else []))
