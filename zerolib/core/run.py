"""One description of a training run: the nouns an engineer already uses.

    Run(model, cluster, parallel, trainer, batch)

- ``model``: a :class:`~zerolib.core.catalogue.models.TransformerConfig` (a preset, a
  ``config.json``, Megatron-LM arguments) or a bare parameter count (model state only);
- :class:`Cluster`: the device, how many GPUs, the node and links they sit on, the host;
- :class:`Parallelism`: tensor (with sequence), pipeline (schedule, chunks), context, expert
  (and expert-tensor) parallelism, and the shard group ZeRO's state is spread over;
- :class:`Trainer`: the engine and its settings (ZeRO stages, layout of bytes per parameter,
  recomputation, precision of activations, buckets, offload, ZeRO++/ZeRO-R, overlap, utilisation);
- :class:`Batch`: sequence length, micro-batch, micro-batches per step, global batch, tokens.

Each noun is frozen and checked once when made: a bad field is a ``ValueError`` or ``TypeError``
naming it (``trainer.recompute must be one of ...``). Everything below the door
(:func:`zerolib.core.estimate.estimate`, :func:`zerolib.core.planner.plan`) trusts a Run.

Every field also has one flat name, unique across the nouns (:data:`FIELDS`): the keyword of
:meth:`Run.of` and :meth:`Run.replace`, and, with dashes, the command line's flag
(``tensor_parallel`` is ``--tensor-parallel`` and ``run.parallel.tensor``). A run file is the
same fields in TOML, one table per noun (:meth:`Run.to_toml`, :func:`from_toml`; ``docs/run-file.md``).
"""
from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING

from zerolib.core.catalogue.devices import CAPACITY_BASES, DEVICES, Device, device_at
from zerolib.core.catalogue.links import EFFICIENCY_NAMES, HOST_LINKS
from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.defaults import (
    ALLGATHER_BUCKET_SIZE,
    DEFAULT_ENGINE,
    DEFAULT_HOST_LINK,
    DEFAULT_MFU,
    DEFAULT_RESERVE,
    DEFAULT_SEQ,
    ENGINE_NAMES,
    MAX_CHUNKS,
    MAX_CONTEXT_PARALLEL,
    MAX_CPU_ADAM_RATE,
    MAX_ELEMENT_BYTES,
    MAX_MICRO_BATCH,
    MAX_MICRO_BATCHES,
    MAX_OVERSUBSCRIPTION,
    MAX_RUN_TOKENS,
    MAX_SEQ_LEN,
    MAX_TOKENS_PER_GPU,
    OFFLOAD_DEVICES,
    RECOMPUTE,
    REDUCE_BUCKET_SIZE,
    RESERVED_PPM,
    SCHEDULE_RULE,
    SCHEDULES,
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_PREFETCH_BUCKET_SIZE,
)
from zerolib.core.inputs import MAX_BYTES, MAX_ELEMENTS, MAX_GPUS, MAX_PARAMS, STAGES, check_mfu, echo
from zerolib.core.memory.accounting import LAYOUTS, Layout
from zerolib.core.memory.trainer_memory import TrainerMemory
from zerolib.core.toml_text import toml_table

if TYPE_CHECKING:
    from zerolib.core.memory.placement import Placement
    from zerolib.core.memory.working_set import WorkingSetSettings

# The working set's arithmetic is imported where a run asks for its settings: making a run (a
# bare count's, or a command's flags) imports only the bounds above.


