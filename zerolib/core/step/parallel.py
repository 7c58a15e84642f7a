"""How long one training step takes under tensor, pipeline and data parallelism (ZeRO) together.

:mod:`zerolib.core.step.time` times the collectives of data parallelism alone. This module
composes the same schedule (:mod:`zerolib.core.step.traffic`) with what model parallelism
communicates (:mod:`zerolib.core.step.model_parallel_traffic`'s rows), every collective timed on
its ring by the one ring model (:func:`zerolib.core.step.collectives.ring_timing`) and every
pipeline message by :func:`zerolib.core.step.time.send_seconds`, and adds the pipeline's idle
time. Vectorised: every argument broadcasts, so a planner's whole space is one call.

**Where each group sits.** GPUs are numbered tensor-parallel rank fastest, then data-parallel,
then pipeline (Megatron-LM's default ``order="tp-cp-ep-dp-pp"``,
``megatron/core/parallel_state.py`` ``initialize_model_parallel``): a tensor-parallel group is t
neighbouring GPUs inside one node (the planner's rule); a data-parallel group is d GPUs t apart,
its rings leaving a node through the ports the node's t groups share (they reduce at the same
time); consecutive pipeline stages are t x d GPUs apart, the slowest hop across the network once
the pipeline spans nodes, one base latency plus one network hop per message (NCCL's constants,
:mod:`zerolib.core.catalogue.links`).

**Per micro-batch**, on the heavier of the first and the last pipeline stage (their parameters
are the most of any stage, :mod:`zerolib.core.memory.model_parallel`):

- compute: :func:`zerolib.core.step.time.step_flops` for the parameters this GPU's matrices
  multiply on the stage (its active parameters less the input embedding it looks up,
  :mod:`zerolib.core.step.flops`) and the attention core of the stage's layers and this GPU's
  heads (causal with flash attention), over the micro-batch's b x s tokens: the core forward,
  backward and once more under selective and full recomputation;
- the tensor-parallel collectives and the pipeline's point-to-point messages the stage sends,
  not overlapped (each layer's next operation needs the result; Megatron-LM's optional
  communication overlap is not modelled);
- ZeRO's per-micro-batch collectives, as far as the engine's overlap rule hides them behind that
  micro-batch's passes (which run every micro-batch and which once:
  :func:`zerolib.core.step.engines.when`; the layer units a pipeline stage gathers are its share
  of the model's); the excess is exposed.

**Per step**, with m micro-batches per pipeline and v model chunks per stage: the pipeline runs
m micro-batches plus the bubble of (p - 1) / v micro-batch times (Narayanan et al. 2021, arXiv
2104.04473, Sec. 2.2: bubble fraction (p - 1)/m of the ideal time for 1F1B, and (1/v)(p - 1)/m
for the interleaved schedule), and the collectives that run once per step (stages 0-1's
reduction at the last micro-batch, overlapping its backward; stages 1-2's all-gather of the
updated parameters after the optimizer step, overlapping nothing). So

    step = (m + (p - 1)/v) x T_mb + exposed per-step collectives,

with T_mb the micro-batch time above. It splits into the named parts of :data:`PARTS`:
compute (m micro-batches' FLOPs), the network (tensor-parallel, context, expert, pipeline and
the exposed data-parallel time of the m micro-batches, plus the exposed per-step collectives)
and the bubble ((p - 1)/v x T_mb, idle waiting for other stages): ``network_wait_fraction``
and ``bubble_fraction`` are those parts over the step.

**Shard groups** (:mod:`zerolib.core.step.traffic`, whose bytes and calls are used as they
are): the group's all-gathers and reduce-scatter run on a ring of G GPUs t apart, the
replicas' all-reduce on one of d / G GPUs G x t apart, every GPU of a node in one such ring at
once; stage 0's all-reduce over all d GPUs t apart. The replicas' all-reduce runs **once per
step**, in the last micro-batch's backward, after that micro-batch's reduce-scatter (stage 1:
after the one reduce-scatter of the step): DeepSpeed's MiCS skips it "if not
self.is_gradient_accumulation_boundary" (``runtime/zero/mics.py``
``allreduce_mics_shard_grads``, called from ``partition_grads`` layer by layer during the
backward; MiCS was removed after DeepSpeed 0.19, issue deepspeedai/DeepSpeed#8489, and 0.19.8
refuses ``mics_shard_size``), and PyTorch FSDP2 does the same for HSDP under
``set_requires_all_reduce(False)`` on the other micro-batches ("gradient accumulation with only
reduce-scatter but not all-reduce for HSDP"; FSDP2's default would all-reduce every
micro-batch). With G = d every time is exactly the one the whole group gives.

**Offload** (the planner's options, DeepSpeed's ``offload_optimizer`` and ``offload_param`` to
the CPU): each GPU's host copies and the CPU's optimizer step, added to the phase they run in
when DeepSpeed runs them (:mod:`zerolib.core.step.parallel_offload` says when, with its
sources, and what it leaves out).

**Context parallelism** (C): ``data_parallel`` is the d x C ZeRO group, each GPU works on s / C
tokens, and the ring's sends are the ``context`` part (:mod:`zerolib.core.step.context_parallel_traffic`).
**ZeRO-R** (``partition_activations``, ``cpu_checkpointing``): in the ``tensor`` part, not
overlapped (:mod:`zerolib.core.step.zero_r_step`). **Expert parallelism** (E) and expert tensor
parallelism: the all-to-alls and the dispatcher's ETP collectives are the ``expert`` part, the
routed experts' collectives run over their own group (:mod:`zerolib.core.step.expert_parallel_step`).

Left out: Megatron-LM's and DeepSpeed's communication overlaps beyond the ones stated; the middle
pipeline stages (fewer parameters than the first or last, and at most one more message per
micro-batch); contention between the tensor-parallel, pipeline and data-parallel traffic of one
node (each is timed as if it had its links to itself); kernel efficiency per shape (one ``mfu``
for every matrix); the optimizer step's own time on the GPU; ZeRO++ (not planned); and the
network effects :mod:`zerolib.core.catalogue.nodes` leaves out.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.links import Link
from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.catalogue.nodes import Interconnect, cluster_interconnect
from zerolib.core.inputs import (
    broadcast,
    check_gpus,
    check_positive_int,
    check_stage,
    check_whole,
    echo,
)
from zerolib.core.intmath import ceil_div
from zerolib.core.memory.accounting import Layout, check_shard_group, get_layout
from zerolib.core.memory.activations import RECOMPUTE, check_capacity_factor, context_parallel_tokens
from zerolib.core.memory.model_parallel import (
    MAX_CHUNKS,
    MAX_MICRO_BATCHES,
    RULES,
    ParallelGrid,
    parameters_on,
    rules_of,
    stage_layers,
)
from zerolib.core.memory.placement import placement_on
from zerolib.core.memory.working_set import MAX_MICRO_BATCH, MAX_SEQ_LEN
from zerolib.core.step import expert_parallel_step as ep_step
from zerolib.core.step.collectives import CHUNKS_SENT, ring_timing_of
from zerolib.core.step.context_parallel_traffic import context_rows
from zerolib.core.step.engines import DEFAULT_ENGINE, Engine, Overlap, get_engine
from zerolib.core.step.flops import lookup_parameters_on
from zerolib.core.step.model_parallel_traffic import (
    pipeline_rows,
    tensor_rows,
)
from zerolib.core.step.offload_traffic import (
    DEFAULT_HOST_LINK,
    HostSettings,
    check_host_settings,
    node_host_settings,
)
from zerolib.core.step.parallel_offload import (  # noqa: F401  (where callers find them)
    OFFLOADS,
    check_host_link,
    check_offloads,
    checked_node,
    host_seconds_of,
    offload_seconds,
    setting_codes,
    setting_groups,
    shard_group_traffic,
)
from zerolib.core.step.time import (
    DEFAULT_MFU,
    attention_core_flops_of,
    check_mfu,
    schedule_seconds,
    send_seconds,
    step_flops,
)
from zerolib.core.step.traffic import (
    check_engine_schedule,
    layer_units,
    traffic_of,
)
from zerolib.core.step.zero_r_step import checkpoint_seconds

KIND_OF = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter"}
PARTS = ("compute", "tensor", "context", "expert", "pipeline", "data_parallel", "bubble")
# DeepSpeed 0.19.8 runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
# parallelism"; Megatron-LM's distributed optimizer is stage 1.
PIPELINE_STAGES = (0, 1)


def bubble_fraction(pipeline_parallel, micro_batches, chunks=1) -> np.ndarray:
    """The pipeline bubble as a fraction of the ideal time: (p - 1) / (v m) (Narayanan et al.
    2021, Sec. 2.2.1 for 1F1B, v = 1; Sec. 2.2.2 for v model chunks per stage)."""
    p = check_whole(pipeline_parallel, "pipeline_parallel", "a positive whole number of stages")
    m = check_whole(micro_batches, "micro_batches", "a positive whole number of micro-batches",
                    1, MAX_MICRO_BATCHES)
    v = check_whole(chunks, "chunks", "a positive whole number of model chunks", 1, MAX_CHUNKS)
    p, m, v = (a.astype(np.float64) for a in broadcast(pipeline_parallel=p, micro_batches=m,
                                                       chunks=v))
    return (p - 1) / (v * m)


# --- the per-micro-batch traffic, from model_parallel_traffic's rows -----------------------------

def _smallest_tensor_parallel(config: TransformerConfig) -> int:
    """The smallest t > 1 that divides the heads, key/value heads and MLP width (0: none)."""
    common = math.gcd(config.heads, config.kv_heads, config.ffn_hidden)
    return next((t for t in range(2, common + 1) if common % t == 0), 0)


@lru_cache(maxsize=4096)
def _tensor_rows(config: TransformerConfig, seq_len: int, p: int, r: int,
                 sequence_parallel: bool, recompute: str, element_bytes: int, first_last=(0, 0)):
    """(kind, calls per micro-batch, bytes per call at micro-batch 1) of the tensor-parallel
    collectives on stage r, for any t > 1: the rows' calls and sizes do not depend on t (only
    the group does), and their bytes, b x s x h elements (or 3 fp32 values per token for the
    loss), are exactly proportional to the micro-batch."""
    # Inputs checked by parallel_step_time (or the planner's door): the kernel trusts them.
    grid = ParallelGrid(config, _smallest_tensor_parallel(config), p, r, "1f1b", 1, 1, 1, first_last)
    rows = tensor_rows(grid, seq_len, element_bytes * seq_len * config.hidden, sequence_parallel,
                       recompute)
    return tuple((KIND_OF[row.collective], row.calls, row.tensor_bytes) for row in rows)


@lru_cache(maxsize=4096)
def _pipeline_sends(config: TransformerConfig, seq_len: int, t: int, p: int, r: int,
                    sequence_parallel: bool, chunks: int, element_bytes: int):
    """(messages per micro-batch, bytes per message at micro-batch 1) stage r sends. A message
    is b s h elements, or b s h / t under sequence parallelism, where t divides s (the rules):
    exactly proportional to the micro-batch either way."""
    schedule = "interleaved" if chunks > 1 else "1f1b"
    m = p if chunks > 1 else 1     # the interleaved schedule takes micro-batches in groups of p
    grid = ParallelGrid(config, t, p, r, schedule, chunks, m, 1)
    rows = pipeline_rows(grid, element_bytes * seq_len * config.hidden, sequence_parallel,
                         sequence_parallel)
    sends = [row for row in rows if row.collective == "send"]
    if not sends:
        return 0, 0
    if len({row.tensor_bytes for row in sends}) != 1 or any(row.calls % m for row in sends):
        raise ValueError("pipeline messages of one stage differ in size")   # not expected
    return sum(row.calls for row in sends) // m, sends[0].tensor_bytes


@dataclass(frozen=True)
class ParallelStepTime:
    """Seconds of one step per setting (float64 arrays, broadcast like the inputs): one field
    per part of :data:`PARTS`, which add up to the step, and T_mb."""

    compute: np.ndarray = field(repr=False)
    tensor: np.ndarray = field(repr=False)
    context: np.ndarray = field(repr=False)
    expert: np.ndarray = field(repr=False)
    pipeline: np.ndarray = field(repr=False)
    data_parallel: np.ndarray = field(repr=False)
    bubble: np.ndarray = field(repr=False)
    micro_batch_seconds: np.ndarray = field(repr=False)   # T_mb, on the slowest stage

    @property
    def parts(self) -> Mapping[str, np.ndarray]:
        """The parts by name, in the order of :data:`PARTS`."""
        return MappingProxyType({name: getattr(self, name) for name in PARTS})

    @property
    def step_seconds(self) -> np.ndarray:
        return sum(self.parts.values())

    @property
    def network_seconds(self) -> np.ndarray:
        return self.tensor + self.context + self.expert + self.pipeline + self.data_parallel

    @property
    def network_wait_fraction(self) -> np.ndarray:
        return self.network_seconds / self.step_seconds

    @property
    def bubble_fraction(self) -> np.ndarray:
        return self.bubble / self.step_seconds


@dataclass(frozen=True)
class _OnStage:
    """One pipeline stage's seconds (float64 arrays, one per setting): per micro-batch its
    compute, tensor-parallel (ZeRO-R's included), context, expert and pipeline parts and the ZeRO
    collectives exposed each micro-batch (``data_parallel``); ``per_step``: the ZeRO collectives
    exposed once per step."""

    compute: np.ndarray
    tensor: np.ndarray
    context: np.ndarray
    expert: np.ndarray
    pipeline: np.ndarray
    data_parallel: np.ndarray
    per_step: np.ndarray

    @property
    def micro_batch(self) -> np.ndarray:
        """T_mb: what one micro-batch takes on this stage (the per-step part left out)."""
        return (self.compute + self.tensor + self.context + self.expert + self.pipeline
                + self.data_parallel)



@dataclass(frozen=True, eq=False)
class ParallelSettings:
    """A 3-D layout and how it trains, checked once when built: :func:`parallel_step_time`'s
    settings (see there). The per-setting values broadcast together and are kept as int64 (or
    bool) arrays of one shape, ``recompute`` and ``offload`` as their names' indices into
    :data:`zerolib.core.memory.activations.RECOMPUTE` and :data:`OFFLOADS`; ``layout``,
    ``mfu`` and ``host_link`` resolved; shard groups divide ``data_parallel`` and every offload
    is offered at its stage. The functions beneath trust it: they build the step's traffic,
    rings and host copies from it without checking again. A door that checked the values
    itself (the planner) makes it with :meth:`from_checked`."""

    seq_len: int
    micro_batch: np.ndarray
    tensor_parallel: np.ndarray
    pipeline_parallel: np.ndarray
    data_parallel: np.ndarray
    stage: np.ndarray
    micro_batches: np.ndarray
    chunks: np.ndarray = 1
    sequence_parallel: np.ndarray = False
    recompute: np.ndarray = "none"
    shard_group: np.ndarray | None = None
    offload: np.ndarray = "none"
    layout: Layout | str = "mixed-adam"
    mfu: float = DEFAULT_MFU
    element_bytes: int = 2
    host_link: Link | str = DEFAULT_HOST_LINK
    host: HostSettings | None = None    # offload's host; None: the node's own (or DGX A100's)
    context_parallel: int = 1      # C GPUs share each sequence (data_parallel is then d x C)
    expert_parallel: np.ndarray = 1    # E: experts / E per GPU (expert_parallel_step's rules)
    capacity_factor: float | None = None   # the experts' token buffers (None: dropless)
    # ETP: each expert split over ETP ranks (None: tensor_parallel, Megatron-LM's default)
    expert_tensor_parallel: np.ndarray | None = None
    engine: Engine | str = DEFAULT_ENGINE      # whose schedule (zerolib.core.step.engines)
    overlap: Overlap | None = None              # None: the engine's own overlap rule
    # ZeRO-R, per setting: P_a (partitioned checkpoints) and P_a+cpu; full recomputation only.
    partition_activations: np.ndarray = False
    cpu_checkpointing: np.ndarray = False
    # A fused attention kernel (flash attention): the attention core is counted causal, half of
    # the s x s products (zerolib.core.step.time); Megatron-LM's unfused core computes them all.
    flash_attention: bool = True
    # Uneven pipeline stages per setting: the first and last stage's layers (0: even, stage_layers').
    first_layers: np.ndarray = 0
    last_layers: np.ndarray = 0

    def __post_init__(self):
        put = object.__setattr__
        if not isinstance(self.flash_attention, (bool, np.bool_)):
            raise TypeError(f"flash_attention must be True or False, got {echo(self.flash_attention)}")
        put(self, "flash_attention", bool(self.flash_attention))
        put(self, "host", None if self.host is None else check_host_settings(self.host, "host"))
        put(self, "engine", get_engine(self.engine))
        if self.overlap is not None and not isinstance(self.overlap, Overlap):
            raise TypeError(f"overlap must be an Overlap, got {type(self.overlap).__name__}")
        put(self, "layout", get_layout(self.layout))
        put(self, "mfu", check_mfu(self.mfu))
        put(self, "host_link", check_host_link(self.host_link))
        put(self, "seq_len", check_positive_int(self.seq_len, "seq_len", MAX_SEQ_LEN))
        put(self, "element_bytes", check_positive_int(self.element_bytes, "element_bytes", 16))
        context_parallel_tokens(self.seq_len, self.context_parallel)
        put(self, "context_parallel", int(self.context_parallel))
        if self.capacity_factor is not None:
            put(self, "capacity_factor", check_capacity_factor(self.capacity_factor))
        arrays = np.broadcast_arrays(
            check_gpus(self.micro_batch, "micro_batch"),
            check_gpus(self.tensor_parallel, "tensor_parallel"),
            check_gpus(self.pipeline_parallel, "pipeline_parallel"),
            check_gpus(self.data_parallel, "data_parallel"), check_stage(self.stage),
            check_gpus(self.micro_batches, "micro_batches"), check_gpus(self.chunks, "chunks"),
            check_gpus(self.expert_parallel, "expert_parallel"),
            _flags(self.sequence_parallel, "sequence_parallel"),
            setting_codes(self.recompute, RECOMPUTE, "recompute"),
            setting_codes(self.offload, tuple(OFFLOADS), "offload"),
            _flags(self.partition_activations, "partition_activations"),
            _flags(self.cpu_checkpointing, "cpu_checkpointing"),
            check_whole(self.first_layers, "first_layers", "a whole number of layers (0: even)", 0),
            check_whole(self.last_layers, "last_layers", "a whole number of layers (0: even)", 0),
            *(() if self.expert_tensor_parallel is None else
              (check_gpus(self.expert_tensor_parallel, "expert_tensor_parallel"),)))
        names = ("micro_batch", "tensor_parallel", "pipeline_parallel", "data_parallel", "stage",
                 "micro_batches", "chunks", "expert_parallel", "sequence_parallel", "recompute",
                 "offload", "partition_activations", "cpu_checkpointing", "first_layers", "last_layers",
                 "expert_tensor_parallel")
        for name, array in zip(names, arrays):
            put(self, name, np.array(array))
        b, p, zero = self.micro_batch, self.pipeline_parallel, self.stage
        if self.shard_group is not None:
            group = np.broadcast_to(check_gpus(self.shard_group, "shard_group"), b.shape)
            put(self, "shard_group", check_shard_group(group, self.data_parallel))
        check_offloads(self.stage, self.offload)
        full = self.recompute == RECOMPUTE.index("full")
        for name in ("partition_activations", "cpu_checkpointing"):   # the working set's rule
            if np.any(getattr(self, name) & ~full):
                raise ValueError(f"{name} applies to activation checkpoints: it needs "
                                 "recompute='full' wherever it is set")
        if (np.any(b > MAX_MICRO_BATCH) or np.any(self.micro_batches > MAX_MICRO_BATCHES)
                or np.any(self.chunks > MAX_CHUNKS)):
            raise ValueError(f"micro_batch must be at most {MAX_MICRO_BATCH:,}, micro_batches at most "
                             f"{MAX_MICRO_BATCHES:,} and chunks at most {MAX_CHUNKS:,}")
        engine = self.engine
        check_engine_schedule(engine, zero, self.data_parallel,
                              self.data_parallel if self.shard_group is None else self.shard_group,
                              False)
        piped = (p > 1) & ~np.isin(zero, engine.pipeline_stages)
        if np.any(piped) and engine.pipeline_stages == PIPELINE_STAGES:
            raise ValueError("ZeRO stages 2 and 3 do not run with pipeline parallelism (DeepSpeed's "
                             "PipelineEngine: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                             "parallelism'); use stage 0 or 1 with pipeline_parallel > 1")
        if np.any(piped):
            raise ValueError(f"engine {engine.name} runs ZeRO stages "
                             f"{', '.join(map(str, engine.pipeline_stages))} with pipeline "
                             "parallelism")

    def __deepcopy__(self, memo) -> ParallelSettings:
        return self  # immutable

    @classmethod
    def from_checked(cls, **values) -> ParallelSettings:
        """Settings a door checked already (the planner's configurations, enumerated from its
        checked :class:`~zerolib.core.planner.PlanSettings`), made without checking them again:
        the fields by name, as the constructor takes them (``seq_len``, ``layout``, ``mfu``,
        ``element_bytes``, ``host_link``, ``shard_group``, ``recompute`` and ``offload`` always;
        a :class:`Layout` and a :class:`~zerolib.core.catalogue.links.Link`; ``recompute`` and
        ``offload`` as codes; every array one shape; ``engine`` None: the default engine)."""
        unknown = sorted(set(values) - _FIELDS)
        missing = [name for name in _REQUIRED if name not in values]
        if unknown or missing:
            raise TypeError(f"from_checked takes ParallelSettings' fields: unknown {unknown}, "
                            f"missing {missing}")
        settings = object.__new__(cls)
        put = object.__setattr__
        for name, default in _SHARED_DEFAULTS.items():    # one value for every setting
            put(settings, name, values.pop(name, default))
        if settings.engine is None:
            put(settings, "engine", get_engine(DEFAULT_ENGINE))
        shard_group = values.pop("shard_group")
        arrays = {"chunks": 1, "sequence_parallel": False, "expert_parallel": 1,
                  "partition_activations": False, "cpu_checkpointing": False, "first_layers": 0,
                  "last_layers": 0, **values}
        names = list(arrays)
        typed = (np.asarray(arrays[n], dtype=bool if n in _BOOL_ARRAYS else np.int64)
                 for n in names)    # the dtypes __post_init__ gives them
        for name, array in zip(names, np.broadcast_arrays(*typed)):
            put(settings, name, np.array(array))
        put(settings, "shard_group", None if shard_group is None
            else np.broadcast_to(np.asarray(shard_group, dtype=np.int64), settings.micro_batch.shape))
        return settings


# from_checked's fields: the shared values (beside seq_len, layout, mfu, element_bytes and
# host_link, which it always takes) with their defaults, and the ones it always takes.
_SHARED_DEFAULTS = {"seq_len": None, "layout": None, "mfu": None, "element_bytes": None,
                    "host_link": None, "host": None, "context_parallel": 1, "engine": None,
                    "overlap": None, "capacity_factor": None, "flash_attention": True}
_REQUIRED = ("seq_len", "layout", "mfu", "element_bytes", "host_link", "shard_group", "recompute",
             "offload")
_FIELDS = frozenset(f.name for f in fields(ParallelSettings))


def parallel_step_time(model, link: str | Interconnect, device: str | Device,
                       settings: ParallelSettings | None = None, *,
                       gpus_per_node: int | None = None, **options) -> ParallelStepTime:
    """The step time of every setting (see the module doc), broadcast over ``micro_batch``,
    ``tensor_parallel``, ``pipeline_parallel``, ``data_parallel``, ``stage``, ``micro_batches``
    (per step and pipeline), ``chunks`` (1: 1F1B; 2 or more: interleaved), ``sequence_parallel``,
    ``recompute`` (names of :data:`zerolib.core.memory.activations.RECOMPUTE`), ``shard_group`` (a
    divisor of ``data_parallel``; None: all of them) and ``offload`` (names of
    :data:`OFFLOADS`, its copies on ``host_link``, a PCIe link of
    :data:`zerolib.core.catalogue.links.LINKS`); ``seq_len``, ``layout``, ``mfu`` and
    ``element_bytes`` hold for all. Give them as a :class:`ParallelSettings` (checked once, when
    built) or as keywords (``options``: its fields, checked here).

    ``link`` is :func:`cluster_interconnect`'s (``gpus_per_node`` for a node). Settings must
    obey :func:`zerolib.core.memory.model_parallel.parallel_rules` and keep stages 2-3 without a
    pipeline (:data:`PIPELINE_STAGES`); anything else is a ValueError naming the rule.
    """
    if settings is None:
        settings = ParallelSettings(**options)
    elif options:
        raise TypeError(f"give the settings or keywords, not both (got {', '.join(options)})")
    elif not isinstance(settings, ParallelSettings):
        raise TypeError(f"settings must be a ParallelSettings, got {type(settings).__name__}")
    config = get_model(model)
    ic = link if isinstance(link, Interconnect) else cluster_interconnect(link, gpus_per_node)
    device = get_device(device)
    return _step_time(config, ic, device, settings)


def _step_time(config, ic, device, st: ParallelSettings) -> ParallelStepTime:
    """:func:`parallel_step_time` beneath its door: the model, interconnect and device looked up
    and the settings checked already (so :func:`_per_degree` calls it once per degree)."""
    if np.ndim(st.context_parallel):    # a CP degree per setting (the planner's): one call each
        return _per_degree(config, ic, device, st)
    layout, mfu, s, e = st.layout, st.mfu, st.seq_len, st.element_bytes
    b, t, p, d, zero = (st.micro_batch, st.tensor_parallel, st.pipeline_parallel, st.data_parallel,
                        st.stage)
    m, v, sp, rec, off = st.micro_batches, st.chunks, st.sequence_parallel, st.recompute, st.offload
    shard_group = st.shard_group
    host_settings = (node_host_settings(ic.name) if st.host is None else st.host).with_host_link(
        st.host_link)
    c = st.context_parallel
    s = s // c      # the tokens of each sequence one GPU computes on (its CP rank's share)
    engine = st.engine
    rule = engine.overlap if st.overlap is None else st.overlap
    uneven = (st.first_layers, st.last_layers) if np.any(st.first_layers) else None
    _check_rules(config, t, p, v, m, s, sp, ic, uneven)
    ep, etp = st.expert_parallel, st.expert_tensor_parallel
    # Every mixture: its dispatcher's ETP collectives run at ETP = t and E = 1 too.
    spread = bool(np.any(ep > 1)) or (etp is not None and bool(np.any(etp != t)))
    moe = ((spread or config.mixture_of_experts)
           and ep_step.checked(config, ep, t, d, sp, shard_group, off, etp))
    # The layer units a pipeline stage gathers one call each (its share of the model's).
    units = np.maximum(_unit_count(config) // p, 1)

    def units_of(zero):
        return np.where(np.isin(zero, engine.layered_stages), units, 1)

    def stage_part(r):
        """Per micro-batch on stage r: compute, tensor, pipeline and exposed ZeRO seconds; the
        backward compute and the per-step ZeRO seconds."""
        params = parameters_on(ParallelGrid(config, t, p, r, "1f1b", 1, None, 1, uneven))   # checked
        forward, backward = np.zeros(b.shape), np.zeros(b.shape)
        # A token runs k of a mixture's X routed experts and looks its embedding up: the
        # matrices it multiplies are the active parameters less the lookup (time.py's rule).
        active = ep_step.active_parameters(config, params, t, p, r)
        multiplied = active - lookup_parameters_on(config, t, p, r)
        # The attention core of this GPU's heads and the stage's layers, every step (causal
        # with flash attention). Under context parallelism each of its s / C tokens still
        # attends over the whole sequence.
        core = attention_core_flops_of(config, st.seq_len, t, stage_layers(config.layers, p, r, uneven),
                                       st.flash_attention)
        rate = device.peak_flops * mfu
        for code, name in enumerate(RECOMPUTE):   # the recompute setting chooses the FLOPs
            here = rec == code
            if np.any(here):
                fwd, bwd = step_flops(multiplied, core, name)
                forward = np.where(here, fwd * (s * b) / rate, forward)
                backward = np.where(here, bwd * (s * b) / rate, backward)
        tensor = _tensor_seconds(config, ic, s, e, b, t, p, r, sp, rec, uneven or (0, 0)) + checkpoint_seconds(
            config, ic, st, r)
        context = _context_seconds(config, ic, s, e, b, c, t, r, p, rec, uneven or (0, 0))
        pipe = _pipeline_seconds(config, ic, s, e, b, t, p, d, r, sp, v)
        slots, every = _zero_slots(ic, params, d, t, zero, layout, shard_group, units, p, engine)
        expert = np.zeros(b.shape)
        if moe:   # the experts' state reduced over d / E, their tokens' all-to-alls
            slots, expert = ep_step.expert_parts(config, ic, st, slots, params, r, units,
                                                 _zero_slots)
        host = host_seconds_of(params, d, zero, off, shard_group, layout, host_settings,
                               ic.gpus_per_node)
        none = np.zeros(b.shape)
        # Every micro-batch: the forward's gathers and parameter fetches (hidden behind its
        # forward under the rule), the backward's collectives that run every micro-batch and
        # stages 2-3's gradient copy (behind its backward at the stages the rule hides).
        gather_f = slots["forward_all_gather"] + host["forward"]
        in_backward = (sum(np.where(every[n], slots[n], 0.0) for n in _BACKWARD)
                       + np.where(zero >= 2, host["backward"], 0.0))
        # Once per step, in the last micro-batch's backward, after what it does every time:
        # stages 0-1's reduction and gradient copy, the replicas' all-reduce.
        once = (sum(np.where(every[n], 0.0, slots[n]) for n in _BACKWARD)
                + np.where(zero == 1, host["backward"], 0.0))
        after = slots["parameter_all_gather"] + host["after_step"]
        first = none
        if rule.first_gather_exposed:
            first = np.where(zero >= 2, slots["forward_all_gather"] / np.maximum(units_of(zero), 1),
                             0.0)
        fwd_wait = (first + np.maximum(gather_f - first - forward, 0.0) if rule.forward_hidden
                    else gather_f)
        hidden = np.isin(zero, rule.backward_hidden)
        bwd_wait = np.where(hidden, np.maximum(in_backward - backward, 0.0), in_backward)
        per_mb = fwd_wait + bwd_wait
        last = np.where(hidden, np.maximum(in_backward + once - backward, 0.0)
                        - np.maximum(in_backward - backward, 0.0), once)
        if rule.post_step_gather_hidden and rule.forward_hidden:   # into the first forward
            after = (np.maximum(gather_f - first + after - forward, 0.0)
                     - np.maximum(gather_f - first - forward, 0.0))
        per_step = last + after
        return _OnStage(forward + backward, tensor, context, expert, pipe, per_mb, per_step)

    first, last = stage_part(np.zeros(b.shape, dtype=np.int64)), stage_part(p - 1)
    # The busier stage per setting: the larger micro-batch time (its per-step part aside).
    pick_last = last.micro_batch > first.micro_batch
    on = _OnStage(**{f.name: np.where(pick_last, getattr(last, f.name), getattr(first, f.name))
                     for f in fields(_OnStage)})
    if uneven is not None:   # a middle stage (the second stands for all) can hold the most layers
        pick = (p > 2) & ((middle := stage_part(np.minimum(1, p - 1))).micro_batch > on.micro_batch)
        on = _OnStage(**{f.name: np.where(pick, getattr(middle, f.name), getattr(on, f.name)) for f in fields(on)})
    micro = on.micro_batch
    return ParallelStepTime(compute=m * on.compute, tensor=m * on.tensor, context=m * on.context,
                            expert=m * on.expert, pipeline=m * on.pipeline,
                            data_parallel=m * on.data_parallel + on.per_step,
                            bubble=(p - 1) / v * micro, micro_batch_seconds=micro)


def _per_degree(config, ic, device, st: ParallelSettings) -> ParallelStepTime:
    """:func:`parallel_step_time` of checked settings whose ``context_parallel`` is an array
    (one degree per setting, :meth:`ParallelSettings.from_checked`): each degree's settings at once."""
    cp = np.broadcast_to(st.context_parallel, st.micro_batch.shape)
    parts = {name: np.zeros(cp.shape) for name in PARTS}
    micro = np.zeros(cp.shape)
    arrays = ("micro_batch", "tensor_parallel", "pipeline_parallel", "data_parallel", "stage",
              "micro_batches", "chunks", "expert_parallel", "sequence_parallel", "recompute",
              "offload", "partition_activations", "cpu_checkpointing", "first_layers", "last_layers")
    etp = st.expert_tensor_parallel
    for degree in np.unique(cp).tolist():
        sel = cp == degree
        extra = {} if etp is None else {
            "expert_tensor_parallel": np.broadcast_to(etp, cp.shape)[sel]}
        sub = ParallelSettings.from_checked(
            seq_len=st.seq_len, layout=st.layout, mfu=st.mfu, element_bytes=st.element_bytes,
            host_link=st.host_link, context_parallel=int(degree), host=st.host, engine=st.engine,
            overlap=st.overlap, capacity_factor=st.capacity_factor,
            flash_attention=st.flash_attention,
            shard_group=None if st.shard_group is None else st.shard_group[sel],
            **{name: np.broadcast_to(getattr(st, name), cp.shape)[sel] for name in arrays},
            **extra)
        times = _step_time(config, ic, device, sub)    # checked once, at the door
        for name in PARTS:
            parts[name][sel] = times.parts[name]
        micro[sel] = times.micro_batch_seconds
    return ParallelStepTime(**parts, micro_batch_seconds=micro)


@lru_cache(maxsize=64)
def _unit_count(config: TransformerConfig) -> int:
    """How many layer units stage 3 gathers (:func:`layer_units`): looked up once per model,
    not once per context-parallel degree."""
    return len(layer_units(config))


def _flags(value, name: str) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype != bool:
        raise TypeError(f"{name} must be True or False (or an array of them), got {echo(value)}")
    return array


def _check_rules(config, t, p, v, m, s, sp, ic, uneven=None):
    """Refuse what :func:`zerolib.core.memory.model_parallel.parallel_rules` refuses, naming the rule."""
    for vv in np.unique(v):
        for flag in (False, True):
            sel = (v == vv) & (sp == flag)
            if not np.any(sel):
                continue
            split = None if uneven is None else tuple(np.broadcast_to(x, sel.shape)[sel] for x in uneven)
            grid = ParallelGrid(config, t[sel], p[sel], None, "interleaved" if vv > 1 else "1f1b",
                                int(vv), m[sel], 1, split)
            rules = rules_of(grid, ic.gpus_per_node, s, bool(flag))
            for name, ok in rules.items():
                if not np.all(ok):
                    raise ValueError(RULES[name])


def _tensor_seconds(config, ic, s, e, b, t, p, r, sp, rec, split=(0, 0)):
    """Seconds of the tensor-parallel collectives per micro-batch on stage r: each row's calls
    x (ring latency + its bytes, proportional to the micro-batch, at the bus bandwidth)."""
    shape, flat_t, flat_b = np.shape(b), np.ravel(t), np.ravel(b)
    calls = {}    # (kind, bytes at micro-batch 1) -> calls per micro-batch of every setting
    first, last = (np.broadcast_to(x, shape) for x in split)
    for (pp, rr, flag, code, ff, ll), rows in setting_groups((p, r, sp.astype(np.int64), rec, first, last)):
        for kind, count, size in _tensor_rows(config, s, pp, rr, bool(flag), RECOMPUTE[code], e, (ff, ll)):
            calls.setdefault((kind, size), np.zeros(flat_t.shape, dtype=np.int64))[rows] += count
    timing = {kind: ring_timing_of(ic, kind, flat_t) for kind in CHUNKS_SENT}   # t checked once
    out = np.zeros(flat_t.shape)
    for (kind, size), count in calls.items():
        latency, bandwidth = timing[kind]
        sent = CHUNKS_SENT[kind] * (flat_t - 1) * ceil_div(size * flat_b, flat_t)
        out += count * (latency + sent / bandwidth)
    return np.where(flat_t > 1, out, 0.0).reshape(shape)


def _context_seconds(config, ic, tokens, e, b, c, t, r, p, rec, split=(0, 0)):
    """Seconds of the ring attention's sends per micro-batch on stage r (``tokens``: s / C):
    each row's calls x one point-to-point message of its K,V block (exactly proportional to the
    micro-batch), across nodes once the ring's t x C GPUs leave one node."""
    if c == 1:
        return np.zeros(np.shape(b))
    k = ic.gpus_per_node
    out = np.zeros(np.size(b))
    crosses = (k is not None) & (np.ravel(t) * c > (k or 0))
    for (tt, pp, rr, code, ff, ll), rows in setting_groups((t, p, r, rec, *np.broadcast_arrays(b, *split)[1:])):
        grid = ParallelGrid(config, tt, pp, rr, "1f1b", 1, 1, 1, (ff, ll))
        for row in context_rows(grid, tokens, 1, c, RECOMPUTE[code], e):
            out[rows] += row.calls * send_seconds(ic, row.tensor_bytes * np.ravel(b)[rows],
                                                  crosses[rows])
    return out.reshape(np.shape(b))


def _pipeline_seconds(config, ic, s, e, b, t, p, d, r, sp, v):
    """Seconds of the point-to-point messages stage r sends per micro-batch."""
    k = ic.gpus_per_node
    count = np.zeros(np.size(b), dtype=np.int64)
    size = np.zeros(np.size(b), dtype=np.int64)
    for (tt, pp, rr, flag, vv), rows in setting_groups((t, p, r, sp.astype(np.int64), v)):
        if pp > 1:
            count[rows], size[rows] = _pipeline_sends(config, s, tt, pp, rr, bool(flag), vv, e)
    crosses = (k is not None) & (np.ravel(t * d * p) > (k or 0))
    out = count * send_seconds(ic, size * np.ravel(b), crosses)
    return out.reshape(np.shape(b))


_BOOL_ARRAYS = ("sequence_parallel", "partition_activations", "cpu_checkpointing")
_BACKWARD = ("backward_all_gather", "gradient_all_reduce", "gradient_reduce_scatter",
             "replica_all_reduce")


def _zero_slots(ic, params, d, t, zero, layout, shard_group, units, p, engine):
    """Seconds per slot of :data:`zerolib.core.step.traffic.GROUP_SLOTS`, one pass of each, and
    whether each runs every micro-batch: bytes and calls of :func:`shard_group_traffic`'s
    traffic as ``engine`` runs it, built from the checked settings by
    :func:`zerolib.core.step.traffic.traffic_of` (the engine's layered stages: one call per
    layer unit of the pipeline stage), each on the ring it uses with the data-parallel ranks t
    apart (:func:`zerolib.core.step.time.schedule_seconds`)."""
    # Settings checked once (shard groups divide d, every ring fits the node of checked_node).
    traffic = traffic_of(np.asarray(params, dtype=np.int64), d, zero, layout, shard_group,
                         placement_on(checked_node(d)), engine)
    layered = np.isin(zero, engine.layered_stages)
    calls = {name: (count if name == "gradient_all_reduce"
                    else np.where(layered & (count > 0), units, count))
             for name, count in traffic.calls.items()}
    seconds, _ = schedule_seconds(traffic, ic, spacing=t, calls=calls)
    return seconds, traffic.every_micro_batch
