"""``--megatron-args LINE`` (a whole launch line) and ``--deepspeed ds_config.json`` on
``estimate`` and ``plan``: a trainer's own files read as a run (docs/trainer-files.md).

Like a ``--run`` file, what the file says stands in for the flags it matches, and a flag given
beside it wins. ``estimate`` answers for the run the file describes; ``plan`` keeps the file's
fixed settings (engine, ZeRO stage, recomputation, sequence/context/expert parallelism,
offload, ZeRO-R, precision, dropout, buckets, sequence and global batch) and searches the rest
(tensor and pipeline sizes, micro-batch).
"""
from __future__ import annotations

from zerolib.cli import _run_file as run_file_cli
from zerolib.cli._arguments import gpu_count
from zerolib.core.defaults import MAX_MICRO_BATCHES
from zerolib.core.parse import parse_whole
from zerolib.core.run import Run

DEEPSPEED_HELP = ("DeepSpeed's own config (ds_config.json): ZeRO stage, buckets, offload, ZeRO++, "
                  "precision, micro-batch and accumulation read as the run's settings; flags beside "
                  "it win (docs/trainer-files.md)")
# Run fields the commands have no flag for, carried from the file as they are.
UNFLAGGED = ("element_bytes", "dropout", "allgather_bucket_size", "global_batch", "layout")
# DeepSpeed's "auto" batch keys: (the dest, the flag) that gives each on the command line.
_AUTO_FLAGS = {"micro_batch": ("micro_batch", "--micro-batch"),
               "micro_batches": ("micro_batches", "--micro-batches")}


def add_arguments(parser) -> None:
    parser.add_argument("--deepspeed", metavar="FILE", help=DEEPSPEED_HELP)


def _gpus(args) -> int | None:
    return None if getattr(args, "gpus", None) is None else gpu_count(args.gpus, "--gpus")


def read(args, model=None) -> tuple[Run, dict] | None:
    """(the run the trainer's file describes, the run fields it set), or None without one;
    ``model`` the model the command line names (for ``--deepspeed``)."""
    launch, ds = getattr(args, "megatron_args", None), getattr(args, "deepspeed", None)
    if launch is None and ds is None:
        return None
    if launch is not None and ds is not None:
        raise ValueError("--megatron-args and --deepspeed describe two trainers: give one")
    if launch is not None:
        from zerolib.core.megatron_launch import read_launch, run_from_megatron_args
        gpus = _gpus(args)
        if gpus is None:
            raise ValueError("--megatron-args needs --gpus (a launch line does not say how many "
                             "GPUs it runs on)")
        return run_from_megatron_args(launch, gpus=gpus), dict(read_launch(launch).fields)
    from zerolib.core.deepspeed_config import read_deepspeed_config, run_from_deepspeed_config
    if model is None:
        raise ValueError("--deepspeed needs a model (--model, --config or --params): a DeepSpeed "
                         "config does not say which")
    config = read_deepspeed_config(ds, None if isinstance(model, int) else model)
    auto = {}
    for _, field, line in config.auto:   # "auto": the flag beside the file gives it, else one line
        if field == "global_batch":      # the product of the others
            continue
        flag = _AUTO_FLAGS.get(field)
        if flag is not None and getattr(args, flag[0], None) is not None:
            auto[field] = parse_whole(getattr(args, flag[0]), flag[1], maximum=MAX_MICRO_BATCHES)
        elif field == "micro_batches" and getattr(args, "link", None) is None:
            auto[field] = None   # accumulation times the step: without --link it changes nothing
        elif field in ("bf16", "fp16"):
            raise ValueError(f"{line}; write true or false for zerolib")
        else:
            raise ValueError(line)
    run = run_from_deepspeed_config(ds, model, gpus=_gpus(args), auto=auto)
    fields = {key: value for key, value in config.fields.items() if key != "hpz_size"}
    fields.update(auto, micro_batch=run.batch.micro_batch)
    if run.batch.micro_batches is not None:
        fields["micro_batches"] = run.batch.micro_batches
    if run.cluster.gpus_per_node is not None:
        fields["gpus_per_node"] = run.cluster.gpus_per_node
    return run, fields


