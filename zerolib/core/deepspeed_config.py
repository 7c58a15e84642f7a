"""DeepSpeed's own ``ds_config.json`` read as a :class:`~zerolib.core.run.Run` (engine deepspeed).

:func:`run_from_deepspeed_config` takes the config (a path or a dict) and the model, and returns
the run it describes. Each key read is one row of :data:`KEYS`: the run field it sets, or what
zerolib does not model yet (refused in one line naming the file and the key). Names, defaults
and rules are DeepSpeed 0.19.8's (``deepspeed/runtime/zero/config.py``,
``deepspeed/runtime/zero/offload_config.py``, ``deepspeed/runtime/config.py``):

- ``zero_optimization``: ``stage`` (0 without the section); the buckets
  (``reduce_bucket_size``, ``allgather_bucket_size``, ``overlap_comm``: two reduce buckets in
  stages 1-2, read and left at stage 3, which keeps one; ``stage3_prefetch_bucket_size``,
  ``stage3_max_live_parameters``); ``contiguous_gradients``
  (true by default: the contiguous bucket zerolib counts); ``stage3_param_persistence_threshold``
  (parameters under it kept whole: zerolib leaves out those of up to its default, 1e5 elements,
  norms and biases); ``offload_optimizer.device`` and ``offload_param.device`` (none, cpu,
  nvme); ZeRO++ (``zero_hpz_partition_size``: a copy of the parameters inside each node,
  ``zero_quantized_weights``, ``zero_quantized_gradients``); MiCS (``mics_shard_size``: the
  state sharded over groups of that size); DeepSpeed's pydantic models refuse a key they do not
  know, and so does this reader;
- ``bf16.enabled`` / ``fp16.enabled`` (``bfloat16`` is DeepSpeed's older name): 16-bit
  activations; neither: fp32 training, the ``fp32-adam`` layout and 4-byte activations;
  ``data_types.grad_accum_dtype`` fp32 with bf16 at stage 1: ``BF16_Optimizer``
  (:data:`BF16_OPTIMIZER`, or ``bf16-fp32-grads`` under ``bf16.immediate_grad_update``);
- the batch: ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps`` and
  ``train_batch_size`` = micro-batch x accumulation x data-parallel GPUs (``runtime/config.py``,
  ``_set_batch_related_parameters``: any two give the third with the GPU count; all three give
  the GPU count);
- ``activation_checkpointing`` (``partition_activations``, ``cpu_checkpointing``): ZeRO-R's
  checkpoints of a model whose layers DeepSpeed's checkpointing recomputes (full recomputation).

``"auto"`` is Hugging Face Trainer's: it fills the value at launch from its own arguments
(``transformers/integrations/deepspeed.py``, ``trainer_config_process`` and
``trainer_config_finalize``: the batch from ``per_device_train_batch_size`` and
``gradient_accumulation_steps``, precision from ``--bf16``/``--fp16``, ``reduce_bucket_size``
as hidden^2, ``stage3_prefetch_bucket_size`` as int(0.9 hidden^2) and
``stage3_param_persistence_threshold`` as 10 hidden under stage 3). The buckets are filled
here as it fills them, from the model's hidden size; the rest from ``auto``, the run fields
the caller gives (the command line's flags), or refused in one line saying where the value
comes from.

Bounded as every reader: a regular file of at most :data:`MAX_DS_CONFIG_BYTES`, nesting and
value counts as a config.json's; every refusal is one line naming the file and the key.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from zerolib.core.catalogue.hf_config import check_config_shape, config_from_text
from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.inputs import MAX_GPUS, MAX_PARAMS, echo, read_small_file
from zerolib.core.memory.accounting import Layout

MAX_DS_CONFIG_BYTES = 1_000_000
WHAT = "a DeepSpeed config"
AUTO = "auto"
# DeepSpeed 0.19.8's default stage3_param_persistence_threshold: what zerolib leaves out
PERSISTENCE_DEFAULT = 100_000
# DeepSpeed's DtypeEnum spellings (deepspeed/runtime/config_utils.py) -> zerolib's name
DTYPES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
          "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
          "bf16": "bf16", "bfloat16": "bf16", "bfloat": "bf16", "torch.bfloat16": "bf16"}
# BF16_Optimizer (deepspeed/runtime/bf16_optimizer.py, DeepSpeed 0.19.8): bf16 parameters; a
# full-size fp32 gradient buffer (fp32_groups_gradients_flat, _setup_for_real_optimizer); the
# bf16 .grad kept beside it from the backward to the step (bf16.immediate_grad_update false,
# the default: update_hp_grads(clear_lp_grads=False), freed by zero_grad(set_to_none=True)
# after the step); fp32 master partition and Adam moments sharded at stage 1.
BF16_OPTIMIZER = Layout("deepspeed-bf16-optimizer", {
    "parameters": (("bf16 parameters", 2),),
    "gradients": (("bf16 gradients, backward to step", 2), ("fp32 gradient buffer", 4)),
    "optimizer": (("fp32 master parameters", 4), ("fp32 momentum", 4), ("fp32 variance", 4))},
    "DeepSpeed's BF16_Optimizer: bf16 gradients beside its fp32 buffer")


@dataclass(frozen=True)
class Key:
    """One key of a ds_config: the run field it sets (or None, with what is not modelled yet),
    how its value is read (``kind``: "whole", "flag", "device", "stage") and, for ``"auto"``,
    where Hugging Face Trainer takes it from."""

    field: str | None
    kind: str
    not_modelled: str = ""
    auto_from: str = ""


# "section.key" -> Key. Change a row when the run gains the field it names.
KEYS: Mapping[str, Key] = {
    "zero_optimization.stage": Key("stages", "stage"),
    "zero_optimization.reduce_bucket_size": Key("reduce_bucket_size", "whole", auto_from="the hidden size, hidden^2"),
    "zero_optimization.allgather_bucket_size": Key("allgather_bucket_size", "whole"),
    "zero_optimization.overlap_comm": Key("overlap_comm", "flag"),
    "zero_optimization.contiguous_gradients": Key("contiguous_gradients", "flag"),
    "zero_optimization.stage3_prefetch_bucket_size": Key("prefetch_bucket_size", "whole",
                                                         auto_from="the hidden size, int(0.9 hidden^2)"),
    "zero_optimization.stage3_max_live_parameters": Key("max_live_parameters", "whole"),
    "zero_optimization.stage3_param_persistence_threshold": Key("persistence_threshold", "whole",
                                                                auto_from="the hidden size, 10 hidden"),
    "zero_optimization.offload_optimizer.device": Key("offload_optimizer", "device"),
    "zero_optimization.offload_param.device": Key("offload_params", "device"),
    "zero_optimization.zero_hpz_partition_size": Key("hpz", "whole"),
    "zero_optimization.zero_quantized_weights": Key("qwz", "flag"),
    "zero_optimization.zero_quantized_gradients": Key("qgz", "flag"),
    "zero_optimization.mics_shard_size": Key("shard_group", "mics"),
    "bf16.enabled": Key("bf16", "flag", auto_from="--bf16"),
    "fp16.enabled": Key("fp16", "flag", auto_from="--fp16"),
    "bf16.immediate_grad_update": Key("immediate_grad_update", "flag"),
    "data_types.grad_accum_dtype": Key("grad_accum_dtype", "dtype"),
    "train_micro_batch_size_per_gpu": Key("micro_batch", "whole",
                                          auto_from="per_device_train_batch_size (--micro-batch)"),
    "gradient_accumulation_steps": Key("micro_batches", "whole",
                                       auto_from="gradient_accumulation_steps (--micro-batches)"),
    "train_batch_size": Key("global_batch", "whole", auto_from="GPUs x micro-batch x accumulation"),
    "activation_checkpointing.partition_activations": Key("partition_activations", "flag"),
    "activation_checkpointing.cpu_checkpointing": Key("cpu_checkpointing", "flag"),
    # read, and not modelled yet
    "zero_optimization.zero_quantized_nontrainable_weights": Key(None, "flag", "quantised frozen weights"),
    "zero_optimization.offload_optimizer.ratio": Key(None, "number", "a partial optimizer offload"),
    "zero_optimization.offload_param.buffer_count": Key(None, "whole", "the NVMe swap buffers"),
    "zero_optimization.offload_optimizer.buffer_count": Key(None, "whole", "the NVMe swap buffers"),
    "communication_data_type": Key(None, "text", "a communication dtype of its own"),
    "tensor_parallel.autotp_size": Key(None, "whole", "DeepSpeed's automatic tensor parallelism"),
    "sequence_parallel_size": Key(None, "whole", "DeepSpeed-Ulysses sequence parallelism"),
    "pipeline.stages": Key(None, "whole", "DeepSpeed's pipeline engine"),
    "amp.enabled": Key(None, "flag", "NVIDIA Apex AMP"),
}
# zero_optimization keys that size no memory zerolib counts (DeepSpeedZeroConfig's fields).
ZERO_NO_MEMORY = frozenset("""
    allgather_partitions reduce_scatter round_robin_gradients sub_group_size elastic_checkpoint
    load_from_fp32_weights ignore_unused_parameters legacy_stage1 stage3_max_reuse_distance
    stage3_gather_16bit_weights_on_model_save stage3_gather_fp16_weights_on_model_save
    memory_efficient_linear pipeline_loading_checkpoint override_module_apply
    use_multi_rank_bucket_allreduce mics_hierarchical_params_gather log_trace_cache_warnings
    stage3_module_granularity_threshold use_all_reduce_for_fetch_params zeropp_loco_param
    zero_hpz_partition_size offload_optimizer offload_param