class _Noun:
    """What the nouns share: checked fields, ``replace``, ``as_dict``."""

    noun = ""

    _defaults: Mapping = MappingProxyType({})   # each noun's own, set once it is defined

    def _is_default(self, name: str) -> bool:
        """The field holds its class's own default object: valid by construction, not checked
        again (a run made from a few fields checks those few)."""
        default = self._defaults.get(name, MISSING)
        return default is not MISSING and getattr(self, name) is default

    def _fail(self, name: str, allowed: str, value) -> None:
        raise ValueError(f"{self.noun}.{name} must be {allowed}, got {echo(value)}")

    def _whole(self, name: str, low: int, high: int, *, optional: bool = False) -> None:
        value = getattr(self, name)
        if (type(value) is int and low <= value <= high) or self._is_default(name):
            return
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise TypeError(f"{self.noun}.{name} must be a whole number from {low:,} to "
                                f"{high:,}{' or None' if optional else ''}, got {echo(value)}")
        if not low <= value <= high:
            self._fail(name, f"a whole number from {low:,} to {high:,}", value)
        object.__setattr__(self, name, int(value))

    def _flag(self, name: str, *, optional: bool = False) -> None:
        value = getattr(self, name)
        if value is True or value is False:
            return
        if optional and value is None:
            return
        if not isinstance(value, bool):
            raise TypeError(f"{self.noun}.{name} must be true or false, got {echo(value)}")

    def _choice(self, name: str, allowed: tuple, *, optional: bool = False) -> None:
        if self._is_default(name):
            return
        value = getattr(self, name)
        if optional and value is None:
            return
        if isinstance(value, str):
            value = value.strip().lower()
            object.__setattr__(self, name, value)
        if value not in allowed:
            self._fail(name, "one of " + ", ".join(map(str, allowed)), value)

    def _number(self, name: str, low: float, high: float, *, optional: bool = False,
                open_low: bool = False) -> None:
        value = getattr(self, name)
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise TypeError(f"{self.noun}.{name} must be a number, got {echo(value)}")
        if value < low or value > high or (open_low and value == low):
            self._fail(name, f"a number {'above' if open_low else 'from'} {low:g} "
                             f"{'and at most' if open_low else 'to'} {high:g}", value)
        object.__setattr__(self, name, float(value))

    def replace(self, **changes):
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value):
    """A field's value as TOML/JSON can hold it."""
    if isinstance(value, Device):
        return {f.name: getattr(value, f.name) for f in fields(value) if getattr(value, f.name) is not None}
    if isinstance(value, Layout):
        return value.name if LAYOUTS.get(value.name) is value else [
            sum(w for _, w in value.parts[c]) for c in ("parameters", "gradients", "optimizer")]
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, _Noun):
        return value.as_dict()
    return value


def _reading(name: str, basis: str):
    try:
        return device_at(name, basis)
    except ValueError:
        return None


@dataclass(frozen=True)
class Cluster(_Noun):
    """The hardware: ``gpus`` of ``device`` (a catalogue name or Device; None: fit is not judged), read at ``capacity``
    (nominal GiB, decimal GB or nvidia-smi's); ``link`` a node or link of the catalogues (None: not timed; the planner
    takes the device's usual node), ``gpus_per_node`` (None: the node's own) at ``link_efficiency``, ``leaf_nodes`` per
    rail leaf (None: all) behind a spine ``oversubscription``:1; the ``host`` whose CPUs and drives serve offloaded
    state, over ``host_link``, with ``host_memory`` bytes per node and a measured ``cpu_adam_rate`` (parameters/s)."""

    noun = "cluster"
    gpus: int = 8
    device: str | None = None
    capacity: str = "nominal"
    link: str | None = None
    gpus_per_node: int | None = None
    link_efficiency: str | float | None = None
    leaf_nodes: int | None = None
    oversubscription: float = 1.0
    host: str | None = None
    host_link: str = DEFAULT_HOST_LINK
    host_memory: int | None = None
    cpu_adam_rate: int | None = None

    def __post_init__(self):
        self._whole("gpus", 1, MAX_GPUS)
        if self.device is not None:
            self._device()
        self._choice("capacity", CAPACITY_BASES)
        if self.link is not None and (not isinstance(self.link, str) or not self.link.strip()):
            self._fail("link", "the name of a node or a link (zerolib estimate --help lists them)",
                       self.link)
        self._whole("gpus_per_node", 1, MAX_GPUS, optional=True)
        efficiency = self.link_efficiency
        if isinstance(efficiency, str):
            self._choice("link_efficiency", EFFICIENCY_NAMES)
        elif efficiency is not None:
            self._number("link_efficiency", 0.0, 1.0, open_low=True)
        self._whole("leaf_nodes", 1, MAX_GPUS, optional=True)
        self._number("oversubscription", 1.0, MAX_OVERSUBSCRIPTION)
        if self.host is not None and (not isinstance(self.host, str) or not self.host.strip()):
            self._fail("host", "the name of a host (dgx-a100, dgx-h100)", self.host)
        if not self._is_default("host_link"):
            if not isinstance(self.host_link, str) or self.host_link.strip().lower() not in HOST_LINKS:
                self._fail("host_link", f"a PCIe link ({', '.join(HOST_LINKS)})", self.host_link)
            object.__setattr__(self, "host_link", self.host_link.strip().lower())
        self._whole("host_memory", 0, MAX_BYTES, optional=True)
        self._whole("cpu_adam_rate", 1, MAX_CPU_ADAM_RATE, optional=True)

    def _device(self) -> None:
        if isinstance(self.device, Mapping):   # a device of one's own, from a run file
            object.__setattr__(self, "device", Device(**self.device))
        if isinstance(self.device, Device):   # a catalogue device, maybe read at another basis
            found = [basis for basis in CAPACITY_BASES if self.device.name in DEVICES
                     and _reading(self.device.name, basis) == self.device]
            if found:
                object.__setattr__(self, "device", self.device.name)
                object.__setattr__(self, "capacity", found[0])
        if not isinstance(self.device, Device):   # (one of one's own stays a Device)
            self._choice("device", tuple(DEVICES), optional=True)


