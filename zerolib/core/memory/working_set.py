"""The second layer of the capacity worksheet: the peak working set on top of model state.

    peak per worker = persistent model state (zerolib.core.memory.accounting.model_state) + working set

Every working-set term is bytes on one worker (the most-loaded one) for one ZeRO stage, and
each names its assumption:

``activations``
    What the forward pass saves for backward, Korthikanti et al. (MLSys 2023) term by term
    (:mod:`zerolib.core.memory.activations`): all layers, the layer being recomputed (if any), the
    embedding's dropout mask, the final norm's and output projection's inputs.
``logits_loss``
    The vocabulary x sequence x micro-batch logits in the element size plus their fp32 copy for
    the loss (``WorkingSetSettings.logits_bytes`` changes the widths).
``ddp_buckets`` (stage 0)
    PyTorch DistributedDataParallel's gradient buckets. With its default
    ``gradient_as_bucket_view=False`` the buckets (``bucket_cap_mb=25`` MiB each by default,
    torch.nn.parallel.DistributedDataParallel) together hold a second copy of every gradient, so
    the term is the whole gradient size; PyTorch PR #41954 ("Make grad point to bucket buffer in
    DDP to save memory usage") measured that copy. With ``ddp_gradient_as_bucket_view=True`` the
    gradients are views into the buckets and the term is 0. The bucket size changes how many
    buckets there are, not their total, so it does not enter the sum.
``reduce_bucket`` (stages 1-3)
    DeepSpeed's contiguous gradient bucket: ``torch.empty(reduce_bucket_size)`` in the gradient
    dtype, allocated whole whatever the model size (stage_1_and_2.py ``setup_buckets``,
    stage3.py ``__init__``, DeepSpeed 0.19.8), doubled under ``overlap_comm`` in stages 1-2
    (DeepSpeed's default there is off; it is on for stage 3, which still keeps one buffer).
    Default ``reduce_bucket_size`` = 5e8 elements (:data:`REDUCE_BUCKET_SIZE`).
``allgather_bucket`` (stages 1-2)
    DeepSpeed 0.19.8 all-gathers the updated 16-bit parameters in place, into its flat
    parameter buffer (runtime/utils.py ``all_gather_dp_groups`` -> ``all_gather_into_tensor``),
    so ``allgather_bucket_size`` (default 5e8 elements) only sets the shard size and the term
    is 0. ``allgather_in_place=False`` counts one staging bucket of that many elements (capped
    at the model) in the parameter dtype, for an engine that stages it.
``gathered_parameters`` (stage 3)
    The 16-bit parameters gathered for computation. DeepSpeed's PartitionedParameterCoordinator
    always gathers the module it runs, prefetches up to ``stage3_prefetch_bucket_size`` (5e7)
    more elements while fewer than ``stage3_max_live_parameters`` (1e9) are available, and keeps
    parameters due again within ``stage3_max_reuse_distance`` (1e9). Bound used here:
    ``min(model, max(max_live_parameters, largest_layer + prefetch_bucket_size))`` elements in
    the parameter width. Small parameters kept whole under ``stage3_param_persistence_threshold``
    (1e5 elements: norms, biases) are left out (a few hundred thousand elements).
``reserve``
    A fixed allowance for the CUDA context, NCCL communicators, the allocator's cache and
    fragmentation. 2 GiB by default: a round assumption, not a measurement; change it.

Summing all terms treats them as live at one moment, as they are when the backward begins (DDP's
buckets from when DDP wraps the model); only a staged all-gather bucket waits for the optimizer
step (:mod:`zerolib.core.memory.step_memory` lays them out in time). The logits' gradient, as
large as the logits, is not counted (zerolib.core.memory.activations): the sum is a close
estimate, not a guaranteed upper bound.

Bounds: every quantity has an upper bound (:data:`MAX_SEQ_LEN`, :data:`MAX_MICRO_BATCH`,
:data:`MAX_ELEMENTS` for bucket sizes, :data:`zerolib.core.inputs.MAX_BYTES` for the reserve and
for the working set's total), so every result is an exact int64; beyond them a ``ValueError``
names the quantity.

Where the state lives: :func:`peaks`, :func:`peak` and :func:`stage_rows` take a
``placement`` (:class:`zerolib.core.memory.placement.Placement`: a shard group, ZeRO++'s hpZ copy,
offload to CPU memory or NVMe). The persistent part of the peak is then the GPU tier only, each
:class:`Peak` carries every tier's bytes, and :func:`stage_rows` judges the host tier too: the
CPU memory a node's GPUs offload into against ``host_memory`` bytes per node. The searches
(:func:`fewest_gpus_for_peak`, :func:`largest_micro_batch`) do not take a placement.

Tensor and pipeline parallelism: with ``tensor_parallel`` = t and ``pipeline_parallel`` = p the
``gpus`` of a setting are t x p x (gpus / (t p))-way data parallel. One GPU holds its exact share
of the parameters (:func:`zerolib.core.memory.model_parallel.parameters_per_gpu`: split matrices,
replicated norms and row-parallel biases, its pipeline stage's layers, the embedding on the
first stage and the output layer on the last) and the activations its stage keeps in flight
(:func:`zerolib.core.memory.pipeline_schedule.stage_activation_terms`, 1F1B or interleaved); ZeRO
partitions that GPU's model state across the data-parallel group. The peak is taken over the
first and the last pipeline stage, whichever is larger (``Peak.pipeline_stage`` says which);
with t = p = 1 every number is the plain data-parallel one.

Context parallelism (``context_parallel`` = C): the ``gpus`` are t x C x p x d, ranks placed in
Megatron-LM's order tp-cp-ep-dp-pp. A GPU keeps the activations of s / C tokens of each sequence
(:func:`zerolib.core.memory.activations.context_parallel_tokens`; C needs flash attention and s a
multiple of 2C) and the parameters of its tensor and pipeline shard, the same on every CP rank;
ZeRO shards the model state over the d x C GPUs of the data- and context-parallel group, as the
engines do: Megatron-LM's distributed optimizer over ``get_data_parallel_group(
with_context_parallel=True)``, torchtitan's FSDP2 over its ``dp_shard_cp`` mesh, DeepSpeed over
the data-parallel group that holds its sequence-parallel ranks. So the ZeRO group is still
gpus / (t p).

ZeRO-R (Rajbhandari et al., SC20, Sec. VI): ``partition_activations`` (P_a) splits each layer's
activation checkpoint over the t tensor-parallel ranks and ``cpu_checkpointing`` (P_a+cpu) moves
it to host memory (:func:`zerolib.core.memory.activations.checkpoint_terms`; both need full
recomputation, both off by default, as DeepSpeed's ``activation_checkpointing`` config has them).
Constant-size buffers (C_B, Sec. VI-B) are what ``reduce_bucket`` already is: a buffer of
``reduce_bucket_size`` elements whatever the model, where a fused buffer of every gradient would
grow with it (the paper's Sec. III-B: a flattened fp32 buffer of a 1.5B-parameter model takes
6 GB); ``reduce_bucket_size`` = the parameters gives the unbounded case. Memory defragmentation
(M_D, Sec. VI-C: DeepSpeed's ``contiguous_memory_optimization`` copies checkpoints and
gradients into pre-allocated contiguous buffers) adds no bytes: it lets the allocator find the
bytes counted here in one piece, which is what the ``reserve`` stands in for.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from types import MappingProxyType

import numpy as np

from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.catalogue.models import TransformerConfig, get_model
from zerolib.core.defaults import (  # noqa: F401 (where callers find them)
    ALLGATHER_BUCKET_SIZE,
    DEFAULT_RESERVE,
    MAX_MICRO_BATCH,
    MAX_SEQ_LEN,
    REDUCE_BUCKET_SIZE,
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_PARAM_PERSISTENCE_THRESHOLD,
    STAGE3_PREFETCH_BUCKET_SIZE,
    TERMS,
)
from zerolib.core.inputs import (
    MAX_BYTES,
    MAX_ELEMENTS,
    MAX_GPUS,
    check_count,
    check_flag,
    check_gpus,
    check_positive_int,
    check_single,
    check_stage,
)
from zerolib.core.intmath import ceil_div, last_true
from zerolib.core.memory import trainer_peak as trainer
from zerolib.core.memory.accounting import CATEGORIES, STAGES, Layout, ModelState, get_layout
from zerolib.core.memory.activations import (
    MAX_CONTEXT_PARALLEL,
    MAX_ELEMENT_BYTES,
    RECOMPUTE,
    ActivationOptions,
    check_capacity_factor,
    check_expert_tensor_parallel,
    checkpoint_terms_of,
    context_parallel_tokens,
)
from zerolib.core.memory.conventions import RESERVED_PPM, MemoryConvention, memory_convention
from zerolib.core.memory.feasibility import fewest_gpus
from zerolib.core.memory.model_parallel import (
    MAX_CHUNKS,
    MAX_MICRO_BATCHES,
    SCHEDULES,
    ParallelGrid,
    Pipeline,
    candidate_stages,
    check_first_last,
    check_parallel,
    largest_module_on,
    parameters_on,
)
from zerolib.core.memory.pipeline_schedule import stage_rules, stage_terms_of, unit_terms, with_split
from zerolib.core.memory.placement import Placement, check_placement, place


@dataclass(frozen=True)
class WorkingSetSettings:
    """How the model is run: the inputs of the working set (sizes in elements, bytes where named)."""

    seq_len: int = 4096
    micro_batch: int = 1
    recompute: str = "none"             # "none" | "selective" | "full"
    flash_attention: bool = True        # fused attention: no s x s scores stored
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    pipeline_parallel: int = 1
    pipeline_schedule: str = "1f1b"     # "1f1b" | "interleaved"
    pipeline_chunks: int = 1            # model chunks per pipeline stage (interleaved: 2 or more)
    micro_batches: int | None = None    # per step and pipeline; None: enough to fill the pipeline
    element_bytes: int = 2              # 16-bit activations
    mask_bytes: int = 1                 # dropout masks, 1 byte per element (PyTorch bool)
    dropout: bool | None = None       # None: the model's own (GPT-2 yes, Llama family no)
    logits_bytes: tuple[int, ...] | None = None  # None: (element_bytes, 4)
    reduce_bucket_size: int = REDUCE_BUCKET_SIZE
    overlap_comm: bool = False          # stages 1-2 double the reduce bucket when on
    allgather_bucket_size: int = ALLGATHER_BUCKET_SIZE
    allgather_in_place: bool = True     # DeepSpeed 0.19.8 gathers into its flat buffer
    prefetch_bucket_size: int = STAGE3_PREFETCH_BUCKET_SIZE
    max_live_parameters: int = STAGE3_MAX_LIVE_PARAMETERS
    ddp_gradient_as_bucket_view: bool = False  # PyTorch's default
    reserve_bytes: int = DEFAULT_RESERVE
    # A mixture of experts' token buffers: None is dropless routing (each expert holds exactly
    # the tokens routed to it, as transformers runs Mixtral); c gives each of the E experts
    # ceil(c x k x s x b / E) slots (zerolib.core.memory.activations).
    capacity_factor: float | None = None
    # Expert tensor parallelism: each routed expert split over ETP ranks (None: tensor_parallel),
    # which changes the rows the experts gather (zerolib.core.memory.activations).
    expert_tensor_parallel: int | None = None
    # Context parallelism: C ranks share each sequence (Megatron-LM's --context-parallel-size).
    context_parallel: int = 1
    # ZeRO-R's P_a and P_a+cpu (DeepSpeed activation_checkpointing: partition_activations,
    # cpu_checkpointing), under full recomputation; off by default as in DeepSpeed.
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    # Whose memory convention (zerolib.core.memory.conventions), and what the trainer's code
    # changes (ActivationOptions, zerolib.core.memory.trainer_peak.memory_options).
    engine: str = "paper"
    norms: str = "fused"
    fp8: bool = False
    fp8_all_gather: bool = False
    compile: bool = False
    recompute_method: str = "uniform"
    recompute_layers: int = 1
    loss: str | None = None
    loss_chunks: int = 8
    logits_freed: bool | None = None
    # The caching allocator's reserve over the allocated peak, parts per million (fitted).
    reserved_ppm: int = RESERVED_PPM
    # Uneven pipeline stages (FIRST, LAST; zerolib.core.memory.pipeline_stages); None: even.
    pipeline_layers: tuple[int, int] | None = None
    reshard_after_forward: bool | None = None   # FSDP2's (None: the engine's default)

    def __post_init__(self):
        check_positive_int(self.seq_len, "seq_len", MAX_SEQ_LEN)
        check_positive_int(self.micro_batch, "micro_batch", MAX_MICRO_BATCH)
        check_positive_int(self.tensor_parallel, "tensor_parallel", MAX_GPUS)
        check_positive_int(self.pipeline_parallel, "pipeline_parallel", MAX_GPUS)
        if self.pipeline_schedule not in SCHEDULES:
            raise ValueError(f"pipeline_schedule must be one of {', '.join(SCHEDULES)}, "
                             f"got {self.pipeline_schedule!r}")
        check_positive_int(self.pipeline_chunks, "pipeline_chunks", MAX_CHUNKS)
        if self.micro_batches is not None:
            check_positive_int(self.micro_batches, "micro_batches", MAX_MICRO_BATCHES)
        check_positive_int(self.element_bytes, "element_bytes", MAX_ELEMENT_BYTES)
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        for name in ("flash_attention", "sequence_parallel", "overlap_comm", "allgather_in_place",
                     "ddp_gradient_as_bucket_view"):
            check_flag(getattr(self, name), name)
        if self.dropout is not None:
            check_flag(self.dropout, "dropout")
        check_count(self.mask_bytes, "mask_bytes", MAX_ELEMENT_BYTES)
        for name in ("reduce_bucket_size", "allgather_bucket_size", "prefetch_bucket_size",
                     "max_live_parameters"):
            check_count(getattr(self, name), name, MAX_ELEMENTS)
        check_count(self.reserve_bytes, "reserve_bytes", MAX_BYTES)
        if self.logits_bytes is not None:
            object.__setattr__(self, "logits_bytes", tuple(self.logits_bytes))
            for width in self.logits_bytes:
                check_positive_int(width, "logits_bytes entry", MAX_ELEMENT_BYTES)
        if self.capacity_factor is not None:
            object.__setattr__(self, "capacity_factor", check_capacity_factor(self.capacity_factor))
        if self.expert_tensor_parallel is not None:
            check_positive_int(self.expert_tensor_parallel, "expert_tensor_parallel", MAX_GPUS)
        object.__setattr__(self, "context_parallel", check_positive_int(
            self.context_parallel, "context_parallel", MAX_CONTEXT_PARALLEL))
        context_parallel_tokens(self.seq_len, self.context_parallel)
        if self.context_parallel > 1 and not self.flash_attention:
            raise ValueError("context_parallel above 1 needs flash_attention: ring attention runs "
                             "on fused attention kernels (TransformerEngine), which store no s x s scores")
        for name in ("partition_activations", "cpu_checkpointing"):
            if check_flag(getattr(self, name), name) and self.recompute != "full":
                raise ValueError(f"{name} applies to activation checkpoints: it needs "
                                 f"recompute='full', got {self.recompute!r}")
        trainer.check_memory(self)
        if self.pipeline_layers is not None:
            object.__setattr__(self, "pipeline_layers", check_first_last(self.pipeline_layers))

    def __deepcopy__(self, memo) -> WorkingSetSettings:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    @property
    def convention(self) -> MemoryConvention:
        """The engine's memory convention."""
        return memory_convention(self.engine)

    @cached_property
    def activation_options(self) -> ActivationOptions:
        """How this run keeps its activations (the options of
        :mod:`zerolib.core.memory.activations`), made once."""
        return ActivationOptions(
            self.sequence_parallel, self.recompute, self.flash_attention, self.element_bytes,
            self.mask_bytes, self.resolved_dropout, self.logits_bytes, self.capacity_factor,
            self.expert_tensor_parallel, self.partition_activations, self.cpu_checkpointing,
            **trainer.memory_options(self))

    @property
    def resolved_dropout(self) -> bool | None:
        """Dropout as given, else the engine's default (Megatron-LM's 0.1), else the model's."""
        return self.dropout if self.dropout is not None else self.convention.dropout

    @cached_property
    def pipeline(self) -> Pipeline:
        """This run's pipeline: its stages, schedule, model chunks and micro-batches."""
        return Pipeline(self.pipeline_parallel, self.pipeline_schedule, self.pipeline_chunks,
                        self.micro_batches, self.pipeline_layers)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update({n: list(out[n]) for n in ("logits_bytes", "pipeline_layers") if out[n] is not None})
        return out


