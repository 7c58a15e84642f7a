"""The working-set options of ``zerolib estimate`` (``--model``, ``--seq``, ``--micro-batch`` ...).

Kept apart from ``estimate.py`` so that file only gains a few calls: these functions add the
arguments, turn them into :class:`zerolib.core.memory.working_set.WorkingSetSettings`, compute the
stage rows that carry ``working_set`` and ``peak``, and add table / CSV columns.
"""
from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from zerolib.core.defaults import (
    DEFAULT_SEQ,
    MAX_CHUNKS,
    MAX_CONTEXT_PARALLEL,
    MAX_MICRO_BATCH,
    MAX_MICRO_BATCHES,
    MAX_RECOMPUTE_LAYERS,
    MAX_SEQ_LEN,
    NORMS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    SCHEDULES,
    TERMS,
)
from zerolib.core.inputs import MAX_BYTES, MAX_ELEMENTS, MAX_GPUS
from zerolib.core.memory.loss import LOSSES, MAX_LOSS_CHUNKS
from zerolib.core.parse import parse_size, parse_whole
from zerolib.core.units import to_unit

if TYPE_CHECKING:
    from zerolib.core.memory.working_set import WorkingSetSettings

LABELS = {"activations": "activations", "logits_loss": "logits+loss", "ddp_buckets": "DDP buckets",
          "reduce_bucket": "reduce bucket", "allgather_bucket": "all-gather bucket",
          "gathered_parameters": "gathered params", "unsharded_gradients": "unsharded grads",
          "reserve": "reserve"}
# Options that only make sense with an architecture (dest -> flag, for the error message).
OPTIONS = {"seq": "--seq", "micro_batch": "--micro-batch", "recompute": "--recompute",
           "flash": "--flash/--no-flash", "tensor_parallel": "--tensor-parallel",
           "sequence_parallel": "--sequence-parallel", "pipeline_parallel": "--pipeline-parallel",
           "pipeline_schedule": "--pipeline-schedule", "pipeline_chunks": "--pipeline-chunks",
           "pipeline_layers": "--pipeline-layers", "micro_batches": "--micro-batches", "reserve": "--reserve",
           "reduce_bucket_size": "--reduce-bucket-size", "overlap_comm": "--overlap-comm",
           "prefetch_bucket_size": "--prefetch-bucket-size",
           "max_live_parameters": "--max-live-parameters", "ddp_bucket_view": "--ddp-bucket-view",
           "capacity_factor": "--capacity-factor", "context_parallel": "--context-parallel",
           "partition_activations": "--partition-activations",
           "cpu_checkpointing": "--cpu-checkpointing", "recompute_method": "--recompute-method",
           "recompute_layers": "--recompute-layers", "loss": "--loss", "loss_chunks": "--loss-chunks",
           "norms": "--norms", "fp8": "--fp8", "fp8_all_gather": "--fp8-all-gather",
           "compile": "--compile", "reserved_ppm": "--reserved-ppm",
           "reshard_after_forward": "--reshard-after-forward"}