@dataclass(frozen=True)
class Parallelism(_Noun):
    """How the GPUs split the work: ``tensor`` (Megatron-LM's tensor parallelism, with
    ``sequence`` parallelism), ``pipeline`` stages run by ``schedule`` ("1f1b" or "interleaved"
    with ``chunks`` model chunks per stage), ``context`` parallelism (ring attention), ``expert``
    parallelism E and ``expert_tensor`` parallelism (None: ``tensor``); the rest is data
    parallelism, whose ZeRO state is sharded over ``shard_group`` GPUs (None: all of them; HSDP,
    MiCS), with ZeRO++'s ``hpz`` copy inside each node; ``pipeline_layers`` (FIRST, LAST): uneven
    stages (:mod:`zerolib.core.memory.pipeline_stages`; None: even)."""

    noun = "parallel"
    tensor: int = 1
    sequence: bool = False
    pipeline: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    context: int = 1
    expert: int = 1
    expert_tensor: int | None = None
    shard_group: int | None = None
    hpz: bool = False
    pipeline_layers: tuple[int, int] | None = None

    def __post_init__(self):
        self._whole("tensor", 1, MAX_GPUS)
        self._flag("sequence")
        self._whole("pipeline", 1, MAX_GPUS)
        self._choice("schedule", SCHEDULES)
        self._whole("chunks", 1, MAX_CHUNKS)
        self._whole("context", 1, MAX_CONTEXT_PARALLEL)
        self._whole("expert", 1, MAX_GPUS)
        self._whole("expert_tensor", 1, MAX_GPUS, optional=True)
        self._whole("shard_group", 1, MAX_GPUS, optional=True)
        self._flag("hpz")
        if self.sequence and self.tensor == 1:
            raise ValueError("parallel.sequence needs parallel.tensor of 2 or more (without tensor "
                             "parallelism there is nothing to split along the sequence)")
        if (self.schedule == "interleaved") != (self.chunks > 1):   # the planner's rule, in its words
            raise ValueError(f"parallel.schedule and parallel.chunks: {SCHEDULE_RULE}, got "
                             f"{self.schedule} with chunks = {self.chunks}")
        if self.pipeline_layers is not None:
            from zerolib.core.memory.pipeline_stages import door_split
            object.__setattr__(self, "pipeline_layers", door_split(self.pipeline_layers, self.pipeline))

    @property
    def model_parallel(self) -> int:
        """GPUs one model replica's shard spans besides data parallelism: t x C x p."""
        return self.tensor * self.context * self.pipeline


@dataclass(frozen=True)
class Buckets(_Noun):
    """The engines' communication buffers, in elements (DeepSpeed 0.19.8's
    ``zero_optimization`` defaults, ``deepspeed/runtime/zero/config.py``; PyTorch DDP's
    ``gradient_as_bucket_view``): see :mod:`zerolib.core.memory.working_set`."""

    noun = "trainer.buckets"
    reduce_bucket_size: int = REDUCE_BUCKET_SIZE
    overlap_comm: bool = False
    allgather_bucket_size: int = ALLGATHER_BUCKET_SIZE
    allgather_in_place: bool = True
    prefetch_bucket_size: int = STAGE3_PREFETCH_BUCKET_SIZE
    max_live_parameters: int = STAGE3_MAX_LIVE_PARAMETERS
    ddp_gradient_as_bucket_view: bool = False

    def __post_init__(self):
        for name in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size",
                     "max_live_parameters"):
            self._whole(name, 0, MAX_ELEMENTS)
        for name in ("overlap_comm", "allgather_in_place", "ddp_gradient_as_bucket_view"):
            self._flag(name)