def fill_estimate(args, model) -> dict:
    """The trainer's file's fields set on the flags not given (as a ``--run`` file's are); the
    fields no flag of ``estimate`` holds, returned to be added to the run."""
    found = read(args, model)
    if found is None:
        return {}
    run, fields = found
    extra = {name: fields[name] for name in UNFLAGGED if name in fields}
    if run.parallel.pipeline == 1 and getattr(args, "link", None) is None \
            and run.batch.micro_batches is not None:
        # gradient accumulation changes nothing estimate shows without a link: carried, not a flag
        extra["micro_batches"] = run.batch.micro_batches
        run = run.replace(micro_batches=None)
    run_file_cli.fill_args(args, run)
    return extra


# plan: a fixed run field -> (the search's field, the dest whose default means "not given", that default)
_SEARCHED = {"stages": ("stages", "stages", None), "recompute": ("recompute", "recompute", None),
             "sequence_parallel": ("sequence_parallel", "sequence_parallel", "both"),
             "context_parallel": ("context_parallel", "context_parallel", None),
             "expert_parallel": ("expert_parallel", "expert_parallel", None),
             "expert_tensor_parallel": ("expert_tensor_parallel", "expert_tensor_parallel", None)}
# plan: run fields the file fixes that no flag of plan holds
_PLAN_FIXED = ("element_bytes", "dropout", "layout", "reduce_bucket_size", "overlap_comm",
               "allgather_bucket_size", "prefetch_bucket_size", "max_live_parameters", "qwz", "qgz",
               "hpz", "shard_group", "gpus_per_node")
_OFFLOAD_OF = {("none", "none"): "none", ("cpu", "none"): "optimizer", ("cpu", "cpu"): "optimizer+parameters"}


def plan_fixed(args, model) -> dict:
    """For ``plan``: the flags the trainer's file gives (sequence, global batch, GPUs, engine)
    set where not given, and the plan's options the file fixes (returned; a flag given beside
    the file wins)."""
    found = read(args, model)
    if found is None:
        return {}
    run, fields = found
    for dest, value in (("seq", fields.get("seq_len")), ("global_batch", fields.get("global_batch")),
                        ("engine", fields.get("engine")), ("gpus", run.cluster.gpus if args.gpus is None
                                                           and "global_batch" in fields else None)):
        if value is not None and getattr(args, dest, None) is None:
            setattr(args, dest, str(value))
    fixed: dict = {}
    for name, (option, dest, default) in _SEARCHED.items():
        if name in fields and getattr(args, dest, default) == default:
            value = fields[name]
            fixed[option] = tuple(value) if isinstance(value, tuple) else (value,)
    if "pipeline_chunks" in fields and getattr(args, "chunks", None) in (None, "all"):
        fixed["chunks"] = (fields["pipeline_chunks"],)
    if "pipeline_layers" in fields and getattr(args, "pipeline_layers", None) is None:
        fixed["pipeline_layers"] = fields["pipeline_layers"]   # that split, wherever it divides
    offload = (fields.get("offload_optimizer", "none"), fields.get("offload_params", "none"))
    if offload != ("none", "none") or "offload_optimizer" in fields:
        if offload not in _OFFLOAD_OF:
            raise ValueError(f"--deepspeed: offload_optimizer {offload[0]} with offload_param "
                             f"{offload[1]}: plan searches offloads to CPU memory only (estimate "
                             f"answers for it)")
        if getattr(args, "offload", None) is None:
            fixed["offload"] = (_OFFLOAD_OF[offload],)
    if fields.get("partition_activations") and getattr(args, "partition_activations", None) is None:
        fixed["zero_r"] = ("partition+cpu" if fields.get("cpu_checkpointing") else "partition",)
    if "layout" in fields and (getattr(args, "layout", None) or getattr(args, "bytes", None)):
        fields = {k: v for k, v in fields.items() if k != "layout"}
    fixed.update({name: fields[name] for name in _PLAN_FIXED if name in fields})
    return fixed