def add_arguments(parser) -> None:
    ws = parser.add_argument_group(
        "working set (needs --model)",
        "Peak = persistent state + working set: activations (Korthikanti et al., MLSys 2023), logits and "
        "loss, DeepSpeed/DDP buffers, a fixed reserve. With these, 'fits' is judged on the peak.")
    ws.add_argument("--seq", metavar="TOKENS",
                    help=f"sequence length (default: the model's context length, at most {DEFAULT_SEQ})")
    ws.add_argument("--micro-batch", metavar="N", help="sequences per GPU per step (default 1)")
    ws.add_argument("--recompute", choices=RECOMPUTE,
                    help="activation recomputation (default none; torchtitan: op-selective): "
                         "selective is Megatron-LM's (the attention core; under flash attention it "
                         "equals none less the 4-byte log-sum-exp), op-selective torchtitan's "
                         "op-level policy, full keeps each layer's input")
    add_memory_arguments(ws)
    ws.add_argument("--flash", action=argparse.BooleanOptionalAction, default=None,
                    help="flash-style attention, no s x s scores stored (default: on)")
    ws.add_argument("--tensor-parallel", metavar="T",
                    help="tensor-parallel degree; --gpus is then T x data-parallel workers (default 1)")
    ws.add_argument("--sequence-parallel", action="store_true", default=None,
                    help="split norms and dropouts along the sequence (Megatron sequence parallelism)")
    ws.add_argument("--pipeline-parallel", metavar="P",
                    help="pipeline stages; --gpus is then T x P x data-parallel workers (default 1)")
    ws.add_argument("--pipeline-schedule", choices=SCHEDULES,
                    help="1f1b (default) or interleaved (needs --pipeline-chunks of 2 or more)")
    ws.add_argument("--pipeline-chunks", metavar="V",
                    help="model chunks per pipeline stage for the interleaved schedule (default 1)")
    ws.add_argument("--pipeline-layers", metavar="FIRST,LAST",
                    help="uneven pipeline stages: the layers of the first and the last stage, the "
                         "rest split evenly over the middle stages (Megatron-LM's "
                         "--decoder-first/last-pipeline-num-layers; default: even)")
    ws.add_argument("--micro-batches", metavar="M",
                    help="micro-batches per step and pipeline (default: enough to fill the "
                         "pipeline); with --link and no pipeline, gradient accumulation's "
                         "micro-batches per step, which the traffic and time follow (default 1)")
    ws.add_argument("--reserve", metavar="SIZE",
                    help="fixed reserve for CUDA context, NCCL and fragmentation, e.g. 2GiB, 1.5GB, 0 "
                         "(default 2GiB: an assumption, not a measurement)")
    ws.add_argument("--reduce-bucket-size", metavar="ELEMENTS",
                    help="DeepSpeed reduce_bucket_size (default 5e8 elements)")
    ws.add_argument("--overlap-comm", action="store_true", default=None,
                    help="DeepSpeed overlap_comm in stages 1-2: a second reduce bucket")
    ws.add_argument("--prefetch-bucket-size", metavar="ELEMENTS",
                    help="DeepSpeed stage3_prefetch_bucket_size (default 5e7 elements)")
    ws.add_argument("--max-live-parameters", metavar="ELEMENTS",
                    help="DeepSpeed stage3_max_live_parameters (default 1e9 elements)")
    ws.add_argument("--ddp-bucket-view", action="store_true", default=None,
                    help="stage 0: PyTorch DDP gradient_as_bucket_view=True (no second gradient copy)")
    add_capacity_factor(ws)
    ws.add_argument("--context-parallel", metavar="C",
                    help="context-parallel degree (Megatron-LM --context-parallel-size): each "
                         "sequence split over C GPUs, ring attention; --gpus is then T x C x P x "
                         "data-parallel workers, ZeRO shards over d x C (default 1)")
    ws.add_argument("--partition-activations", action="store_true", default=None,
                    help="ZeRO-R P_a (DeepSpeed partition_activations): split each activation "
                         "checkpoint over the tensor-parallel GPUs (needs --recompute full)")
    ws.add_argument("--cpu-checkpointing", action="store_true", default=None,
                    help="ZeRO-R P_a+cpu (DeepSpeed cpu_checkpointing): keep activation "
                         "checkpoints in host memory (needs --recompute full)")


def add_memory_arguments(group) -> None:
    """The trainer's memory flags (zerolib.core.memory.conventions), estimate's and plan's."""
    group.add_argument("--recompute-method", choices=RECOMPUTE_METHODS,
                       help="full recomputation's method (Megatron-LM): uniform chunks of "
                            "--recompute-layers layers, or block (the first N layers of a stage)")
    group.add_argument("--recompute-layers", metavar="N",
                       help="Megatron-LM's --recompute-num-layers (default 1; needs --recompute full)")
    group.add_argument("--loss", choices=LOSSES,
                       help="the loss implementation (default: the engine's; zerolib.core.memory.loss)")
    group.add_argument("--loss-chunks", metavar="K", help="the chunked loss's chunks (default 8)")
    group.add_argument("--norms", choices=NORMS,
                       help="fused norm kernels (default) or eager Python RMSNorm (fp32 copies kept)")
    group.add_argument("--fp8", action="store_true", default=None,
                       help="Float8 training of the Linear layers (torchao Float8Linear)")
    group.add_argument("--fp8-all-gather", action="store_true", default=None,
                       help="FSDP2 all-gathers the Float8 weights in fp8 (needs --fp8, engine torchtitan)")
    group.add_argument("--compile", action="store_true", default=None,
                       help="torch.compile: fused norms, and the loss compiled where the engine "
                            "compiles it (torchtitan)")
    group.add_argument("--reshard-after-forward", choices=("true", "false"),
                       help="FSDP2's fully_shard setting (engines fsdp2, torchtitan; default: "
                            "fsdp2 true, torchtitan true except under a pipeline); false keeps "
                            "each GPU's parameters unsharded from the forward to the backward")
    group.add_argument("--reserved-ppm", metavar="PPM",
                       help="the caching allocator's reserve over the allocated peak, parts per "
                            "million (default 108403: the median of published pairs)")