DEFAULT_BUCKETS = Buckets()


@dataclass(frozen=True)
class Trainer(TrainerMemory, _Noun):
    """What runs the step and how: the ``engine`` (whose stages, schedule, overlap and pipeline
    rule: "paper", "deepspeed", "fsdp2", "megatron"), the ZeRO ``stages`` to answer for (None:
    every stage the engine offers), the ``layout`` of bytes per parameter (a preset's name or a
    :class:`~zerolib.core.memory.accounting.Layout`), ``recompute`` ("none", "selective",
    "full"), flash attention, the activations' ``element_bytes``, dropout masks' ``mask_bytes``,
    ``dropout`` (None: the model's own), ``logits_bytes`` (None: the element width and fp32),
    the engine's ``buckets``, the ``reserve`` bytes, offload of the optimizer and the
    parameters, ZeRO-R (``partition_activations``, ``cpu_checkpointing``), ZeRO++ (``qwz``,
    ``qgz``), the ``mfu`` compute runs at, an ``overlap`` rule (None: the engine's) and a
    mixture of experts' ``capacity_factor`` (None: dropless)."""

    noun = "trainer"
    engine: str = DEFAULT_ENGINE
    stages: tuple[int, ...] | None = None
    layout: str | Layout | None = None
    recompute: str | None = None
    flash_attention: bool = True
    element_bytes: int = 2
    mask_bytes: int = 1
    dropout: bool | None = None
    logits_bytes: tuple[int, ...] | None = None
    buckets: Buckets = field(default_factory=lambda: DEFAULT_BUCKETS)
    reserve: int = DEFAULT_RESERVE
    offload_optimizer: str = "none"
    offload_params: str = "none"
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    qwz: bool = False
    qgz: bool = False
    mfu: float = DEFAULT_MFU
    overlap: object = None
    capacity_factor: float | None = None
    norms: str = "fused"
    fp8: bool = False
    fp8_all_gather: bool = False
    compile: bool = False
    recompute_method: str = "uniform"
    recompute_layers: int = 1
    loss: str | None = None
    loss_chunks: int = 8
    logits_freed: bool | None = None
    reserved_ppm: int = RESERVED_PPM
    reshard_after_forward: bool | None = None

    def __post_init__(self):
        if not isinstance(self.engine, str):   # an Engine (a convention of one's own settings)
            from zerolib.core.step.engines import ENGINES, Engine
            if not isinstance(self.engine, Engine):
                raise TypeError(f"trainer.engine must be an engine's name or an Engine, got "
                                f"{echo(self.engine)}")
            if ENGINES.get(self.engine.name) == self.engine:
                object.__setattr__(self, "engine", self.engine.name)
        if isinstance(self.engine, str):
            self._choice("engine", ENGINE_NAMES)
        if self.stages is not None:
            stages = self.stages if isinstance(self.stages, (tuple, list)) else (self.stages,)
            for stage in stages:
                if isinstance(stage, bool) or stage not in STAGES:
                    self._fail("stages", "ZeRO stages from 0 to 3", self.stages)
            if not stages:
                self._fail("stages", "at least one ZeRO stage (None: every stage)", self.stages)
            object.__setattr__(self, "stages", tuple(dict.fromkeys(int(s) for s in stages)))
        if self.layout is None:
            pass
        elif isinstance(self.layout, (list, tuple)):
            if len(self.layout) != 3:
                self._fail("layout", "a preset's name or three widths [parameters, gradients, "
                                     "optimizer]", self.layout)
            object.__setattr__(self, "layout", Layout.custom(*self.layout))
        elif not isinstance(self.layout, Layout):
            self._choice("layout", tuple(LAYOUTS))
        self._choice("recompute", RECOMPUTE, optional=True)
        self._flag("flash_attention")
        self._whole("element_bytes", 1, MAX_ELEMENT_BYTES)
        self._whole("mask_bytes", 0, MAX_ELEMENT_BYTES)
        self._flag("dropout", optional=True)
        if self.logits_bytes is not None:
            widths = tuple(self.logits_bytes) if isinstance(self.logits_bytes, (tuple, list)) else None
            if not widths or any(isinstance(w, bool) or not isinstance(w, numbers.Integral)
                                 or not 1 <= w <= MAX_ELEMENT_BYTES for w in widths):
                self._fail("logits_bytes", f"widths from 1 to {MAX_ELEMENT_BYTES} bytes, like "
                                           "[2, 4]", self.logits_bytes)
            object.__setattr__(self, "logits_bytes", tuple(int(w) for w in widths))
        if isinstance(self.buckets, Mapping):
            object.__setattr__(self, "buckets", Buckets(**self.buckets))
        if not isinstance(self.buckets, Buckets):
            raise TypeError(f"trainer.buckets must be a Buckets, got {echo(self.buckets)}")
        self._whole("reserve", 0, MAX_BYTES)
        self._choice("offload_optimizer", OFFLOAD_DEVICES)
        self._choice("offload_params", OFFLOAD_DEVICES)
        for name in ("partition_activations", "cpu_checkpointing", "qwz", "qgz"):
            self._flag(name)
            if name in ("partition_activations", "cpu_checkpointing") and getattr(self, name) \
                    and self.recompute_policy != "full":
                raise ValueError(f"trainer.{name} applies to activation checkpoints: it needs "
                                 f"trainer.recompute 'full', got {self.recompute_policy!r}")
        object.__setattr__(self, "mfu", check_mfu(self.mfu, "trainer.mfu"))
        if self.overlap is not None:
            from zerolib.core.step.engines import Overlap  # the step's noun, imported when used
            if not isinstance(self.overlap, Overlap):
                raise TypeError(f"trainer.overlap must be an Overlap or None, got {echo(self.overlap)}")
        self._number("capacity_factor", 1.0, 64.0, optional=True)
        self._memory_fields()

    def working_set(self) -> WorkingSetSettings:
        """The trainer's part of the working set's settings (the layout of a run is the
        planner's to search): made and checked once per distinct trainer."""
        k = self.buckets
        return _trainer_working_set(
            self.flash_attention, self.element_bytes, self.mask_bytes, self.dropout,
            self.logits_bytes, (k.reduce_bucket_size, k.overlap_comm, k.allgather_bucket_size,
                                k.allgather_in_place, k.prefetch_bucket_size,
                                k.max_live_parameters, k.ddp_gradient_as_bucket_view),
            self.reserve, self.capacity_factor, tuple(self.memory_fields().items()))

