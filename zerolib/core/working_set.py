"""The second layer of the capacity worksheet: the peak working set on top of model state.

    peak per worker = persistent model state (zerolib.core.accounting.model_state) + working set

Every working-set term is bytes on one worker (the most-loaded one) for one ZeRO stage, and
each names its assumption:

``activations``
    What the forward pass saves for backward, Korthikanti et al. 2022 term by term
    (:mod:`zerolib.core.activations`): all layers, the layer being recomputed (if any), the
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

Summing all terms treats them as live at one moment. At the start of the backward pass that is
true of the activations, the logits and their fp32 copy (the loss's backward needs them) and the
reserve; the gradient buckets fill while activations are freed layer by layer, so adding them
overstates a little. The logits' gradient, as large as the logits, is not counted (see
zerolib.core.activations), which understates by about as much: the sum is a close estimate, not a
guaranteed upper bound.

Bounds: every quantity has an upper bound (:data:`MAX_SEQ_LEN`, :data:`MAX_MICRO_BATCH`,
:data:`MAX_ELEMENTS` for bucket sizes, :data:`zerolib.core.inputs.MAX_BYTES` for the reserve and
for the working set's total), so every result is an exact int64; beyond them a ``ValueError``
names the quantity.

Tensor parallelism: with ``tensor_parallel`` = t the ``gpus`` of a setting are t-way tensor
parallel x (gpus / t)-way data parallel. A tensor-parallel rank holds ceil(params / t)
parameters (an approximation: norms are in fact replicated) and ZeRO partitions across the data
-parallel group.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from types import MappingProxyType

import numpy as np

from zerolib.core.accounting import CATEGORIES, STAGES, Layout, get_layout, model_state
from zerolib.core.activations import RECOMPUTE, model_activation_terms
from zerolib.core.devices import Device, get_device
from zerolib.core.feasibility import fewest_gpus
from zerolib.core.inputs import (
    MAX_BYTES,
    MAX_GPUS,
    MAX_PARAMS,
    check_count,
    check_flag,
    check_gpus,
    check_positive_int,
    check_single,
    check_stage,
)
from zerolib.core.intmath import ceil_div, last_true
from zerolib.core.models import (
    TransformerConfig,
    get_model,
    largest_layer,
    parameter_count,
)
from zerolib.core.units import GiB

TERMS = ("activations", "logits_loss", "ddp_buckets", "reduce_bucket", "allgather_bucket",
         "gathered_parameters", "reserve")

# DeepSpeed's zero_optimization defaults, in elements (deepspeed/runtime/zero/config.py,
# DeepSpeed v0.19.8: reduce_bucket_size = pp_int(5e8), allgather_bucket_size = pp_int(5e8),
# stage3_prefetch_bucket_size = pp_int(5e7), stage3_max_live_parameters = pp_int(1e9),
# stage3_param_persistence_threshold = pp_int(1e5)). A buffer's bytes are these times the
# element size of the dtype it holds.
REDUCE_BUCKET_SIZE = 500_000_000
ALLGATHER_BUCKET_SIZE = 500_000_000
STAGE3_PREFETCH_BUCKET_SIZE = 50_000_000
STAGE3_MAX_LIVE_PARAMETERS = 1_000_000_000
STAGE3_PARAM_PERSISTENCE_THRESHOLD = 100_000

# CUDA context, NCCL, allocator cache and fragmentation: a round assumption, not a measurement.
DEFAULT_RESERVE = 2 * GiB

# Upper bounds: far beyond any real run, small enough that every term is exact in int64.
MAX_SEQ_LEN = 2**24           # tokens per sequence (16,777,216)
MAX_MICRO_BATCH = 2**16       # sequences per GPU per step
MAX_ELEMENT_BYTES = 16        # bytes of one activation, mask or logit element
MAX_ELEMENTS = MAX_PARAMS     # bucket sizes and live-parameter limits, in elements


@dataclass(frozen=True)
class WorkingSetSettings:
    """How the model is run: the inputs of the working set (sizes in elements, bytes where named)."""

    seq_len: int = 4096
    micro_batch: int = 1
    recompute: str = "none"             # "none" | "selective" | "full"
    flash_attention: bool = True        # fused attention: no s x s scores stored
    tensor_parallel: int = 1
    sequence_parallel: bool = False
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

    def __post_init__(self):
        check_positive_int(self.seq_len, "seq_len", MAX_SEQ_LEN)
        check_positive_int(self.micro_batch, "micro_batch", MAX_MICRO_BATCH)
        check_positive_int(self.tensor_parallel, "tensor_parallel", MAX_GPUS)
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

    def __deepcopy__(self, memo) -> WorkingSetSettings:
        return self  # immutable (pandas deep-copies DataFrame.attrs, which carry it)

    def as_dict(self) -> dict:
        out = asdict(self)
        if out["logits_bytes"] is not None:
            out["logits_bytes"] = list(out["logits_bytes"])
        return out


DEFAULT_SETTINGS = WorkingSetSettings()   # frozen: one shared default is safe


def _check_settings(settings) -> WorkingSetSettings:
    if not isinstance(settings, WorkingSetSettings):
        raise TypeError(f"settings must be a WorkingSetSettings, got {type(settings).__name__}")
    return settings


def _rank_params(config: TransformerConfig, tensor_parallel: int) -> int:
    return ceil_div(parameter_count(config), tensor_parallel)


def _activations(config: TransformerConfig, s: WorkingSetSettings) -> tuple[int, int]:
    """(activations, logits and loss) bytes on one GPU: the same at every stage."""
    if config.position_embedding == "learned" and s.seq_len > config.max_positions:
        raise ValueError(f"seq_len must be at most {config.max_positions} for {config.name} "
                         f"(learned position embeddings), got {s.seq_len}")
    acts = model_activation_terms(
        config, s.seq_len, s.micro_batch, recompute=s.recompute, tensor_parallel=s.tensor_parallel,
        sequence_parallel=s.sequence_parallel, flash_attention=s.flash_attention,
        element_bytes=s.element_bytes, mask_bytes=s.mask_bytes, dropout=s.dropout,
        logits_bytes=s.logits_bytes)
    return sum(v for k, v in acts.items() if k != "logits_loss"), acts["logits_loss"]


def _terms(config: TransformerConfig, stage: int, s: WorkingSetSettings, layout: Layout,
           activations: tuple[int, int]) -> Mapping[str, int]:
    """Every term of :data:`TERMS` for one stage (see the module doc); 0 where it does not apply."""
    params = _rank_params(config, s.tensor_parallel)
    grad_bits, param_bits = layout.bits_per_param("gradients"), layout.bits_per_param("parameters")

    def nbytes(elements, bits):
        return ceil_div(elements * bits, 8)

    terms = dict.fromkeys(TERMS, 0)
    terms["activations"], terms["logits_loss"] = activations
    if stage == 0:
        if not s.ddp_gradient_as_bucket_view:
            terms["ddp_buckets"] = nbytes(params, grad_bits)
    else:
        buffers = 2 if (s.overlap_comm and stage in (1, 2)) else 1
        terms["reduce_bucket"] = buffers * nbytes(s.reduce_bucket_size, grad_bits)
    if stage in (1, 2) and not s.allgather_in_place:
        terms["allgather_bucket"] = nbytes(min(s.allgather_bucket_size, params), param_bits)
    if stage == 3:
        module = ceil_div(largest_layer(config), s.tensor_parallel)
        gathered = min(params, max(s.max_live_parameters, module + s.prefetch_bucket_size))
        terms["gathered_parameters"] = nbytes(gathered, param_bits)
    terms["reserve"] = s.reserve_bytes
    total = sum(terms.values())
    if total > MAX_BYTES:
        raise ValueError(f"the working set of {config.name} comes to {total:,} bytes, beyond "
                         f"zerolib's limit of {MAX_BYTES:,}: lower seq_len or micro_batch")
    return MappingProxyType(terms)


def working_set(model: str | TransformerConfig, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                layout: str | Layout = "mixed-adam") -> Mapping[str, int]:
    """Working-set bytes on one worker for one stage, one key per term (see the module doc).

    Every term of :data:`TERMS` is present; a term that does not apply to the stage is 0.
    """
    config = get_model(model)
    stage = check_single(stage, check_stage, "stage")
    settings = _check_settings(settings)
    return _terms(config, stage, settings, get_layout(layout), _activations(config, settings))


@dataclass(frozen=True)
class Peak:
    """Persistent model state + working set for one worker at one stage (bytes)."""

    stage: int
    persistent: Mapping[str, int]   # parameters, gradients, optimizer, total
    working_set: Mapping[str, int]

    @property
    def working_set_total(self) -> int:
        return sum(self.working_set.values())

    @property
    def total(self) -> int:
        return self.persistent["total"] + self.working_set_total


def _data_parallel(gpus: int, tensor_parallel: int) -> int:
    if gpus % tensor_parallel:
        raise ValueError(f"gpus ({gpus}) must be a multiple of tensor_parallel ({tensor_parallel})")
    return gpus // tensor_parallel


def peaks(model: str | TransformerConfig, gpus, stages=STAGES,
          settings: WorkingSetSettings = DEFAULT_SETTINGS,
          layout: str | Layout = "mixed-adam") -> tuple[Peak, ...]:
    """Peak bytes per worker for each stage, in the order given: ``model_state`` of one
    tensor-parallel rank's share of the parameters over the data-parallel workers, plus the
    working set. The activations are computed once for all stages."""
    config = get_model(model)
    gpus = check_single(gpus, check_gpus, "gpus")
    settings, layout = _check_settings(settings), get_layout(layout)
    stages = [int(s) for s in np.atleast_1d(check_stage(stages, "stages"))]
    activations = _activations(config, settings)
    state = model_state(_rank_params(config, settings.tensor_parallel),
                        _data_parallel(gpus, settings.tensor_parallel), stages, layout)
    result = []
    for index, stage in enumerate(stages):
        persistent = {c: int(getattr(state, c)[index]) for c in CATEGORIES}
        persistent["total"] = int(state.total[index])
        result.append(Peak(stage, MappingProxyType(persistent),
                           _terms(config, stage, settings, layout, activations)))
    return tuple(result)


def peak(model: str | TransformerConfig, gpus, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
         layout: str | Layout = "mixed-adam") -> Peak:
    """:func:`peaks` for a single stage."""
    (result,) = peaks(model, gpus, check_single(stage, check_stage, "stage"), settings, layout)
    return result


def peak_fits(model, gpus, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
              layout: str | Layout = "mixed-adam", device: str | Device = "a100-80gb") -> bool:
    """True when the peak (persistent model state + working set) is at most the device capacity:
    the run fits, as far as this estimate can tell (compare :func:`model_state_fits`)."""
    return peak(model, gpus, stage, settings, layout).total <= get_device(device).capacity


def fewest_gpus_for_peak(model, stage, settings: WorkingSetSettings = DEFAULT_SETTINGS,
                         layout: str | Layout = "mixed-adam", device: str | Device = "a100-80gb",
                         max_gpus: int = MAX_GPUS):
    """Fewest GPUs (a multiple of ``tensor_parallel``) at which ``stage``'s peak fits.

    The working set does not depend on the number of data-parallel workers, so this is the
    model-state search (:func:`zerolib.core.feasibility.fewest_gpus`) over data-parallel workers
    with the working set as ``extra_bytes``, times the tensor-parallel degree. A single stage
    gives an int, or None if nothing up to ``max_gpus`` fits; several stages (one vectorised
    search) give an int64 array with 0 where nothing fits.
    """
    config = get_model(model)
    settings, layout = _check_settings(settings), get_layout(layout)
    t = settings.tensor_parallel
    max_gpus = check_single(max_gpus, check_gpus, "max_gpus")
    stages = check_stage(stage)
    if max_gpus < t:
        return None if stages.ndim == 0 else np.zeros(stages.shape, dtype=np.int64)
    activations = _activations(config, settings)
    extra = np.vectorize(lambda s: sum(_terms(config, int(s), settings, layout, activations).values()),
                         otypes=[np.int64])(stages)
    workers = fewest_gpus(_rank_params(config, t), stages, layout, device, extra_bytes=extra,
                          max_gpus=max_gpus // t)
    if stages.ndim == 0:
        return None if workers is None else workers * t
    return workers * t


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


def stage_rows(model, gpus, stages=STAGES, settings: WorkingSetSettings = DEFAULT_SETTINGS,
               layout: str | Layout = "mixed-adam", device: str | Device | None = None) -> list[dict]:
    """Per stage, the rows of ``zerolib estimate``'s JSON with ``working_set``, ``peak`` and
    ``fits`` judged on the peak (None without a device). ``cluster_total`` is the persistent
    state summed over all GPUs."""
    gpus = check_single(gpus, check_gpus, "gpus")
    device = get_device(device) if device is not None else None
    rows = []
    for result in peaks(model, gpus, stages, settings, layout):
        row = {"stage": result.stage, **result.persistent,
               "cluster_total": result.persistent["total"] * gpus,
               "working_set": dict(result.working_set), "peak": result.total}
        row["fits"] = None if device is None else bool(result.total <= device.capacity)
        rows.append(row)
    return rows