def add_capacity_factor(group) -> None:
    group.add_argument("--capacity-factor", metavar="C",
                       help="a mixture of experts' capacity factor, 1 to 64: each of the E experts "
                            "holds ceil(C x k x tokens / E) token slots (default: dropless routing, "
                            "each expert holds exactly the tokens routed to it)")


def capacity_factor_from(args, config) -> float | None:
    """The ``--capacity-factor`` of a model with experts (None when not given); given for a
    dense model it would change nothing, and is refused."""
    text = getattr(args, "capacity_factor", None)
    if text is None:
        return None
    if not config.experts:
        raise ValueError(f"--capacity-factor needs a model with experts ({config.name} is dense: "
                         f"it changes nothing)")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1 <= value <= 64:    # NaN fails too
        raise ValueError(f"--capacity-factor must be a number from 1 to 64, like 1.25, got {text!r}")
    return value


def requested(args) -> bool:
    return any(getattr(args, name, None) is not None for name in ("model", "config", "megatron_args")) or any(
        getattr(args, dest, None) is not None for dest in OPTIONS)


def fields_from(args, config) -> dict:
    """The run's fields the working-set flags give for ``config`` (the resolved ``--model``):
    flat names of :data:`zerolib.core.run.FIELDS`, only those given."""
    changes = {}
    if args.seq is not None:
        changes["seq_len"] = parse_whole(args.seq, "--seq", maximum=MAX_SEQ_LEN)
    if args.micro_batch is not None:
        changes["micro_batch"] = parse_whole(args.micro_batch, "--micro-batch", maximum=MAX_MICRO_BATCH)
    if args.recompute is not None:
        changes["recompute"] = args.recompute
    if args.flash is not None:
        changes["flash_attention"] = args.flash
    if args.tensor_parallel is not None:
        changes["tensor_parallel"] = parse_whole(args.tensor_parallel, "--tensor-parallel",
                                                 maximum=MAX_GPUS)
    if args.sequence_parallel:
        changes["sequence_parallel"] = True
    if args.pipeline_parallel is not None:
        changes["pipeline_parallel"] = parse_whole(args.pipeline_parallel, "--pipeline-parallel",
                                                   maximum=MAX_GPUS)
    if args.pipeline_schedule is not None:
        changes["pipeline_schedule"] = args.pipeline_schedule
    if args.pipeline_chunks is not None:
        changes["pipeline_chunks"] = parse_whole(args.pipeline_chunks, "--pipeline-chunks",
                                                 maximum=MAX_CHUNKS)
    if getattr(args, "pipeline_layers", None) is not None:
        changes["pipeline_layers"] = parse_first_last(args.pipeline_layers)
    if args.micro_batches is not None:
        changes["micro_batches"] = parse_whole(args.micro_batches, "--micro-batches",
                                               maximum=MAX_MICRO_BATCHES)
    if args.reserve is not None:
        changes["reserve_bytes"] = parse_size(args.reserve, "--reserve", maximum=MAX_BYTES)
    for dest in ("reduce_bucket_size", "prefetch_bucket_size", "max_live_parameters"):
        if getattr(args, dest) is not None:
            changes[dest] = parse_whole(getattr(args, dest), OPTIONS[dest], minimum=0,
                                        maximum=MAX_ELEMENTS)
    if args.overlap_comm:
        changes["overlap_comm"] = True
    if args.ddp_bucket_view:
        changes["ddp_gradient_as_bucket_view"] = True
    capacity_factor = capacity_factor_from(args, config)
    if capacity_factor is not None:
        changes["capacity_factor"] = capacity_factor
    if args.context_parallel is not None:
        changes["context_parallel"] = parse_whole(args.context_parallel, "--context-parallel",
                                                  maximum=MAX_CONTEXT_PARALLEL)
    for dest in ("partition_activations", "cpu_checkpointing"):
        if getattr(args, dest):
            if changes.get("recompute", "none") != "full":
                raise ValueError(f"{OPTIONS[dest]} needs --recompute full (it acts on activation "
                                 f"checkpoints, which only full recomputation keeps)")
            changes[dest] = True
    changes.update(memory_fields_from(args))
    if changes.get("context_parallel", 1) > 1 and not changes.get("flash_attention", True):
        raise ValueError("--context-parallel above 1 needs flash attention (ring attention runs on "
                         "fused kernels): drop --no-flash")
    return changes