@lru_cache(maxsize=64)
def _trainer_working_set(flash_attention, element_bytes, mask_bytes, dropout, logits_bytes,
                         buckets, reserve, capacity_factor, memory=()) -> WorkingSetSettings:
    from zerolib.core.memory.working_set import WorkingSetSettings
    (reduce_bucket_size, overlap_comm, allgather_bucket_size, allgather_in_place,
     prefetch_bucket_size, max_live_parameters, ddp_gradient_as_bucket_view) = buckets
    return WorkingSetSettings(
        flash_attention=flash_attention, element_bytes=element_bytes, mask_bytes=mask_bytes,
        dropout=dropout, logits_bytes=logits_bytes, reduce_bucket_size=reduce_bucket_size,
        overlap_comm=overlap_comm, allgather_bucket_size=allgather_bucket_size,
        allgather_in_place=allgather_in_place, prefetch_bucket_size=prefetch_bucket_size,
        max_live_parameters=max_live_parameters,
        ddp_gradient_as_bucket_view=ddp_gradient_as_bucket_view, reserve_bytes=reserve,
        capacity_factor=capacity_factor, **dict(memory))


@dataclass(frozen=True)
class Batch(_Noun):
    """The data of one step: ``seq_len`` tokens per sequence (None: the model's context length,
    at most 4,096), ``micro_batch`` sequences per GPU per micro-batch, ``micro_batches`` per
    step (gradient accumulation, or a pipeline's micro-batches; None: one, or enough to fill the
    pipeline), the ``global_batch`` in sequences (what the planner splits), the run's training
    ``tokens`` and, for a bare parameter count, the step's ``tokens_per_gpu``."""

    noun = "batch"
    seq_len: int | None = None
    micro_batch: int = 1
    micro_batches: int | None = None
    global_batch: int | None = None
    tokens: int | None = None
    tokens_per_gpu: int | None = None

    def __post_init__(self):
        self._whole("seq_len", 1, MAX_SEQ_LEN, optional=True)
        self._whole("micro_batch", 1, MAX_MICRO_BATCH)
        self._whole("micro_batches", 1, MAX_MICRO_BATCHES, optional=True)
        self._whole("global_batch", 1, MAX_MICRO_BATCHES, optional=True)
        self._whole("tokens", 1, MAX_RUN_TOKENS, optional=True)
        self._whole("tokens_per_gpu", 1, MAX_TOKENS_PER_GPU, optional=True)



