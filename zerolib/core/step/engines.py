"""The engines that run ZeRO, as named conventions: which collectives each runs per micro-batch
and per step, what it overlaps, which stages it offers and which of them run beside a pipeline.

The ZeRO paper states one schedule; the libraries that implement it each make their own choices,
and those choices move bytes and time:

- ``paper``: the ZeRO paper's schedule (Rajbhandari et al., SC20, Sec. VII): stages 1-2
  reduce-scatter the gradients and all-gather the updated parameters (2 Psi), stage 3 gathers
  each layer before its forward and its backward and reduce-scatters its gradients (3 Psi);
  every collective overlaps the compute of its pass but the post-step all-gather.
- ``deepspeed``: DeepSpeed 0.19.8 at its defaults. Stages 1-2 **all-reduce** each gradient
  bucket and keep their own partition (``reduce_scatter=True`` with
  ``use_multi_rank_bucket_allreduce=True`` in ``stage_1_and_2.py`` ``average_tensor``; with
  ``reduce_scatter=False`` ``gradient_reduction_w_predivide`` all-reduces the bucket too), then
  all-gather the updated parameters: about 3 Psi (``data/communication.md``,
  ``bucket-all-reduce``). ``overlap_comm`` defaults to stage 3 only (``runtime/zero/config.py``
  ``overlap_comm_valid``), so stages 1-2 reduce on the compute stream; stages 0 and 1 reduce
  after the backward pass, at the accumulation boundary (``runtime/engine.py``
  ``allreduce_gradients``), so nothing hides them either. Buckets of ``reduce_bucket_size`` and
  ``allgather_bucket_size`` (5 x 10^8 elements each) set the calls. ZeRO-2/3 are refused with a
  pipeline (``runtime/pipe/engine.py``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
  parallelism").
- ``fsdp2``: PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``, PyTorch 2.13):
  ``reshard_after_forward=True`` is stage 3, ``False`` stage 2 (each layer gathered before its
  forward and kept to its backward, gradients reduce-scattered per layer); no stage 1; stage 0 is
  DDP. Hybrid sharding (a 2-D mesh) is the shard group. Reduce-scatters run on their own stream
  and the next layer's all-gather is prefetched, so they overlap compute. It composes with
  pipeline parallelism (torchtitan's 4-D parallelism, ``torchtitan/distributed/
  parallel_dims.py``, ``pipelining`` over FSDP2-wrapped stages).
- ``torchtitan``: FSDP2 as torchtitan runs it (``apply_fsdp``: per TransformerBlock and on the
  root, bf16 parameters, fp32 reduction): FSDP2's collectives; its memory convention
  (:mod:`zerolib.core.memory.conventions`) is torchtitan's own.
- ``megatron``: Megatron-LM's distributed optimizer (``--use-distributed-optimizer``,
  ``megatron/core/distributed/param_and_grad_buffer.py``, core 0.x): stage 1, the gradients
  reduce-scattered bucket by bucket and the updated parameters all-gathered; overlapping only
  with ``--overlap-grad-reduce`` and ``--overlap-param-gather`` (both off by default); composes
  with tensor and pipeline parallelism; no stage 2 or 3.

**Context parallelism** (ring attention, the sequence split over C GPUs): Megatron-LM
(``--context-parallel-size``, TransformerEngine's p2p ring) and FSDP2 with torchtitan
(``context_parallel`` over a dp_shard x cp mesh) run it, ZeRO sharding over d x C in both.
DeepSpeed 0.19.8 splits sequences with DeepSpeed-Ulysses (``deepspeed/sequence/layer.py``
``DistributedAttention``: an all-to-all over the heads, another scheme, not modelled here); the
paper's schedule has none.

**Gradient accumulation** (m micro-batches per step). Stages 0-1 synchronise only at the last
micro-batch (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync(False)``, DeepSpeed's stage 1
reduces at the accumulation boundary, Megatron's grad buffer at the last micro-batch); stage 2
reduces every micro-batch (DeepSpeed's hooks fire "during non gradient accumulation boundaries
as well", ``engine.py`` ``allreduce_gradients``; FSDP2 with a sharded gradient); stage 3
gathers parameters before each micro-batch's forward and backward and reduce-scatters every
micro-batch. Per step: (m + 1) Psi for the paper's stage 2, 3 m Psi for stage 3; FSDP2's
stage 2 gathers before each forward too: 2 m Psi. Under DeepSpeed stage 2 all-reduces every
micro-batch: (2 m + 1) Psi.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from zerolib.core.defaults import DEFAULT_ENGINE, ENGINE_NAMES  # noqa: F401
from zerolib.core.inputs import check_flag

# When a collective runs, per slot of zerolib.core.step.traffic.GROUP_SLOTS.
EVERY_MICRO_BATCH = "every micro-batch"
LAST_MICRO_BATCH = "last micro-batch"
AFTER_STEP = "after the optimizer step"


@dataclass(frozen=True)
class Overlap:
    """What a step's collectives hide behind (the stated overlap rule).

    ``backward_hidden``: the stages whose backward collectives (gradient reductions, stage 3's
    backward gathers) overlap the backward compute; at the others they add to the step.
    ``forward_hidden``: whether stage 3's (FSDP2: stage 2's) forward gathers overlap the
    forward (prefetch). ``post_step_gather_hidden``: whether stages 1-2's all-gather of the
    updated parameters overlaps the next forward pass (the Ultra-Scale Playbook's description)
    rather than waiting before it (DeepSpeed). ``first_gather_exposed``: the first layer's
    gather of each micro-batch has no compute before it. ``latency_exposed``: every call's ring
    latency is charged to the step even where its bytes hide."""

    name: str
    backward_hidden: tuple[int, ...] = (0, 1, 2, 3)
    forward_hidden: bool = True
    post_step_gather_hidden: bool = False
    first_gather_exposed: bool = False
    latency_exposed: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty string, got {self.name!r}")
        hidden = tuple(self.backward_hidden)
        if any(stage not in (0, 1, 2, 3) for stage in hidden):
            raise ValueError(f"backward_hidden must hold stages 0-3, got {self.backward_hidden!r}")
        object.__setattr__(self, "backward_hidden", tuple(sorted(set(hidden))))
        for flag in ("forward_hidden", "post_step_gather_hidden", "first_gather_exposed",
                     "latency_exposed"):
            check_flag(getattr(self, flag), flag)

    def as_dict(self) -> dict:
        return {"name": self.name, "backward_hidden": list(self.backward_hidden),
                "forward_hidden": self.forward_hidden,
                "post_step_gather_hidden": self.post_step_gather_hidden,
                "first_gather_exposed": self.first_gather_exposed,
                "latency_exposed": self.latency_exposed}


@dataclass(frozen=True)
class Engine:
    """One engine's convention (see the module doc). ``sources`` cite each stated behaviour
    (file and function, version)."""

    name: str
    label: str
    version: str
    stages: tuple[int, ...]                   # the ZeRO stages it offers
    pipeline_stages: tuple[int, ...]          # those it runs beside pipeline parallelism
    group_stages: tuple[int, ...]             # those that take a shard group smaller than d
    zeropp: bool                              # ZeRO++ (hpZ, qwZ, qgZ) offered
    all_reduce_stages: tuple[int, ...] = ()   # stages 1-2 that all-reduce each gradient bucket
    layered_stages: tuple[int, ...] = (3,)    # stages that gather and reduce layer by layer
    forward_gather_stages: tuple[int, ...] = (3,)   # gather each layer before every forward
    every_micro_batch: tuple[int, ...] = (2, 3)     # stages that reduce every micro-batch
    context_parallel: bool = False            # runs ring-attention context parallelism
    reduce_bucket: int | None = None          # stages 0-2's gradient buckets (None: one call)
    gather_bucket: int | None = None          # stages 1-2's all-gather shards (None: one call)
    overlap: Overlap = field(default_factory=lambda: Overlap("paper"))
    flags: Mapping[str, object] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def __deepcopy__(self, memo) -> Engine:
        return self  # immutable

    def offers(self, stage: int) -> bool:
        return stage in self.stages

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "version": self.version,
                "stages": list(self.stages), "pipeline_stages": list(self.pipeline_stages),
                "shard_group_stages": list(self.group_stages), "zeropp": self.zeropp,
                "gradient_all_reduce_stages": list(self.all_reduce_stages),
                "context_parallel": self.context_parallel,
                "flags": dict(self.flags), "overlap": self.overlap.as_dict()}

    def with_flags(self, **flags) -> Engine:
        """DeepSpeed's engine under other flags (``reduce_scatter``, ``overlap_comm``,
        ``use_multi_rank_bucket_allreduce``, ``contiguous_gradients``, ``reduce_bucket_size``);
        Megatron's under ``overlap_grad_reduce`` / ``overlap_param_gather``."""
        if self.name == "deepspeed":
            return deepspeed_engine(**{**self.flags, **flags})
        if self.name == "megatron":
            return megatron_engine(**{**self.flags, **flags})
        if flags:
            raise ValueError(f"engine {self.name} takes no flags, got {', '.join(flags)}")
        return self