def parse_first_last(text: str, flag: str = "--pipeline-layers") -> tuple[int, int]:
    """FIRST,LAST: two whole numbers of layers, each 1 or more."""
    from zerolib.core.memory.pipeline_stages import MAX_LAYERS
    parts = str(text).split(",") if len(str(text)) <= 40 else []
    if len(parts) != 2:
        raise ValueError(f"{flag} must be FIRST,LAST (two whole numbers of layers, like 7,7), "
                         f"got {text!r:.60}")
    return tuple(parse_whole(part.strip(), flag, minimum=1, maximum=MAX_LAYERS) for part in parts)


def memory_fields_from(args) -> dict:
    """The trainer's memory fields the flags give (zerolib.core.memory.conventions)."""
    changes = {name: getattr(args, name) for name in ("recompute_method", "loss", "norms")
               if getattr(args, name) is not None}
    changes.update({name: True for name in ("fp8", "fp8_all_gather", "compile")
                    if getattr(args, name)})
    if getattr(args, "reshard_after_forward", None) is not None:
        changes["reshard_after_forward"] = args.reshard_after_forward == "true"
    for name, high in (("recompute_layers", MAX_RECOMPUTE_LAYERS), ("loss_chunks", MAX_LOSS_CHUNKS),
                       ("reserved_ppm", 1_000_000)):
        if getattr(args, name) is not None:
            changes[name] = parse_whole(getattr(args, name), OPTIONS[name],
                                        minimum=0 if name == "reserved_ppm" else 1, maximum=high)
    return changes


# Flags whose setting only some ZeRO stages read (dest -> those stages): given with none of
# them shown, they would change nothing (term_arrays in zerolib.core.memory.working_set).
STAGE_FLAGS = {"ddp_bucket_view": (0,), "overlap_comm": (1, 2), "reduce_bucket_size": (1, 2, 3),
               "prefetch_bucket_size": (3,), "max_live_parameters": (3,)}
PIPELINE_FLAGS = ("pipeline_schedule", "pipeline_chunks", "pipeline_layers", "micro_batches")


def refuse_no_effect(args, settings: WorkingSetSettings, stages) -> None:
    """A flag that would change nothing is refused in one line, not silently accepted."""
    if settings.pipeline_parallel == 1:
        given = [OPTIONS[dest] for dest in PIPELINE_FLAGS if getattr(args, dest, None) is not None]
        if given:
            verb = "needs" if len(given) == 1 else "need"
            raise ValueError(f"{', '.join(given)} {verb} --pipeline-parallel of 2 or more (without "
                             "a pipeline it changes nothing)")
    if settings.partition_activations and (settings.tensor_parallel == 1 or settings.sequence_parallel):
        raise ValueError("--partition-activations needs --tensor-parallel of 2 or more without "
                         "--sequence-parallel (otherwise each checkpoint is split already, or "
                         "there is no group to split it over: it changes nothing)")
    if settings.sequence_parallel and settings.tensor_parallel == 1:
        raise ValueError("--sequence-parallel needs --tensor-parallel of 2 or more (without tensor "
                         "parallelism there is nothing to split along the sequence)")
    for dest, read_by in STAGE_FLAGS.items():
        if getattr(args, dest) is not None and not set(read_by) & set(stages):
            which = ", ".join(map(str, read_by[:-1])) + (" or " if len(read_by) > 1 else "") + str(
                read_by[-1])
            raise ValueError(f"{OPTIONS[dest]} changes only ZeRO stage {which}, and none of "
                             f"those is shown (stage {', '.join(map(str, stages))})")


def default_stages(settings: WorkingSetSettings, chosen_by_default: bool, stages):
    """Without ``--stage`` and with a pipeline, only the ZeRO stages that run under one (the
    planner's rule); the others, asked for by name, are refused by that rule."""
    if not chosen_by_default or settings.pipeline_parallel == 1:
        return stages
    from zerolib.core.memory.model_parallel import PIPELINE_STAGES
    return tuple(stage for stage in stages if stage in PIPELINE_STAGES) or stages


def without_model(args) -> None:
    """Working-set flags need an architecture: a bare --params count has none."""
    given = [flag for dest, flag in OPTIONS.items() if getattr(args, dest, None) is not None]
    if given:
        verb = "needs" if len(given) == 1 else "need"
        raise ValueError(f"{', '.join(given)} {verb} --model (a bare --params count has no "
                         f"architecture); see 'zerolib models' for the presets")


# A bare parameter count has no architecture: its answer is model state only. What it leaves
# out (the working set's terms, as a --model answer names them) and what adds them.
PEAK_FLAGS = "--model NAME or --config FILE"


def left_out() -> dict:
    """The keys a model-state-only answer adds to its JSON: ``leaves_out`` (the working-set
    terms it does not count, the keys of a ``--model`` row's ``working_set``) and
    ``working_set_needs`` (the flags whose answer counts them and judges the peak)."""
    return {"leaves_out": list(TERMS), "working_set_needs": PEAK_FLAGS}