NOUNS = MappingProxyType({"cluster": Cluster, "parallel": Parallelism, "trainer": Trainer,
                          "batch": Batch})
for _kind in (*NOUNS.values(), Buckets):
    _kind._defaults = MappingProxyType({f.name: f.default for f in fields(_kind)
                                        if f.default is not MISSING})
DEFAULTS = MappingProxyType({name: kind() for name, kind in NOUNS.items()})

# Every field's one flat name -> (noun, field) or (noun, sub-noun, field): Run.of's and
# Run.replace's keywords and the command line's flags (dashes for underscores).
FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    **{f.name: ("cluster", f.name) for f in fields(Cluster)},
    "tensor_parallel": ("parallel", "tensor"), "sequence_parallel": ("parallel", "sequence"),
    "pipeline_parallel": ("parallel", "pipeline"), "pipeline_schedule": ("parallel", "schedule"),
    "pipeline_chunks": ("parallel", "chunks"), "context_parallel": ("parallel", "context"),
    "expert_parallel": ("parallel", "expert"),
    "expert_tensor_parallel": ("parallel", "expert_tensor"),
    "shard_group": ("parallel", "shard_group"), "hpz": ("parallel", "hpz"),
    "pipeline_layers": ("parallel", "pipeline_layers"),
    **{f.name: ("trainer", f.name) for f in fields(Trainer) if f.name not in ("buckets", "reserve")},
    "reserve_bytes": ("trainer", "reserve"),
    **{f.name: ("trainer", "buckets", f.name) for f in fields(Buckets)},
    **{f.name: ("batch", f.name) for f in fields(Batch)},
})


def _model(model) -> TransformerConfig | int:
    """A TransformerConfig (a preset's name or a config) or a bare parameter count."""
    if type(model) is int and 1 <= model <= MAX_PARAMS:   # the usual counts, checked fast
        return model
    if type(model) is float and 1 <= model <= MAX_PARAMS and model.is_integer():
        return int(model)
    if isinstance(model, TransformerConfig):
        return model
    if isinstance(model, str):
        return get_model(model)
    if isinstance(model, bool) or not isinstance(model, numbers.Real):
        raise TypeError(f"model must be a preset's name, a TransformerConfig or a parameter count, "
                        f"got {echo(model)}")
    if not (math.isfinite(model) and float(model).is_integer() and 1 <= model <= MAX_PARAMS):
        raise ValueError(f"model must be a whole parameter count from 1 to {MAX_PARAMS:.0e}, "
                         f"got {echo(model)}")
    return int(model)