DEFAULT_SETTINGS = WorkingSetSettings()   # frozen: one shared default is safe


def _check_settings(settings) -> WorkingSetSettings:
    if not isinstance(settings, WorkingSetSettings):
        raise TypeError(f"settings must be a WorkingSetSettings, got {type(settings).__name__}")
    return settings


def _check_parallel_settings(config: TransformerConfig, s: WorkingSetSettings,
                             placement: Placement | None = None) -> None:
    """The rules of :func:`zerolib.core.memory.model_parallel.check_parallel` for the settings'
    t and p (each setting was checked when the settings were made): once, at the door. They are
    the planner's rules, in its words: what it rejects, this refuses."""
    if config.position_embedding == "learned" and s.seq_len > config.max_positions:
        raise ValueError(f"seq_len must be at most {config.max_positions} for {config.name} "
                         f"(learned position embeddings), got {s.seq_len}")
    check_parallel(config, s.tensor_parallel, s.pipeline,
                   gpus_per_node=None if placement is None else placement.gpus_per_node,
                   seq_len=s.seq_len // s.context_parallel, sequence_parallel=s.sequence_parallel)


def _pipeline_stages(config: TransformerConfig, s: WorkingSetSettings) -> tuple[int, ...]:
    """The pipeline stages that can be the most loaded: the first and the last, or every
    stage of a model with dense first layers (candidate_stages says why)."""
    return tuple(dict.fromkeys(int(r) for r in candidate_stages(config, s.pipeline_parallel,
                                                                 s.pipeline_layers)))


def _on_gpu(config: TransformerConfig, s: WorkingSetSettings, pipeline_stage: int) -> tuple[int, int]:
    """(parameters, largest module's elements) on one GPU of ``pipeline_stage``."""
    # The settings were checked when made, the parallel rules at the door (check_peak_inputs).
    grid = ParallelGrid(config, np.int64(s.tensor_parallel), np.int64(s.pipeline_parallel),
                        np.int64(pipeline_stage), s.pipeline_schedule, s.pipeline_chunks, None, 1,
                        s.pipeline_layers)
    return int(parameters_on(grid)), int(largest_module_on(grid))


def _activations(config: TransformerConfig, s: WorkingSetSettings,
                 pipeline_stages: tuple[int, ...] | None = None) -> dict[int, tuple[int, int]]:
    """Per pipeline stage (default: the candidates for the most loaded), (activations, logits
    and loss) bytes on one of its GPUs: the same for every ZeRO stage."""
    if config.position_embedding == "learned" and s.seq_len > config.max_positions:
        raise ValueError(f"seq_len must be at most {config.max_positions} for {config.name} "
                         f"(learned position embeddings), got {s.seq_len}")
    tokens = s.seq_len // s.context_parallel     # this CP rank's share of each sequence
    if s.expert_tensor_parallel is not None:     # its rules need the model
        check_expert_tensor_parallel(s.expert_tensor_parallel, s.tensor_parallel,
                                     s.sequence_parallel, config.experts, config.ffn_hidden)
    units = unit_terms(config, tokens, s.micro_batch, s.tensor_parallel, s.activation_options)
    if s.partition_activations or s.cpu_checkpointing:
        # Full recomputation keeps one checkpoint per layer: ZeRO-R's is split or on the host.
        units = {**units, "transformer_layers": checkpoint_on_gpu(config, s)}
        if "dense_transformer_layer" in units and config.dense_layers:
            units["dense_transformer_layer"] = units["transformer_layers"]
    micro_batches = None if s.micro_batches is None else np.int64(s.micro_batches)
    method, layers, _ = stage_rules(s.activation_options)   # Megatron-LM's uniform / block N
    out = {}
    for pipeline_stage in pipeline_stages or _pipeline_stages(config, s):
        acts = stage_terms_of(config, units, np.int64(s.pipeline_parallel), np.int64(pipeline_stage),
                              s.pipeline_schedule, s.pipeline_chunks, micro_batches,
                              with_split((method, layers, False), s.pipeline_layers))
        out[pipeline_stage] = (int(sum(v for k, v in acts.items() if k != "logits_loss")),
                               int(acts["logits_loss"]))
    return out


def checkpoint_on_gpu(config: TransformerConfig, s: WorkingSetSettings) -> int:
    """Bytes of one layer's activation checkpoint on the GPU under the settings' ZeRO-R options
    (full recomputation)."""
    return checkpoint_terms_of(s.seq_len // s.context_parallel, s.micro_batch, config.hidden,
                             s.tensor_parallel, s.element_bytes, s.sequence_parallel,
                             s.partition_activations, s.cpu_checkpointing)["gpu"]


def term_arrays(stage, params, module, activations, logits_loss,
                s: WorkingSetSettings = DEFAULT_SETTINGS,
                layout: str | Layout = "mixed-adam") -> dict[str, np.ndarray]:
    """Every term of :data:`TERMS` as int64 arrays, broadcast over the ZeRO ``stage``, the
    ``params`` one GPU holds, its largest ``module`` (elements) and its ``activations`` and
    ``logits_loss`` bytes (see the module doc); 0 where a term does not apply. The one place
    the buffer terms are computed: :func:`peaks` and the planner (vectorised) both use it."""
    return terms_of(stage, params, module, activations, logits_loss, _check_settings(s),
                    get_layout(layout))


def terms_of(stage, params, module, activations, logits_loss, s: WorkingSetSettings,
             layout: Layout, unsharded: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """:func:`term_arrays` of checked settings and a Layout (the planner's and the peaks' path);
    ``unsharded``: FSDP2's units on the GPU (:func:`unsharded_units`), read under an FSDP2
    engine's convention."""
    stage, params, module, activations, logits_loss = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.int64) for v in (stage, params, module, activations, logits_loss)))
    grad_bits, param_bits = layout.bits_per_param("gradients"), layout.bits_per_param("parameters")

    def nbytes(elements, bits):
        return ceil_div(elements * bits, 8)

    zero = np.zeros(stage.shape, dtype=np.int64)
    terms = dict.fromkeys(TERMS, zero)
    terms["activations"], terms["logits_loss"] = activations, logits_loss
    if not s.ddp_gradient_as_bucket_view and s.convention.ddp_buckets:   # else: views, reduced
        terms["ddp_buckets"] = np.where(stage == 0, nbytes(params, grad_bits), 0)
    buffers = np.where((stage == 1) | (stage == 2), 2 if s.overlap_comm else 1, 1)
    terms["reduce_bucket"] = np.where(stage >= 1, buffers * nbytes(s.reduce_bucket_size, grad_bits), 0)
    if not s.allgather_in_place:
        terms["allgather_bucket"] = np.where((stage == 1) | (stage == 2), nbytes(
            np.minimum(s.allgather_bucket_size, params), param_bits), 0)
    gathered = np.minimum(params, np.maximum(s.max_live_parameters, module + s.prefetch_bucket_size))
    gathered = params if s.reshard_after_forward is False else gathered   # FSDP2 keeps them to the backward
    terms["gathered_parameters"] = np.where(stage == 3, nbytes(gathered, param_bits), 0)
    if not s.convention.deepspeed_buffers:   # collectives in place in the engine's own buffers
        terms.update(reduce_bucket=zero, allgather_bucket=zero, gathered_parameters=zero)
    if s.convention.fsdp:   # none of DeepSpeed's buffers: FSDP2's own unsharded state
        terms.update(trainer.fsdp_terms(stage, params, unsharded, s))
    terms["reserve"] = zero + s.reserve_bytes
    return terms