DEEPSPEED_DEFAULTS = MappingProxyType({
    "reduce_scatter": True, "use_multi_rank_bucket_allreduce": True, "overlap_comm": None,
    "contiguous_gradients": True, "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000})
MEGATRON_DEFAULTS = MappingProxyType({"overlap_grad_reduce": False, "overlap_param_gather": False})

_DS = "DeepSpeed 0.19.8"
DEEPSPEED_SOURCES = MappingProxyType({
    "stages 1-2 all-reduce each gradient bucket": f"deepspeed/runtime/zero/stage_1_and_2.py "
    f"average_tensor (use_multi_rank_bucket_allreduce=True), allreduce_bucket; {_DS}",
    "stages 1-2 all-gather the updated partitions": f"deepspeed/runtime/zero/stage_1_and_2.py "
    f"step, all_gather_dp_groups (allgather_bucket_size); {_DS}",
    "overlap_comm defaults to stage 3 only": f"deepspeed/runtime/zero/config.py "
    f"DeepSpeedZeroConfig.overlap_comm_valid; {_DS}",
    "stages 0-1 reduce at the accumulation boundary, after the backward": f"deepspeed/runtime/"
    f"engine.py DeepSpeedEngine.allreduce_gradients, buffered_allreduce_fallback; {_DS}",
    "stage 2 reduces every micro-batch": f"deepspeed/runtime/zero/stage_1_and_2.py "
    f"reduce_independent_p_g_buckets_and_remove_grads (gradient hooks); {_DS}",
    "stage 3 gathers per layer and reduce-scatters every micro-batch": f"deepspeed/runtime/zero/"
    f"partitioned_param_coordinator.py fetch_sub_module, stage3.py reduce_ipg_grads; {_DS}",
    "ZeRO-2/3 refused with a pipeline": f"deepspeed/runtime/pipe/engine.py PipelineEngine.__init__; "
    f"{_DS}",
    "no ring-attention context parallelism (Ulysses' all-to-all instead, not modelled)":
    f"deepspeed/sequence/layer.py DistributedAttention; {_DS}",
})
FSDP2_SOURCES = MappingProxyType({
    "reshard_after_forward True = stage 3, False = stage 2": "torch/distributed/fsdp/_fully_shard/"
    "_fully_shard.py fully_shard (reshard_after_forward); PyTorch 2.13",
    "hybrid sharding: reduce-scatter in the group, all-reduce across replicas": "torch/"
    "distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce; PyTorch 2.13",
    "stages 0-1 skip synchronisation until the last micro-batch": "FSDPModule."
    "set_requires_gradient_sync; DDP no_sync; PyTorch 2.13",
    "prefetched gathers, reduce-scatter on its own stream": "torch/distributed/fsdp/_fully_shard/"
    "_fsdp_param_group.py FSDPParamGroup (all_gather_stream, reduce_scatter_stream); PyTorch 2.13",
    "composes with pipeline parallelism": "torchtitan/distributed/parallel_dims.py and "
    "torchtitan/models/llama3/infra/parallelize.py (FSDP2 inside pipeline stages)",
    "context parallelism: ring attention, FSDP over dp_shard x cp": "torch/distributed/tensor/"
    "experimental/_context_parallel/_attention.py context_parallel (ring attention); "
    "torchtitan/distributed/parallel_dims.py (the dp_shard_cp mesh); PyTorch 2.13",
})
MEGATRON_SOURCES = MappingProxyType({
    "distributed optimizer = stage 1: reduce-scatter + all-gather": "megatron/core/distributed/"
    "param_and_grad_buffer.py _ParamAndGradBucketGroup.start_grad_sync, start_param_sync; "
    "docs/source/api-guide/dist_optimizer.md; Megatron-LM core 0.x",
    "--overlap-grad-reduce, --overlap-param-gather (off by default)": "megatron/training/"
    "arguments.py _add_distributed_args; megatron/core/distributed/distributed_data_parallel_"
    "config.py DistributedDataParallelConfig",
    "gradients reduced at the last micro-batch": "megatron/core/distributed/"
    "distributed_data_parallel.py DistributedDataParallel.no_sync",
    "composes with tensor and pipeline parallelism": "megatron/core/parallel_state.py "
    "initialize_model_parallel",
    "context parallelism: --context-parallel-size, ring attention": "megatron/training/"
    "arguments.py _add_distributed_args; megatron/core/parallel_state.py "
    "initialize_model_parallel (data_parallel_group with_context_parallel); TransformerEngine's "
    "AttnFuncWithCPAndKVP2P (cp_comm_type p2p)",
})
PAPER_SOURCES = MappingProxyType({
    "stages 1-2: reduce-scatter + all-gather, 2 Psi": "Rajbhandari et al., ZeRO, SC20, Sec. VII-B1",
    "stage 3: 3 Psi": "Rajbhandari et al., ZeRO, SC20, Sec. VII-B2",
})


def deepspeed_engine(reduce_scatter: bool = True, use_multi_rank_bucket_allreduce: bool = True,
                     overlap_comm: bool | None = None, contiguous_gradients: bool = True,
                     reduce_bucket_size: int = 500_000_000,
                     allgather_bucket_size: int = 500_000_000) -> Engine:
    """DeepSpeed 0.19.8 under these ``zero_optimization`` flags (its defaults by default).

    ``reduce_scatter=False`` all-reduces each bucket (as the default does, through
    ``use_multi_rank_bucket_allreduce``); ``reduce_scatter=True`` with
    ``use_multi_rank_bucket_allreduce=False`` reduces each bucket slice to its owner, a
    reduce-scatter's bytes. ``overlap_comm`` (None: stage 3 only, DeepSpeed's rule) makes the
    stage-2 reduction overlap the backward pass; stages 0-1 reduce after the backward whatever
    it says. ``contiguous_gradients`` changes memory, not traffic. The bucket sizes set the
    calls of stages 0-2."""
    for name, value in (("reduce_scatter", reduce_scatter),
                        ("use_multi_rank_bucket_allreduce", use_multi_rank_bucket_allreduce),
                        ("contiguous_gradients", contiguous_gradients)):
        check_flag(value, name)
    if overlap_comm is not None:
        check_flag(overlap_comm, "overlap_comm")
    for name, value in (("reduce_bucket_size", reduce_bucket_size),
                        ("allgather_bucket_size", allgather_bucket_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of elements above 0, got {value!r}")
    all_reduce = (1, 2) if (not reduce_scatter or use_multi_rank_bucket_allreduce) else ()
    hidden = (3,) if overlap_comm is None else ((2, 3) if overlap_comm else ())
    flags = {"reduce_scatter": reduce_scatter,
             "use_multi_rank_bucket_allreduce": use_multi_rank_bucket_allreduce,
             "overlap_comm": overlap_comm, "contiguous_gradients": contiguous_gradients,
             "reduce_bucket_size": reduce_bucket_size,
             "allgather_bucket_size": allgather_bucket_size}
    name = "deepspeed" + ("" if flags == dict(DEEPSPEED_DEFAULTS) else " (flags)")
    return Engine(
        "deepspeed", "DeepSpeed 0.19.8", "0.19.8", stages=(0, 1, 2, 3), pipeline_stages=(0, 1),
        group_stages=(3,), zeropp=True, all_reduce_stages=all_reduce,
        reduce_bucket=reduce_bucket_size, gather_bucket=allgather_bucket_size,
        overlap=Overlap(name, backward_hidden=hidden, first_gather_exposed=True),
        flags=MappingProxyType(flags), sources=DEEPSPEED_SOURCES)


def megatron_engine(overlap_grad_reduce: bool = False, overlap_param_gather: bool = False) -> Engine:
    """Megatron-LM's distributed optimizer under ``--overlap-grad-reduce`` and
    ``--overlap-param-gather`` (Megatron refuses the second without the first)."""
    check_flag(overlap_grad_reduce, "overlap_grad_reduce")
    check_flag(overlap_param_gather, "overlap_param_gather")
    if overlap_param_gather and not overlap_grad_reduce:
        raise ValueError("overlap_param_gather needs overlap_grad_reduce (Megatron-LM's rule)")
    flags = {"overlap_grad_reduce": overlap_grad_reduce, "overlap_param_gather": overlap_param_gather}
    name = "megatron" + ("" if flags == dict(MEGATRON_DEFAULTS) else " (flags)")
    return Engine(
        "megatron", "Megatron-LM distributed optimizer", "core 0.x", stages=(0, 1),
        pipeline_stages=(0, 1), group_stages=(), zeropp=False, context_parallel=True,
        overlap=Overlap(name, backward_hidden=(0, 1) if overlap_grad_reduce else (),
                        post_step_gather_hidden=overlap_param_gather),
        flags=MappingProxyType(flags), sources=MEGATRON_SOURCES)


PAPER = Engine("paper", "the ZeRO paper's schedule", "SC20", stages=(0, 1, 2, 3),
               pipeline_stages=(0, 1), group_stages=(1, 2, 3), zeropp=True,
               overlap=Overlap("paper"), sources=PAPER_SOURCES)
FSDP2 = Engine("fsdp2", "PyTorch FSDP2", "2.13", stages=(0, 2, 3), pipeline_stages=(0, 2, 3),
               group_stages=(2, 3), zeropp=False, context_parallel=True, layered_stages=(2, 3),
               forward_gather_stages=(2, 3),
               overlap=Overlap("fsdp2", first_gather_exposed=True), sources=FSDP2_SOURCES)
# torchtitan runs FSDP2 (its collectives, stages and overlap are FSDP2's); its memory convention
# is its own (zerolib.core.memory.conventions: its loss, op-level checkpointing, reserved peak).
TORCHTITAN = replace(FSDP2, name="torchtitan", label="torchtitan (FSDP2)", version="b5bcd76c",
                     overlap=Overlap("torchtitan", first_gather_exposed=True),
                     sources=MappingProxyType({
                         **FSDP2_SOURCES,
                         "FSDP2 per TransformerBlock and on the root, bf16 parameters, fp32 "
                         "reduction": "torchtitan/models/llama3/infra/parallelize.py apply_fsdp; "
                         "pytorch/torchtitan at b5bcd76c"}))
ENGINES: Mapping[str, Engine] = MappingProxyType({
    "paper": PAPER, "deepspeed": deepspeed_engine(), "fsdp2": FSDP2, "megatron": megatron_engine(),
    "torchtitan": TORCHTITAN})
# The engines that run ring-attention context parallelism (Engine.context_parallel).
CONTEXT_PARALLEL_ENGINES = tuple(name for name, e in ENGINES.items() if e.context_parallel)


def get_engine(engine: str | Engine = DEFAULT_ENGINE, name: str = "engine") -> Engine:
    """The engine called ``engine`` (or ``engine`` itself)."""
    if isinstance(engine, Engine):
        return engine
    if not isinstance(engine, str):
        raise TypeError(f"{name} must be one of {', '.join(ENGINE_NAMES)}, got {engine!r}")
    key = engine.strip().lower()
    if key not in ENGINES:
        raise ValueError(f"{name} must be one of {', '.join(ENGINE_NAMES)}, got {engine!r}")
    return ENGINES[key]


def check_overlap(overlap) -> Overlap | None:
    """An :class:`Overlap` or None (the engine's own rule)."""
    if overlap is not None and not isinstance(overlap, Overlap):
        raise TypeError(f"overlap must be an Overlap or None, got {type(overlap).__name__}")
    return overlap


def check_engine_stage(engine: Engine, stages, pipeline_parallel: int = 1) -> None:
    """Refuse a stage the engine does not offer, or runs beside no pipeline."""
    for stage in stages:
        stage = int(stage)
        if stage not in engine.stages:
            raise ValueError(f"engine {engine.name} offers ZeRO stages "
                             f"{', '.join(map(str, engine.stages))}, got stage {stage}")
        if pipeline_parallel > 1 and stage not in engine.pipeline_stages:
            raise ValueError(f"engine {engine.name} runs ZeRO stages "
                             f"{', '.join(map(str, engine.pipeline_stages))} with pipeline "
                             f"parallelism, got stage {stage} with pipeline_parallel "
                             f"{pipeline_parallel}")


# --- the overlap rules shown as a sensitivity ---------------------------------------------------

def overlap_rules(engine: Engine) -> Mapping[str, Overlap]:
    """The engine's own rule and the variations the step time is shown under: everything in
    each pass hidden (the paper's rule), the post-step all-gather hidden behind the next
    forward (the Ultra-Scale Playbook), the first gather exposed, every call's latency
    charged, and nothing hidden."""
    own = engine.overlap
    return MappingProxyType({
        "engine": own,
        "all hidden": Overlap("all hidden"),
        "post-step gather hidden": replace(own, name="post-step gather hidden",
                                           post_step_gather_hidden=True),
        "first gather exposed": replace(own, name="first gather exposed",
                                        first_gather_exposed=True),
        "latency charged": replace(own, name="latency charged", latency_exposed=True),
        "nothing hidden": Overlap("nothing hidden", backward_hidden=(), forward_hidden=False),
    })


def when(engine: Engine, slot_name: str, stage: int) -> str:
    """When in a step of several micro-batches ``slot_name`` runs at ``stage``: every micro-batch,
    at the last one only, or after the optimizer step."""
    if slot_name == "parameter_all_gather":
        return AFTER_STEP
    if slot_name in ("forward_all_gather", "backward_all_gather"):
        return EVERY_MICRO_BATCH
    if slot_name == "replica_all_reduce":   # HSDP / MiCS: once, at the boundary
        return LAST_MICRO_BATCH
    return EVERY_MICRO_BATCH if stage in engine.every_micro_batch else LAST_MICRO_BATCH