""".split())
OFFLOAD_NO_MEMORY = frozenset("nvme_path pin_memory pipeline_read pipeline_write fast_init "
                              "buffer_size max_in_cpu".split())
ACTIVATION_NO_MEMORY = frozenset("contiguous_memory_optimization number_checkpoints "
                                 "synchronize_checkpoint_boundary profile".split())
_SECTIONS = {"zero_optimization", "bf16", "bfloat16", "fp16", "activation_checkpointing",
             "data_types", "tensor_parallel", "pipeline", "amp"}


@dataclass(frozen=True)
class DeepSpeedConfig:
    """A ds_config read: run ``fields`` (flat names of :data:`zerolib.core.run.FIELDS`), the keys
    read with the field each went to (``carried``), the ``"auto"`` keys left to the caller
    (``auto``: (key, run field, one line saying where Hugging Face Trainer takes it from)), what
    is not modelled yet (one line each) and ``where`` (the file)."""

    fields: Mapping
    carried: tuple[tuple[str, str], ...]
    auto: tuple[tuple[str, str, str], ...]
    not_modelled: tuple[str, ...]
    where: str


def _load(source) -> tuple[dict, str]:
    if isinstance(source, Mapping):
        data = dict(source)
        check_config_shape(data, "ds_config", WHAT)
        return data, "ds_config"
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"ds_config must be a path to a DeepSpeed config or a dict, got {type(source).__name__}")
    path = Path(source).expanduser()
    text = read_small_file(path, WHAT, MAX_DS_CONFIG_BYTES)
    return config_from_text(text, str(path), WHAT), str(path)


def _flatten(data: Mapping, where: str) -> dict:
    """``section.key`` -> value for the sections read; a key DeepSpeed does not know refused."""
    flat: dict = {}
    for section, value in data.items():
        if section not in _SECTIONS:
            if f"{section}" in KEYS:
                flat[section] = value
            continue   # optimizer, scheduler, logging...: no memory zerolib counts
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: {section} must be a JSON object, got {echo(value)}")
        name = "bf16" if section == "bfloat16" else section
        if name == "bf16" and "bf16" in data and "bfloat16" in data:
            raise ValueError(f"{where}: bf16 and bfloat16 are one section (bfloat16 its older name): give one")
        for key, inner in value.items():
            full = f"{name}.{key}"
            # a key as the file wrote it, on one line (echoed where it is no name)
            shown = full if str(key).isidentifier() else f"{name}.{echo(key)}"
            if name == "zero_optimization" and key in ("offload_optimizer", "offload_param"):
                if inner is None:
                    continue
                if not isinstance(inner, Mapping):
                    raise ValueError(f"{where}: {shown} must be a JSON object, got {echo(inner)}")
                for sub, leaf in inner.items():
                    if f"{full}.{sub}" in KEYS:
                        flat[f"{full}.{sub}"] = leaf
                    elif sub not in OFFLOAD_NO_MEMORY:
                        sub = sub if str(sub).isidentifier() else echo(sub)
                        raise ValueError(f"{where}: {shown}.{sub} is not a field of DeepSpeed's "
                                         f"offload config")
                continue
            if full in KEYS:
                flat[full] = inner
            elif name == "zero_optimization" and key == "cpu_offload":
                raise ValueError(f"{where}: {shown} is deprecated in DeepSpeed: use "
                                 f"zero_optimization.offload_optimizer.device")
            elif name == "zero_optimization" and key not in ZERO_NO_MEMORY:
                raise ValueError(f"{where}: {shown} is not a field of DeepSpeed's zero_optimization "
                                 f"(DeepSpeed refuses keys it does not know)")
            elif name == "activation_checkpointing" and key not in ACTIVATION_NO_MEMORY:
                raise ValueError(f"{where}: {shown} is not a field of DeepSpeed's activation_checkpointing")
    return flat


def _value(key: str, spec: Key, value, where: str):
    said = f"{where}: {key}"
    if spec.kind in ("flag",):
        if not isinstance(value, bool):
            raise ValueError(f"{said} must be true or false, got {echo(value)}")
        return value
    if spec.kind == "device":
        if value is None:
            return "none"
        if not isinstance(value, str) or value.strip().lower() not in ("none", "cpu", "nvme"):
            raise ValueError(f"{said} must be none, cpu or nvme, got {echo(value)}")
        return value.strip().lower()
    if spec.kind == "text":
        return value
    if spec.kind == "dtype":   # DeepSpeed's DtypeEnum (runtime/config_utils.py) names
        name = DTYPES.get(value.strip().lower()) if isinstance(value, str) else None
        if name is None:
            raise ValueError(f"{said} must be fp32, fp16 or bf16, got {echo(value)}")
        return name
    if spec.kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{said} must be a number, got {echo(value)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise ValueError(f"{said} must be a whole number, got {echo(value)}")
    number = int(value)
    if spec.kind == "stage":
        if number not in (0, 1, 2, 3):
            raise ValueError(f"{said} must be a ZeRO stage from 0 to 3, got {echo(value)}")
        return number
    if spec.kind == "mics":
        if number == -1 or number == 0:   # DeepSpeed's default -1: no MiCS
            return None
    low = 0 if spec.field in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size",
                              "max_live_parameters", "persistence_threshold") else 1
    if not low <= number <= MAX_PARAMS:
        raise ValueError(f"{said} must be a whole number from {low} to {MAX_PARAMS:.0e}, got {echo(value)}")
    return number


def read_deepspeed_config(source, model=None) -> DeepSpeedConfig:
    """A ds_config read (see the module doc): its run fields, what it carried, what is
    ``"auto"`` and what is not modelled yet; ``model`` (a TransformerConfig) fills the buckets
    Hugging Face Trainer fills from the hidden size."""
    data, where = _load(source)
    flat = _flatten(data, where)
    fields: dict = {"engine": "deepspeed"}
    carried: list[tuple[str, str]] = []
    auto: list[tuple[str, str, str]] = []
    later: list[str] = []
    read: dict = {}
    stage = flat.get("zero_optimization.stage", 0)
    for key, value in flat.items():
        spec = KEYS[key]
        if value == AUTO:
            filled = _hidden_based(key, model, stage)
            if filled is not None:
                read[spec.field] = filled
                carried.append((key, spec.field))
                continue
            if spec.field is None or not spec.auto_from:
                raise ValueError(f"{where}: {key} is \"auto\", which Hugging Face Trainer does not "
                                 f"fill; give its value")
            auto.append((key, spec.field, f"{where}: {key} is \"auto\": Hugging Face Trainer fills "
                                          f"it at launch from {spec.auto_from}; give the value here "
                                          f"or beside the file"))
            continue
        number = _value(key, spec, value, where)
        if spec.field is None:
            if value not in (None, False, 0, "none"):
                later.append(f"{where}: {key} {echo(value)}: {spec.not_modelled} is not modelled yet")
            continue
        read[spec.field] = number
        carried.append((key, spec.field))
    _zero(read, fields, later, where)
    _precision(read, fields, auto, where)
    for name in ("micro_batch", "micro_batches", "global_batch"):
        if name in read:
            fields[name] = read[name]
    if read.get("partition_activations") or read.get("cpu_checkpointing"):
        fields.update(recompute="full", partition_activations=read.get("partition_activations", False),
                      cpu_checkpointing=read.get("cpu_checkpointing", False))
    return DeepSpeedConfig(fields, tuple(carried), tuple(auto), tuple(later), where)


def _hidden_based(key: str, model, stage: int) -> int | None:
    """The bucket Hugging Face Trainer fills from the hidden size (trainer_config_finalize)."""
    if not isinstance(model, TransformerConfig):
        return None
    h = model.hidden
    if key == "zero_optimization.reduce_bucket_size":
        return h * h
    if stage == 3 and key == "zero_optimization.stage3_prefetch_bucket_size":
        return int(0.9 * h * h)
    if stage == 3 and key == "zero_optimization.stage3_param_persistence_threshold":
        return 10 * h
    return None


def _zero(read: dict, fields: dict, later: list, where: str) -> None:
    stage = read.get("stages", 0)
    fields["stages"] = (stage,)
    for name in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size",
                 "max_live_parameters", "offload_optimizer", "offload_params", "qwz", "qgz"):
        if name in read:
            fields[name] = read[name]
    if "overlap_comm" in read and stage in (1, 2):   # stage 3 keeps one bucket either way
        fields["overlap_comm"] = read["overlap_comm"]
    if read.get("contiguous_gradients") is False:
        later.append(f"{where}: zero_optimization.contiguous_gradients false: gradients reduced "
                     f"without the contiguous bucket is not modelled yet")
    if read.get("persistence_threshold", 0) > PERSISTENCE_DEFAULT:
        later.append(f"{where}: zero_optimization.stage3_param_persistence_threshold "
                     f"{read['persistence_threshold']:,}: parameters kept whole above DeepSpeed's "
                     f"default of {PERSISTENCE_DEFAULT:,} elements is not modelled yet")
    hpz = read.get("hpz", 1)
    if hpz > 1:
        fields["hpz"] = True   # zerolib's hpZ copy spans a node (checked against the cluster's)
        fields["hpz_size"] = hpz
    if read.get("shard_group") is not None:
        fields["shard_group"] = read["shard_group"]


def _precision(read: dict, fields: dict, auto: list, where: str) -> None:
    pending = {field for _, field, _ in auto}
    if read.get("bf16") and read.get("fp16"):
        raise ValueError(f"{where}: bf16.enabled and fp16.enabled: give one")
    if read.get("bf16") or read.get("fp16"):
        fields["element_bytes"] = 2
    elif not pending & {"bf16", "fp16"}:   # fp32 training: fp32 weights, gradients and Adam
        fields.update(element_bytes=4, layout="fp32-adam")
    _optimizer_wrapper(read, fields, pending, where)


def _optimizer_wrapper(read: dict, fields: dict, pending: set, where: str) -> None:
    """The optimizer DeepSpeed 0.19.8 wraps by model and gradient-accumulation dtype
    (engine.py ``_do_optimizer_sanity_check``; ``get_data_types``: the accumulation dtype is
    the model's unless ``data_types.grad_accum_dtype`` says): one dtype, the chapter's layouts
    (stage 0: FP16_UnfusedOptimizer; ZeRO's optimizers above); bf16 with fp32 accumulation at
    stage 1 without offload, ``BF16_Optimizer`` (:data:`BF16_OPTIMIZER`)."""
    accum = read.get("grad_accum_dtype")
    if accum is None:
        return
    said = f"{where}: data_types.grad_accum_dtype {accum}"
    if pending & {"bf16", "fp16"}:
        raise ValueError(f"{said} with a precision left \"auto\" is not modelled yet: give "
                         f"bf16.enabled or fp16.enabled")
    model = "bf16" if read.get("bf16") else "fp16" if read.get("fp16") else "fp32"
    if accum == model:
        return
    stage = read.get("stages", 0)
    if stage == 0:   # DeepSpeed raises NotImplementedError("unsupported mix of ...")
        raise ValueError(f"{said}: DeepSpeed refuses {model} parameters with {accum} gradient "
                         f"accumulation without ZeRO (engine.py _do_optimizer_sanity_check)")
    if (model, accum, stage, read.get("offload_optimizer", "none")) == ("bf16", "fp32", 1, "none"):
        immediate = read.get("immediate_grad_update", False)
        # no ZeRO reduce bucket: the engine all-reduces the fp32 buffer itself
        # (buffered_allreduce_fallback over get_grads_for_reduction)
        fields.update(layout="bf16-fp32-grads" if immediate else BF16_OPTIMIZER,
                      reduce_bucket_size=0)
        return
    raise ValueError(f"{said} with {model} at ZeRO stage {stage}: ZeRO's optimizer with a "
                     f"gradient accumulation dtype of its own is not modelled yet")


def run_from_deepspeed_config(source, model, *, gpus: int | None = None, auto: Mapping | None = None):
    """The :class:`~zerolib.core.run.Run` a DeepSpeed config describes for ``model`` (a preset's
    name, a TransformerConfig or a parameter count) on ``gpus`` GPUs (None: what
    ``train_batch_size`` / (micro-batch x accumulation) gives, else 8); ``auto`` gives the run
    fields of the config's ``"auto"`` keys (``{"micro_batch": 4}``; for ``bf16.enabled`` /
    ``fp16.enabled``, ``{"element_bytes": 2}``). A ``ValueError`` of one line naming the file
    and the key for what cannot be read, is not modelled yet, or is "auto" and not given."""
    from zerolib.core.run import Run

    if isinstance(model, str):
        from zerolib.core.catalogue.models import get_model
        model = get_model(model)
    read = read_deepspeed_config(source, model if isinstance(model, TransformerConfig) else None)
    if read.not_modelled:
        raise ValueError(read.not_modelled[0])
    fields = dict(read.fields)
    given = dict(auto or {})
    for _key, field, line in read.auto:
        if field in ("bf16", "fp16"):
            if "element_bytes" not in given:
                raise ValueError(line + " (auto: element_bytes)")
        elif field not in given and field != "global_batch":
            raise ValueError(line)
    fields.update(given)
    if any(field == "global_batch" for _, field, _ in read.auto) and gpus is not None \
            and fields.get("micro_batch") and fields.get("micro_batches"):
        # Trainer's train_batch_size: GPUs x per-device batch x accumulation
        fields["global_batch"] = gpus * fields["micro_batch"] * fields["micro_batches"]
    gpus = batch_sizes(fields, gpus, read.where)
    hpz = fields.pop("hpz_size", None)
    if hpz is not None:
        on_node = fields.setdefault("gpus_per_node", hpz)
        if on_node != hpz:
            raise ValueError(f"{read.where}: zero_optimization.zero_hpz_partition_size {hpz}: a "
                             f"secondary partition other than a node's {on_node} GPUs is not "
                             f"modelled yet")
    return Run.of(model, gpus, **fields)


def batch_sizes(fields: dict, gpus: int | None, where: str) -> int | None:
    """DeepSpeed's batch rule, train_batch_size = micro-batch x accumulation x GPUs
    (``runtime/config.py``, ``_set_batch_related_parameters``): the missing one of the three
    filled in ``fields`` (the GPUs returned), or a ValueError naming the keys when they disagree."""
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int)
                             or not 1 <= gpus <= MAX_GPUS):
        raise ValueError(f"gpus must be a whole number from 1 to {MAX_GPUS:,}, got {echo(gpus)}")
    tb, mb, gas = (fields.get(name) for name in ("global_batch", "micro_batch", "micro_batches"))
    if tb is None:
        return gpus
    keys = "train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps"
    if gpus is None:
        if mb is None or gas is None or tb % (mb * gas):
            if mb is not None and gas is not None:
                raise ValueError(f"{where}: train_batch_size {tb} is not a multiple of "
                                 f"train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                                 f"({mb * gas})")
            return gpus
        return tb // (mb * gas)
    if mb is not None and gas is not None:
        if tb != mb * gas * gpus:
            raise ValueError(f"{where}: train_batch_size {tb} is not {mb} x {gas} x {gpus} GPUs "
                             f"({keys})")
    elif mb is not None or gas is not None:
        known = mb if mb is not None else gas
        if tb % (known * gpus):
            raise ValueError(f"{where}: train_batch_size {tb} is not a multiple of {known} x {gpus} "
                             f"GPUs ({keys})")
        fields["micro_batches" if mb is not None else "micro_batch"] = tb // (known * gpus)
    else:
        if tb % gpus:
            raise ValueError(f"{where}: train_batch_size {tb} is not a multiple of {gpus} GPUs")
        fields.update(micro_batch=tb // gpus, micro_batches=1)
    return gpus