def _terms(config: TransformerConfig, stage: int, s: WorkingSetSettings, layout: Layout,
           activations: tuple[int, int], on_gpu: tuple[int, int],
           unsharded: Mapping[str, int] | None = None) -> Mapping[str, int]:
    """Every term of :data:`TERMS` for one ZeRO stage on one GPU holding ``on_gpu`` =
    (parameters, largest module) (:func:`term_arrays` at one point)."""
    params, module = on_gpu
    terms = {name: int(value) for name, value in
             terms_of(stage, params, module, *activations, s, layout, unsharded).items()}
    total = sum(terms.values())
    if total > MAX_BYTES:
        raise ValueError(f"the working set of {config.name} comes to {total:,} bytes, beyond "
                         f"zerolib's limit of {MAX_BYTES:,}: lower seq_len or micro_batch")
    return MappingProxyType(terms)


def working_set(model: str | TransformerConfig, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                layout: str | Layout = "mixed-adam", *, pipeline_stage: int | None = None) -> Mapping[str, int]:
    """Working-set bytes on one worker for one stage, one key per term (see the module doc).

    Every term of :data:`TERMS` is present; a term that does not apply to the stage is 0. With
    pipeline parallelism: on a GPU of ``pipeline_stage``, or (None) of the first or last stage,
    whichever working set is larger.
    """
    config = get_model(model)
    stage = check_single(stage, check_stage, "stage")
    settings, layout = _check_settings(settings), get_layout(layout)
    _check_parallel_settings(config, settings)
    candidates = _pipeline_stages(config, settings) if pipeline_stage is None else (
        check_count(pipeline_stage, "pipeline_stage", settings.pipeline_parallel - 1),)
    activations = _activations(config, settings, candidates)
    results = [_terms(config, stage, settings, layout, activations[r], _on_gpu(config, settings, r),
                      trainer.unsharded_units(config, settings, r)) for r in candidates]
    return max(results, key=lambda terms: sum(terms.values()))   # the first on ties


