"""What a trainer's memory convention adds to the working set and how its peak is judged
(:mod:`zerolib.core.memory.conventions`): FSDP2's unsharded parameters and gradients, the
optimizer step's temporaries, and the allocated, reserved and judged peaks of one GPU. Each is
a mechanism measured with the real PyTorch code on the CPU (``data/mechanisms_measured.md``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.inputs import check_flag
from zerolib.core.memory.accounting import Layout
from zerolib.core.memory.conventions import (
    RESERVED_PPM,
    MemoryConvention,
    check_reserved_ppm,
    memory_convention,
    reserved_bytes,
)
from zerolib.core.memory.model_parallel import ParallelGrid, stage_layers, unsharded_units_on
from zerolib.core.memory.trainer_memory import FSDP2_ENGINES

# A term only an FSDP2 engine's convention has (torchtitan): the gradients accumulated unsharded
# beside a pipeline. Present in its working sets only, so the chapter's tables keep TERMS.
FSDP_TERMS = ("unsharded_gradients",)

if TYPE_CHECKING:
    from zerolib.core.memory.working_set import WorkingSetSettings

# FSDP2's unsharded parameters are in its mixed-precision param_dtype (bf16); under a pipeline
# its accumulated gradients in the reduce dtype (fp32); Float8 all-gather: 1-byte weights and
# one fp32 scale per weight (data/mechanisms_measured.csv, "FSDP2 state").
FSDP_PARAM_BYTES = 2
FSDP_GRAD_BYTES = 4
FP8_BYTES = 1
FP8_SCALE_BYTES = 4


def fsdp_terms(stage, params, units: Mapping[str, np.ndarray] | None,
               s: WorkingSetSettings) -> dict[str, np.ndarray]:
    """The working set's terms under an FSDP2 engine's convention (torchtitan's): none of
    DeepSpeed's or DDP's buffers; the unsharded parameters and the unsharded accumulated
    gradients FSDP2 holds at the backward's peak: stage 3 without a pipeline the root's modules
    and one layer; stage 2, or any sharded stage beside a pipeline, every parameter of the GPU;
    beside a pipeline also the gradients, accumulated unsharded in fp32 (``units``:
    :func:`unsharded_units`; None: no unsharded state)."""
    zero = np.zeros(np.shape(stage), dtype=np.int64)
    out = dict.fromkeys(("ddp_buckets", "reduce_bucket", "allgather_bucket", "gathered_parameters",
                         *FSDP_TERMS), zero)
    if units is None:
        return out
    root, layer, matrices, tensors, layers = (np.asarray(units[name], dtype=np.int64) for name in
                                              ("root", "layer", "matrices", "matrix_tensors",
                                               "layers"))

    def in_bytes(elements, matrix_elements, matrix_tensors):
        if not s.fp8_all_gather:
            return FSDP_PARAM_BYTES * elements
        return (FSDP_PARAM_BYTES * (elements - matrix_elements) + FP8_BYTES * matrix_elements
                + FP8_SCALE_BYTES * matrix_tensors)

    piped = np.asarray(units.get("stages", s.pipeline_parallel)) > 1   # (the planner's: per row)
    whole = in_bytes(params, layers * matrices, layers * tensors)
    one = in_bytes(root + layer, matrices, tensors)
    sharded = stage >= 2
    # kept unsharded: stage 2; a pipeline (its stage sets reshard_after_backward False, whatever
    # reshard_after_forward says); reshard_after_forward False, forward to backward
    kept = (stage == 2) | piped | (s.reshard_after_forward is False)
    out["gathered_parameters"] = np.where(sharded & kept, whole,
                                          np.where(stage == 3, one, 0))
    out["unsharded_gradients"] = np.where(sharded & piped, FSDP_GRAD_BYTES * params, 0)
    return out


def unsharded_units(config: TransformerConfig, s: WorkingSetSettings,
                    pipeline_stage: int) -> dict[str, int] | None:
    """FSDP2's units on one GPU of ``pipeline_stage`` (elements): the root's modules there, one
    layer, its matrices and their count (:func:`zerolib.core.memory.model_parallel.
    unsharded_units_on`), the layers the stage holds and the pipeline's ``stages``; None where
    the engine is not FSDP2's."""
    if not s.convention.fsdp:
        return None
    grid = ParallelGrid(config, np.int64(s.tensor_parallel), np.int64(s.pipeline_parallel),
                        np.int64(pipeline_stage), s.pipeline_schedule, s.pipeline_chunks, None, 1,
                        s.pipeline_layers)
    units = {name: int(value) for name, value in unsharded_units_on(grid, grid.pipeline_stage).items()}
    units["layers"] = int(stage_layers(config.layers, s.pipeline_parallel, pipeline_stage,
                                       s.pipeline_layers))
    units["stages"] = s.pipeline_parallel
    return units


def step_temporaries(optimizer, s: WorkingSetSettings, layout: Layout):
    """Bytes the optimizer step allocates beside the state (the engine's ``step_moment``): torch
    AdamW's foreach step, one temporary as wide as its second moment per element of optimizer
    state on the GPU (``_foreach_sqrt``); DeepSpeed, an fp32 copy of the gradients it updates
    (4 bytes per element of its optimizer shard); nothing for the chapter's count."""
    moment = s.convention.step_moment
    bits = layout.bits_per_param("optimizer")
    if moment == "none" or not bits:
        return optimizer * 0
    if moment == "fp32-gradient-copy":
        return optimizer * 32 // bits
    # the second moment's width: the layout's "variance" part, else half the optimizer state
    variance = sum(w for part, w in layout.parts["optimizer"] if "variance" in part)
    variance_bits = int(round(variance * 8)) if variance else bits // 2
    return optimizer * variance_bits // bits


def judge(persistent, gradients, optimizer, terms: Mapping, s: WorkingSetSettings, layout: Layout):
    """(allocated, reserved, judged bytes, the step's moment decides) of one GPU, vectorised:
    the backward's moment, persistent state (less the gradients an engine makes during the
    backward and frees with the step) plus every term but the reserve, or the optimizer step's,
    persistent state plus its temporaries and the buffers, whichever is larger; the reserved
    peak adds the caching allocator's reserve (:func:`zerolib.core.memory.conventions.
    reserved_bytes`); fits judges the engine's choice of the two plus the reserve outside the
    allocator."""
    convention = s.convention
    reserve = terms["reserve"]
    held = sum(value for name, value in terms.items() if name != "reserve")
    backward = persistent + held - (0 if convention.gradients_between_steps else gradients)
    step = persistent + step_temporaries(optimizer, s, layout) + terms["ddp_buckets"] + \
        terms["reduce_bucket"] + terms["allgather_bucket"]
    by_step = (step > backward) & (convention.step_moment != "none")
    allocated = np.where(by_step, step, backward) if isinstance(backward, np.ndarray) else (
        step if by_step else backward)
    reserved = reserved_bytes(allocated, s.reserved_ppm)
    judged = (allocated if convention.judges == "peak" else reserved) + reserve
    return allocated, reserved, judged, by_step


def check_memory(s: WorkingSetSettings) -> None:
    """The memory-convention fields of working-set settings, checked (ValueError naming one)."""
    memory_convention(s.engine)
    for name in ("fp8", "fp8_all_gather", "compile", "logits_freed", "reshard_after_forward"):
        if getattr(s, name) not in (False, None):   # a default is not checked again
            check_flag(getattr(s, name), name)
    if s.reshard_after_forward is not None and s.engine not in FSDP2_ENGINES:
        raise ValueError(f"reshard_after_forward is FSDP2's fully_shard setting: it needs the "
                         f"engine fsdp2 or torchtitan, got {s.engine!r}")
    if s.fp8_all_gather and not (s.fp8 and s.convention.fsdp):
        raise ValueError("fp8_all_gather is FSDP2's all-gather of Float8 weights: it needs fp8 "
                         "and an FSDP2 engine (torchtitan)")
    if s.reserved_ppm != RESERVED_PPM or type(s.reserved_ppm) is not int:
        check_reserved_ppm(s.reserved_ppm)
    _ = s.activation_options   # the options' own checks (norms, loss, recompute method)


def resolved_loss(s: WorkingSetSettings) -> str:
    """The loss a run counts: the one given, or the engine's (compiled where the engine compiles
    it under ``compile``); the chapter's ``stored`` with explicit ``logits_bytes``."""
    if s.loss is not None:
        return s.loss
    c = s.convention
    if s.logits_bytes is not None:
        return "stored"
    return "compiled" if s.compile and c.compiled_loss else c.loss


def memory_options(s: WorkingSetSettings) -> dict:
    """The ActivationOptions keywords of the trainer's memory settings and its convention."""
    c = s.convention
    return dict(norms="fused" if s.compile else s.norms, fp8=s.fp8,
                recompute_method=s.recompute_method, recompute_layers=s.recompute_layers,
                loss=resolved_loss(s), loss_chunks=s.loss_chunks,
                logits_freed=c.logits_freed if s.logits_freed is None else s.logits_freed,
                separate_moments=c.separate_moments)


@dataclass(frozen=True)
class Peak:
    """Persistent model state + working set for one worker at one stage (bytes).

    ``allocated`` is the allocated peak (``torch.cuda.max_memory_allocated``'s): the backward's
    moment or the optimizer step's (``step_moment``), :func:`judge`; ``reserved`` adds the
    caching allocator's reserve (``max_memory_reserved``); ``total`` is what fits judges, the
    engine's choice of the two plus the reserve outside the allocator (``judges``). Under the
    chapter's count ``total`` is persistent state + every working-set term, as ever."""

    stage: int
    persistent: Mapping[str, int]   # parameters, gradients, optimizer, total (on the GPU)
    working_set: Mapping[str, int]
    pipeline_stage: int = 0         # the pipeline stage whose GPUs this is (the most loaded)
    # With a placement: per tier (gpu, cpu, nvme) the bytes per item, per GPU and per node
    # (zerolib.core.memory.placement.TierState.as_dict); None without one.
    tiers: Mapping[str, Mapping[str, int]] | None = None
    allocated: int | None = None    # None: the chapter's sum less the reserve
    reserved: int | None = None
    judged: int | None = None
    judges: str = "peak"
    step_moment: bool = False       # the optimizer step's moment is the peak

    @property
    def working_set_total(self) -> int:
        return sum(self.working_set.values())

    @property
    def total(self) -> int:
        if self.judged is not None:
            return self.judged
        return self.persistent["total"] + self.working_set_total

    @property
    def allocated_peak(self) -> int:
        if self.allocated is not None:
            return self.allocated
        return self.total - self.working_set["reserve"]

    @property
    def reserved_peak(self) -> int:
        return self.reserved if self.reserved is not None else reserved_bytes(self.allocated_peak)


def summed(convention: MemoryConvention) -> bool:
    """Whether the judged peak is persistent state + every term (the chapter's count), which
    the model-state search takes as extra bytes."""
    return (convention.judges == "peak" and convention.gradients_between_steps
            and convention.step_moment == "none")


def fewest_by_peaks(peaks_of, checked: tuple, device, max_gpus: int):
    """:func:`zerolib.core.memory.working_set.fewest_gpus_for_peak` (``peaks_of`` its
    peaks) by bisection over the ZeRO group, peaks computed whole (an
    engine whose judged peak is not state + terms): the peak does not grow with more GPUs."""
    config, stages, settings, layout = checked
    grid, c = settings.tensor_parallel * settings.pipeline_parallel, settings.context_parallel
    top = max_gpus // grid // c          # ZeRO's group is d x C: whole CP groups

    def fits(groups: int, stage: int) -> bool:
        (found,) = peaks_of(config, groups * c * grid, [stage], settings, layout, None)
        return found.total <= device.capacity

    out = []
    for stage in np.atleast_1d(stages).tolist():
        if top < 1 or not fits(top, stage):
            out.append(0)
            continue
        low, high = 1, top               # fits(high) holds
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if fits(mid, stage) else (mid + 1, high)
        out.append(low * c * grid)
    workers = np.array(out, dtype=np.int64)
    if np.ndim(stages) == 0:
        return int(workers[0]) or None
    return workers


def peak_keys(result: Peak) -> dict:
    """A row's peaks (bytes): ``peak``, the allocated peak plus the reserve outside PyTorch's
    allocator (the chapter's peak, unchanged under its count); ``peak_reserved``, the reserved
    peak plus the same reserve; ``max_memory_allocated`` and ``max_memory_reserved``, what
    ``torch.cuda`` reports (the allocator's own counts); ``fits_judges``, which of ``peak`` and
    ``peak_reserved`` fits compares with the device; ``peak_moment``, the backward's or the
    optimizer step's."""
    reserve = result.working_set["reserve"]
    return {"peak": result.allocated_peak + reserve, "peak_reserved": result.reserved_peak + reserve,
            "max_memory_allocated": result.allocated_peak,
            "max_memory_reserved": result.reserved_peak, "fits_judges": result.judges,
            "peak_moment": "optimizer step" if result.step_moment else "backward"}