def left_out_line(result: dict) -> str:
    """The table's line saying what a model-state-only answer leaves out and what adds it."""
    terms = ", ".join(LABELS[t] for t in result["leaves_out"])
    if result.get("device"):
        return (f"Model state only: 'model state fits' leaves out the working set ({terms}), "
                f"which comes on top and sets the peak per GPU; zerolib estimate {PEAK_FLAGS} "
                f"(a preset from 'zerolib models', or a config.json) adds it and judges the peak.")
    return (f"Model state only: the working set ({terms}) is left out; it comes on top and sets "
            f"the peak per GPU; zerolib estimate {PEAK_FLAGS} (a preset from 'zerolib models', "
            f"or a config.json) adds it.")


def left_out_csv(result: dict) -> tuple[list[str], list]:
    """The CSV's columns for what a model-state-only answer leaves out (the same per row)."""
    return (["fits_judges", "leaves_out", "working_set_needs"],
            [result.get("fits_judges", ""), " ".join(result["leaves_out"]), result["working_set_needs"]])


def has_working_set(result: dict) -> bool:
    return bool(result["stages"]) and "peak" in result["stages"][0]


def table_columns(result: dict, unit: str) -> tuple[list[str], list[list[str]]]:
    """Extra table headers and cells per stage row: the non-zero terms, then the peak."""
    from zerolib.core.memory.trainer_peak import FSDP_TERMS
    terms = [t for t in (*TERMS, *FSDP_TERMS)
             if any(row["working_set"].get(t) for row in result["stages"])]
    headers = [f"{LABELS[t]} [{unit}]" for t in terms] + [f"peak [{unit}]",
                                                          f"peak reserved [{unit}]"]
    cells = [[f"{to_unit(row['working_set'][t], unit):,.2f}" for t in terms]
             + [f"{to_unit(row['peak'], unit):,.2f}", f"{to_unit(row['peak_reserved'], unit):,.2f}"]
             for row in result["stages"]]
    return headers, cells


def describe(result: dict) -> str:
    s = result["working_set_settings"]
    parts = [f"model {result['model']}", f"sequence {s['seq_len']:,}", f"micro-batch {s['micro_batch']}",
             f"recompute {s['recompute']}", "flash attention" if s["flash_attention"] else "no flash attention"]
    if s["tensor_parallel"] > 1:
        sequence = " + sequence parallel" if s["sequence_parallel"] else ""
        parts.append(f"tensor parallel {s['tensor_parallel']}{sequence}")
    if s["capacity_factor"] is not None:
        parts.append(f"capacity factor {s['capacity_factor']:g}")
    if s["context_parallel"] > 1:
        cp = result["context_parallel"]
        parts.append(f"context parallel {s['context_parallel']} ({cp['tokens_per_sequence_per_gpu']:,} "
                     f"tokens of each sequence per GPU, ZeRO over {cp['zero_group']:,} GPUs)")
    if s["partition_activations"] or s["cpu_checkpointing"]:
        what = [name for name, on in (("partitioned", s["partition_activations"]),
                                      ("on the CPU", s["cpu_checkpointing"])) if on]
        parts.append(f"ZeRO-R activation checkpoints {' and '.join(what)}")
    if s["pipeline_parallel"] > 1:
        chunks = f", {s['pipeline_chunks']} chunks per stage" if s["pipeline_chunks"] > 1 else ""
        if s.get("pipeline_layers") is not None:
            chunks += (f", first and last stages {s['pipeline_layers'][0]} and "
                       f"{s['pipeline_layers'][1]} layers")
        flight = "" if s["micro_batches"] is None else f", {s['micro_batches']} micro-batches per step"
        stages = sorted({row["pipeline_stage"] for row in result["stages"]})
        parts.append(f"pipeline parallel {s['pipeline_parallel']} ({s['pipeline_schedule']}{chunks}"
                     f"{flight}; most loaded: stage {', '.join(map(str, stages))}; ZeRO stages "
                     f"2 and 3 do not run with it)")
    judges = {row.get("fits_judges", "peak") for row in result["stages"]}
    judged = "the reserved peak" if judges == {"peak_reserved"} else "the peak"
    return ("Working set: " + ", ".join(parts) + f"; fits is judged on {judged} (both include the "
            f"reserve outside PyTorch's allocator).")


def csv_columns(result: dict) -> tuple[list[str], list[list]]:
    headers = [*TERMS, "peak"]
    return headers, [[*(row["working_set"][t] for t in TERMS), row["peak"]] for row in result["stages"]]