def _data_parallel(gpus: int, s: WorkingSetSettings) -> int:
    """The ZeRO group: the d x C GPUs of the data- and context-parallel group (module doc)."""
    t, p, c = s.tensor_parallel, s.pipeline_parallel, s.context_parallel
    if c > 1 and gpus % (t * c * p):
        raise ValueError(f"gpus ({gpus}) must be a multiple of tensor_parallel x context_parallel x "
                         f"pipeline_parallel ({t} x {c} x {p} = {t * c * p})")
    if gpus % (t * p):
        grid = f"tensor_parallel ({t})" if p == 1 else \
            f"tensor_parallel x pipeline_parallel ({t} x {p} = {t * p})"
        raise ValueError(f"gpus ({gpus}) must be a multiple of {grid}")
    return gpus // (t * p)


def peaks(model: str | TransformerConfig, gpus, stages=STAGES,
          settings: WorkingSetSettings = DEFAULT_SETTINGS,
          layout: str | Layout = "mixed-adam", placement: Placement | None = None) -> tuple[trainer.Peak, ...]:
    """Peak bytes per worker for each stage, in the order given: ``model_state`` of one GPU's
    parameters over the data-parallel workers, plus the working set, on the pipeline stage
    (first or last) where that sum is larger. The activations are computed once for all stages.
    With a ``placement`` the persistent part is what stays on the GPU, and each Peak carries
    every tier's bytes."""
    return peaks_of(*check_peak_inputs(model, gpus, stages, settings, layout, placement))