@dataclass(frozen=True)
class Run:
    """One training run (see the module doc). ``model`` is a TransformerConfig (a preset's name
    is looked up) or a bare parameter count."""

    model: TransformerConfig | int
    # frozen, so one default of each noun is shared (made and checked once)
    cluster: Cluster = field(default_factory=lambda: DEFAULTS["cluster"])
    parallel: Parallelism = field(default_factory=lambda: DEFAULTS["parallel"])
    trainer: Trainer = field(default_factory=lambda: DEFAULTS["trainer"])
    batch: Batch = field(default_factory=lambda: DEFAULTS["batch"])

    def __post_init__(self):
        object.__setattr__(self, "model", _model(self.model))
        for name, kind in NOUNS.items():
            value = getattr(self, name)
            if type(value) is kind:   # the usual case, checked fast
                continue
            if isinstance(value, Mapping):
                value = _noun_from(kind, value, name)
                object.__setattr__(self, name, value)
            if not isinstance(value, kind):
                raise TypeError(f"{name} must be a {kind.__name__}, got {echo(value)}")
        if self.parallel.pipeline_layers is not None:   # the model's rules, once
            from zerolib.core.memory.pipeline_stages import check_run_split
            check_run_split(self.config, self.parallel)

    def __deepcopy__(self, memo) -> Run:
        return self   # immutable (pandas deep-copies DataFrame.attrs)

    @property
    def config(self) -> TransformerConfig | None:
        """The architecture (None for a bare parameter count)."""
        return self.model if isinstance(self.model, TransformerConfig) else None

    @property
    def model_name(self) -> str:
        return self.config.name if self.config is not None else f"{self.model:,} parameters"

    @property
    def seq_len(self) -> int:
        """The batch's sequence length, or the model's context length at most 4,096."""
        if self.batch.seq_len is not None:
            return self.batch.seq_len
        return DEFAULT_SEQ if self.config is None else min(self.config.max_positions, DEFAULT_SEQ)

    @property
    def data_parallel(self) -> int:
        """d x C: the GPUs ZeRO shards over (the model-parallel degrees divide the GPUs)."""
        p = self.parallel
        return self.cluster.gpus // (p.tensor * p.pipeline)

    @classmethod
    def of(cls, model, gpus: int | None = None, **fields_by_name) -> Run:
        """A run from flat field names (:data:`FIELDS`): ``Run.of("llama-2-7b", 64,
        device="h100-80gb", micro_batch=2)``; what is not named keeps its default. Each noun
        is made (and checked) once."""
        if gpus is not None:
            fields_by_name = {"gpus": gpus, **fields_by_name}
        grouped = _grouped(fields_by_name)
        return cls(model, **{name: kind(**grouped[name]) for name, kind in NOUNS.items()
                             if name in grouped})

    def replace(self, **changes) -> Run:
        """A copy with fields changed, named flat (``micro_batch=2``) or as whole nouns
        (``batch=Batch(...)``, ``model=...``); a noun no field of which changes is kept as is."""
        whole = {name: changes.pop(name) for name in ("model", *NOUNS) if name in changes}
        nouns = {name: whole.get(name, getattr(self, name)) for name in NOUNS}
        for noun, values in _grouped(changes, nouns).items():
            nouns[noun] = replace(nouns[noun], **values)
        return Run(whole.get("model", self.model), **nouns)

    def as_dict(self) -> dict:
        """The run as plain values (the JSON an answer carries; TOML's tables)."""
        return {"model": model_dict(self.model),
                **{name: getattr(self, name).as_dict() for name in NOUNS}}

    def to_toml(self) -> str:
        """The run file (``docs/run-file.md``; read back by
        :func:`zerolib.core.run_file.read_run`): one table per noun, every field that differs
        from its default, the model whole (a preset by name, else every field of its
        architecture) so the file answers alike on any machine."""
        default = Run(self.model)
        blocks = [toml_table("model", model_dict(self.model))]
        for name in NOUNS:
            mine, theirs = getattr(self, name).as_dict(), getattr(default, name).as_dict()
            changed = {key: value for key, value in mine.items()
                       if value != theirs[key] and key != "buckets"}
            if name == "trainer" and "overlap" in changed:
                changed["overlap"] = self.trainer.overlap.name
            if changed:
                blocks.append(toml_table(name, changed))
            if name == "trainer":
                buckets = {key: value for key, value in mine["buckets"].items()
                           if value != theirs["buckets"][key]}
                if buckets:
                    blocks.append(toml_table("trainer.buckets", buckets))
        return ("# A zerolib run: zerolib estimate --run FILE (docs/run-file.md)\n"
                + "\n\n".join("\n".join(block) for block in blocks) + "\n")

    def __repr__(self) -> str:
        return (f"Run(model={self.model_name!r}, cluster={self.cluster!r}, parallel={self.parallel!r}, "
                f"trainer={self.trainer!r}, batch={self.batch!r})")

    # The internal settings the memory model and the step model read, made from the run.
    def working_set_settings(self) -> WorkingSetSettings:
        """The working set's settings (:class:`~zerolib.core.memory.working_set.WorkingSetSettings`)."""
        from zerolib.core.memory.working_set import WorkingSetSettings
        p, t, b, k = self.parallel, self.trainer, self.batch, self.trainer.buckets
        return WorkingSetSettings(
            seq_len=self.seq_len, micro_batch=b.micro_batch, recompute=t.recompute_policy,
            flash_attention=t.flash_attention, tensor_parallel=p.tensor,
            sequence_parallel=p.sequence, pipeline_parallel=p.pipeline,
            pipeline_schedule=p.schedule, pipeline_chunks=p.chunks, pipeline_layers=p.pipeline_layers,
            micro_batches=b.micro_batches if p.pipeline > 1 else None,
            element_bytes=t.element_bytes, mask_bytes=t.mask_bytes, dropout=t.dropout,
            logits_bytes=t.logits_bytes, reduce_bucket_size=k.reduce_bucket_size,
            overlap_comm=k.overlap_comm, allgather_bucket_size=k.allgather_bucket_size,
            allgather_in_place=k.allgather_in_place, prefetch_bucket_size=k.prefetch_bucket_size,
            max_live_parameters=k.max_live_parameters,
            ddp_gradient_as_bucket_view=k.ddp_gradient_as_bucket_view, reserve_bytes=t.reserve,
            capacity_factor=t.capacity_factor, expert_tensor_parallel=p.expert_tensor,
            context_parallel=p.context, partition_activations=t.partition_activations,
            cpu_checkpointing=t.cpu_checkpointing, **t.memory_fields())

    def placement(self) -> Placement | None:
        """Where the state lives (None: the chapter's ZeRO, all on the GPU over every
        data-parallel GPU)."""
        p, t, c = self.parallel, self.trainer, self.cluster
        if (p.shard_group is None and not p.hpz and t.offload_optimizer == "none"
                and t.offload_params == "none"):
            return None
        from zerolib.core.memory.placement import Placement, gpus_on_node
        hpz = 1
        if p.hpz:
            on_node = int(gpus_on_node(c.gpus, c.gpus_per_node))
            if on_node % p.tensor:
                raise ValueError(f"parallel.hpz needs the GPUs of a node ({on_node}) to be a "
                                 f"multiple of parallel.tensor ({p.tensor})")
            hpz = on_node // p.tensor
            if hpz == 1:
                raise ValueError("parallel.hpz needs more than one data-parallel GPU per node "
                                 "(see cluster.gpus_per_node)")
        return Placement(shard_group=p.shard_group, hpz_partition=hpz,
                         offload_optimizer=t.offload_optimizer, offload_params=t.offload_params,
                         gpus_per_node=c.gpus_per_node)