def check_peak_inputs(model, gpus, stages=STAGES, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                      layout: str | Layout = "mixed-adam", placement: Placement | None = None):
    """The door of :func:`peaks` (and of ``estimate`` with a model): every input checked once, as
    ``(config, gpus, stages, settings, layout, placement)`` for :func:`peaks_of`."""
    config = get_model(model)
    gpus = check_single(gpus, check_gpus, "gpus")
    settings, layout = _check_settings(settings), get_layout(layout)
    stages = [int(s) for s in np.atleast_1d(check_stage(stages, "stages"))]
    _data_parallel(gpus, settings)
    if placement is not None:
        placement = check_placement(placement)
    _check_parallel_settings(config, settings, placement)
    return config, gpus, stages, settings, layout, placement


def peaks_of(config: TransformerConfig, gpus: int, stages: list[int], settings: WorkingSetSettings,
             layout: Layout, placement: Placement | None) -> tuple[trainer.Peak, ...]:
    """:func:`peaks` of what :func:`check_peak_inputs` checked."""
    data_parallel = gpus // (settings.tensor_parallel * settings.pipeline_parallel)
    activations = _activations(config, settings)
    candidates = []
    for pipeline_stage in _pipeline_stages(config, settings):
        on_gpu = _on_gpu(config, settings, pipeline_stage)
        if placement is None:   # checked inputs: the state is made, not checked again
            n = len(stages)
            state = ModelState(np.full(n, on_gpu[0], dtype=np.int64),
                               np.full(n, data_parallel, dtype=np.int64),
                               np.array(stages, dtype=np.int64), layout)
            on_device = ({c: getattr(state, c) for c in CATEGORIES}, state.total, None)
        else:
            tiers = place(on_gpu[0], data_parallel, stages, layout, placement, world=gpus)
            on_device = (tiers.gpu_categories(), tiers.gpu, tiers)
        candidates.append((pipeline_stage, on_gpu, on_device))
    units = {r: trainer.unsharded_units(config, settings, r) for r, _, _ in candidates}
    result = []
    for index, stage in enumerate(stages):
        best = None
        for pipeline_stage, on_gpu, (categories, totals, tiers) in candidates:
            persistent = {c: int(categories[c][index]) for c in CATEGORIES}
            persistent["total"] = int(totals[index])
            terms = _terms(config, stage, settings, layout, activations[pipeline_stage], on_gpu,
                           units[pipeline_stage])
            allocated, reserved, judged, by_step = trainer.judge(
                persistent["total"], persistent["gradients"], persistent["optimizer"], terms,
                settings, layout)
            found = trainer.Peak(stage, MappingProxyType(persistent), terms, pipeline_stage,
                         None if tiers is None else MappingProxyType(tiers.as_dict(index)),
                         int(allocated), int(reserved), int(judged), settings.convention.judges,
                         bool(by_step))
            if best is None or found.total > best.total:   # the first stage on ties
                best = found
        result.append(best)
    return tuple(result)