def _grouped(fields_by_name: Mapping, current: Mapping | None = None) -> dict[str, dict]:
    """Flat fields grouped by noun (a sub-noun's as its whole value: ``buckets``, from
    ``current``'s where given)."""
    unknown = [name for name in fields_by_name if name not in FIELDS]
    if unknown:
        near = difflib.get_close_matches(unknown[0], FIELDS, n=1)
        raise TypeError(f"a run has no field {unknown[0]!r}"
                        + (f": did you mean {near[0]!r}?" if near else
                           " (docs/run-file.md lists every field)"))
    grouped: dict[str, dict] = {}
    inner: dict[tuple[str, str], dict] = {}
    for name, value in fields_by_name.items():
        path = FIELDS[name]
        if len(path) == 3:
            inner.setdefault(path[:2], {})[path[2]] = value
        else:
            grouped.setdefault(path[0], {})[path[1]] = value
    for (noun, sub), values in inner.items():
        base = getattr(current[noun], sub) if current is not None else None
        kind = Buckets
        grouped.setdefault(noun, {})[sub] = kind(**values) if base is None else replace(base, **values)
    return grouped


def model_dict(model: TransformerConfig | int) -> dict:
    """The ``[model]`` table: ``params`` for a bare count, ``preset`` for a catalogue model,
    else the architecture's fields (those without a default, and those that differ from it)."""
    if not isinstance(model, TransformerConfig):
        return {"params": int(model)}
    from zerolib.core.catalogue.models import MODELS
    if MODELS.get(model.name) == model:
        return {"preset": model.name}
    return {f.name: getattr(model, f.name) for f in fields(model)
            if f.default is MISSING or getattr(model, f.name) != f.default}


def _noun_from(kind, values: Mapping, name: str):
    """A noun from a table of its fields (a run file's, a JSON answer's)."""
    known = {f.name for f in fields(kind)}
    unknown = [key for key in values if key not in known]
    if unknown:
        raise ValueError(f"{name} has no field {echo(unknown[0])} (its fields: {', '.join(sorted(known))})")
    return kind(**values)