def peak(model: str | TransformerConfig, gpus, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
         layout: str | Layout = "mixed-adam", placement: Placement | None = None) -> trainer.Peak:
    """:func:`peaks` for a single stage."""
    (result,) = peaks(model, gpus, check_single(stage, check_stage, "stage"), settings, layout,
                      placement)
    return result


def peak_fits(model, gpus, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
              layout: str | Layout = "mixed-adam", device: str | Device = "a100-80gb") -> bool:
    """True when the peak (persistent model state + working set) is at most the device capacity:
    the run fits, as far as this estimate can tell (compare :func:`model_state_fits`)."""
    return peak(model, gpus, stage, settings, layout).total <= get_device(device).capacity


def fewest_gpus_for_peak(model, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                         layout: str | Layout = "mixed-adam", device: str | Device = "a100-80gb",
                         max_gpus: int = MAX_GPUS):
    """Fewest GPUs (a multiple of ``tensor_parallel`` x ``pipeline_parallel``) at which
    ``stage``'s peak fits.

    The working set does not depend on the number of data-parallel workers, so this is the
    model-state search (:func:`zerolib.core.memory.feasibility.fewest_gpus`) over data-parallel workers
    with the working set as ``extra_bytes``, for the first and the last pipeline stage (both
    must fit: the larger count), times t x p. A single stage gives an int, or None if nothing
    up to ``max_gpus`` fits; several stages (one vectorised search) give an int64 array with 0
    where nothing fits.
    """
    config = get_model(model)
    settings, layout = _check_settings(settings), get_layout(layout)
    _check_parallel_settings(config, settings)
    grid = settings.tensor_parallel * settings.pipeline_parallel
    max_gpus = check_single(max_gpus, check_gpus, "max_gpus")
    stages = check_stage(stage)
    if max_gpus < grid:
        return None if stages.ndim == 0 else np.zeros(stages.shape, dtype=np.int64)
    if not trainer.summed(settings.convention):
        return trainer.fewest_by_peaks(peaks_of, (config, stages, settings, layout),
                                       get_device(device), max_gpus)
    activations = _activations(config, settings)
    workers = np.zeros(stages.shape, dtype=np.int64)
    fits_everywhere = np.ones(stages.shape, dtype=bool)
    for pipeline_stage in _pipeline_stages(config, settings):
        on_gpu = _on_gpu(config, settings, pipeline_stage)
        extra = np.vectorize(lambda s, r=pipeline_stage, g=on_gpu: sum(
            _terms(config, int(s), settings, layout, activations[r], g).values()),
            otypes=[np.int64])(stages)
        found = fewest_gpus(on_gpu[0], stages, layout, device, extra_bytes=extra,
                            max_gpus=max_gpus // grid)
        found = np.asarray(0 if found is None else found, dtype=np.int64)   # None: nothing fits
        fits_everywhere &= found > 0
        workers = np.maximum(workers, found)
    # ZeRO's group is d x C: a whole number of CP groups (more workers only lower the peak).
    c = settings.context_parallel
    workers = ceil_div(workers, c) * c
    fits_everywhere &= workers * grid <= max_gpus
    workers = np.where(fits_everywhere, workers, 0) * grid
    if stages.ndim == 0:
        return int(workers) or None
    return workers


def largest_micro_batch(model, gpus, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                        layout: str | Layout = "mixed-adam", device: str | Device = "a100-80gb",
                        max_micro_batch: int = 4096) -> int:
    """Largest micro-batch (up to ``max_micro_batch``) whose peak fits; 0 if not even 1 fits.

    Every term is non-decreasing in the micro-batch (activations and logits grow with it, the
    rest is constant), so a bisection finds it.
    """
    settings = _check_settings(settings)
    config, layout = get_model(model), get_layout(layout)
    capacity = get_device(device).capacity
    max_micro_batch = check_positive_int(max_micro_batch, "max_micro_batch", MAX_MICRO_BATCH)

    def fits_at(batch):
        trial = replace(settings, micro_batch=int(batch))
        return peak(config, gpus, stage, trial, layout).total <= capacity

    return int(last_true(np.vectorize(fits_at, otypes=[bool]), 1, max_micro_batch))


def largest_micro_batches(model, gpus, stages=STAGES, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                          layout: str | Layout = "mixed-adam", device: str | Device = "a100-80gb",
                          max_micro_batch: int = 4096) -> tuple[int, ...]:
    """:func:`largest_micro_batch` for each of ``stages``, in the order given, from a few
    :func:`peaks` (every stage at once) instead of a bisection per stage.

    The peak grows by about the same bytes per sequence, so micro-batches 1 and 2 give each
    stage a guess; a guess counts only once the peaks show it fits and one more does not (or
    it is ``max_micro_batch``), which under the same monotony :func:`largest_micro_batch`
    relies on makes it that search's answer. A guess not confirmed falls back to bisection.
    """
    settings = _check_settings(settings)
    config, layout = get_model(model), get_layout(layout)
    capacity = get_device(device).capacity
    top = check_positive_int(max_micro_batch, "max_micro_batch", MAX_MICRO_BATCH)
    stages = [int(s) for s in np.atleast_1d(check_stage(stages, "stages"))]
    totals = {}   # micro-batch -> every stage's peak total

    def fits(batch: int, index: int) -> bool:
        if batch not in totals:
            trial = replace(settings, micro_batch=batch)
            totals[batch] = [p.total for p in peaks(config, gpus, stages, trial, layout)]
        return totals[batch][index] <= capacity

    found = []
    for index in range(len(stages)):
        if not fits(1, index):
            found.append(0)
            continue
        if top == 1:
            found.append(1)
            continue
        fits(2, index)
        growth = totals[2][index] - totals[1][index]
        guess = top if growth <= 0 else min(top, 1 + (capacity - totals[1][index]) // growth)
        if fits(guess, index) and (guess == top or not fits(guess + 1, index)):
            found.append(guess)
            continue
        low, high = 1, top           # ok(low) holds: the bisection of intmath.last_true
        while low < high:
            mid = low + (high - low + 1) // 2
            low, high = (mid, high) if fits(mid, index) else (low, mid - 1)
        found.append(low)
    return tuple(found)


def stage_rows(model, gpus, stages=STAGES, settings: WorkingSetSettings = DEFAULT_SETTINGS,
               layout: str | Layout = "mixed-adam", device: str | Device | None = None,
               placement: Placement | None = None, host_memory: int | None = None) -> list[dict]:
    """Per stage, the rows of ``zerolib estimate``'s JSON with ``working_set``, ``peak`` and
    ``fits`` judged on the peak (None without a device). ``cluster_total`` is the persistent
    state summed over all GPUs.

    With a ``placement`` each row also carries ``tiers`` (see :class:`Peak`); with
    ``host_memory`` (CPU memory per node, bytes) ``host_fits`` judges the CPU tier per node
    against it, and ``fits`` needs both the GPU peak and the host to fit (NVMe is not judged).
    """
    checked = check_peak_inputs(model, gpus, stages, settings, layout, placement)
    device = get_device(device) if device is not None else None
    if host_memory is not None:
        host_memory = check_count(host_memory, "host_memory", MAX_BYTES)
    return rows_of(checked, device, host_memory)


def rows_of(checked: tuple, device: Device | None, host_memory: int | None) -> list[dict]:
    """:func:`stage_rows` of what :func:`check_peak_inputs` returned, a Device (or None) and
    checked ``host_memory``."""
    gpus = checked[1]
    rows = []
    for result in peaks_of(*checked):
        row = {"stage": result.stage, "pipeline_stage": result.pipeline_stage, **result.persistent,
               "cluster_total": result.persistent["total"] * gpus,
               "working_set": dict(result.working_set), **trainer.peak_keys(result)}
        row["fits"] = None if device is None else bool(result.total <= device.capacity)
        if result.tiers is not None:
            row["tiers"] = {tier: dict(items) for tier, items in result.tiers.items()}
        if host_memory is not None:
            cpu_per_node = result.tiers["cpu"]["per_node"] if result.tiers is not None else 0
            row["host_fits"] = bool(cpu_per_node <= host_memory)
            if row["fits"] is not None:
                row["fits"] = row["fits"] and row["host_fits"]
        rows.append(row)
    return rows
