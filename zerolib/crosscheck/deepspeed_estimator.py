"""DeepSpeed's own model-state estimator, as a named convention beside the chapter's.

DeepSpeed ships ``estimate_zero2_model_states_mem_needs`` (deepspeed/runtime/zero/stage_1_and_2.py)
and ``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage3.py). This module
mirrors them as pure functions, without importing DeepSpeed, so the chapter can set DeepSpeed's
numbers beside its own and explain the gap (see data/deepspeed_convention.md).

Version followed: DeepSpeed v0.19.8 (source read from the installed release). The ZeRO-3 body
is identical in v0.14.2 and v0.19.8. The ZeRO-2 body changed in v0.14.3 (PR #5099): without
offload, the GPU term went from ``4 * P + 16 * P / N`` to ``2 * P + 18 * P / N``. DeepSpeed's
documentation (docs/code-docs/source/memory.rst) still prints the old numbers (15.93 GB for the
t5-3b example), so both are here: ``formula="v0.14.3"`` (the code, default) and
``formula="v0.14.2"`` (the code up to v0.14.2, which the documented examples reproduce).

Conventions that differ from the chapter (zerolib.core.memory.accounting):
- DeepSpeed assumes mixed-precision Adam with fp16 parameters (2 bytes) and counts 18 bytes per
  parameter for the partitioned part (2 fp16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam).
- "per GPU" and "per CPU" are separate pools; "per CPU" is the host RAM of one node, and most CPU
  terms carry ``additional_buffer_factor`` (1.5 by default, "to be conservative").
- ZeRO-3 adds ``4 * largest_layer_params`` (one gathered layer: fp16 params + fp16 grads).
- DeepSpeed prints GiB (2**30 bytes) labelled "GB"; :func:`format_gib` reproduces that.
All results are whole bytes (DeepSpeed truncates with ``int()``). Checked once against
DeepSpeed 0.19.8's own two functions on 30,000 random settings (every option, 1-64 nodes,
factors 1.0-2.0, up to 10**14 parameters): identical bytes.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from zerolib.core.inputs import (
    broadcast,
    check_flag,
    check_gpus,
    check_params,
    check_single,
)
from zerolib.core.memory.accounting import model_state
from zerolib.core.memory.working_set import (
    ALLGATHER_BUCKET_SIZE,
    REDUCE_BUCKET_SIZE,
    STAGE3_MAX_LIVE_PARAMETERS,
    STAGE3_PARAM_PERSISTENCE_THRESHOLD,
    STAGE3_PREFETCH_BUCKET_SIZE,
)
from zerolib.core.units import GiB

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    pass

# The DeepSpeed release whose source these functions mirror (and that measure_deepspeed ran).
DEEPSPEED_VERSION = "0.19.8"

# Default of every DeepSpeed estimator ("additional_buffer_factor=1.5 ... to be conservative",
# memory.rst, General RAM).
ADDITIONAL_BUFFER_FACTOR = 1.5

# ZeRO-2 GPU formula without offload, by the DeepSpeed release that introduced it:
#   "v0.14.3": 2 * P + int(18 * P / N)  (code from v0.14.3 on, still in v0.19.8)
#   "v0.14.2": 4 * P + int(16 * P / N)  (code up to v0.14.2; the numbers memory.rst prints)
ZERO2_FORMULAS = ("v0.14.3", "v0.14.2")

# Bytes per parameter behind the multipliers (memory.rst "breakdown for the 16 and 18
# multipliers" and the v0.14.3 comment in stage_1_and_2.py).
FP32_MODEL_BYTES = 4  # "when pytorch creates a model it creates it in fp32" (the 4 * n_gpus term)
GATHERED_LAYER_BYTES = 4  # ZeRO-3: 2 bytes fp16 params gathered + 2 bytes fp16 grads computed


@dataclass(frozen=True)
class DeepSpeedEstimate:
    """One row of DeepSpeed's estimator table, in bytes.

    ``per_cpu`` is host RAM for one node, ``per_gpu`` device memory for one GPU;
    ``largest_layer`` is the gathered-layer term already included in ``per_gpu`` (ZeRO-3; 0 for
    ZeRO-2). Scalars give ints, array inputs give int64 arrays (broadcast).
    """

    stage: int
    per_cpu: int | np.ndarray
    per_gpu: int | np.ndarray
    largest_layer: int | np.ndarray
    options: str

    def row(self) -> str:
        """The line DeepSpeed prints for this estimate (scalar estimates only)."""
        return format_row(self.per_cpu, self.per_gpu, self.options)




def _buffer_factor(value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"additional_buffer_factor must be a positive number, got {value!r}")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(
            f"additional_buffer_factor must be a finite positive number, got {value!r}")
    return float(value)


def _out(array: np.ndarray):
    """Truncate like DeepSpeed's int(); a 0-d result becomes a Python int."""
    whole = np.trunc(array).astype(np.int64)
    return int(whole) if whole.ndim == 0 else whole


def _offload_str(device_on: bool) -> str:
    # DeepSpeed formats OffloadDeviceEnum.cpu with width 4 ("cpu "), or prints "none".
    return "cpu " if device_on else "none"


def estimate_zero2(total_params, num_gpus_per_node=1, num_nodes=1, cpu_offload: bool = True,
                   additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR,
                   formula: str = "v0.14.3") -> DeepSpeedEstimate:
    """DeepSpeed's ``estimate_zero2_model_states_mem_needs`` (same defaults).

    With ``cpu_offload`` (offload_optimizer=cpu): GPU holds the fp16 parameters, 2 * P; each node's
    CPU holds P * max(4 * total_gpus, 16) * factor. Without it: the GPU formula of ``formula``
    (see ZERO2_FORMULAS) and CPU P * 4 * gpus_per_node * factor (the fp32 model each process
    builds before moving it to its GPU).
    """
    params = check_params(total_params, "total_params")
    per_node = check_gpus(num_gpus_per_node, "num_gpus_per_node")
    nodes = check_gpus(num_nodes, "num_nodes")
    offload = check_flag(cpu_offload, "cpu_offload")
    factor = _buffer_factor(additional_buffer_factor)
    if formula not in ZERO2_FORMULAS:
        raise ValueError(f"formula must be one of {', '.join(ZERO2_FORMULAS)}, got {formula!r}")
    params, per_node, nodes = broadcast(total_params=params, num_gpus_per_node=per_node,
                                        num_nodes=nodes)
    total_gpus = per_node * nodes

    if offload:
        gpu = 2 * params
        cpu = params * np.maximum(4 * total_gpus, 16) * factor
    else:
        # int(k * P / N) in DeepSpeed; floor division gives the same whole bytes exactly.
        if formula == "v0.14.3":
            # 2 = fp16 params; 18 = 2 fp16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam states
            gpu = 2 * params + (18 * params) // total_gpus
        else:
            # 4 = fp16 params + fp16 grads; 16 = fp32 params, fp32 grads, Adam (up to v0.14.2)
            gpu = 4 * params + (16 * params) // total_gpus
        cpu = params * FP32_MODEL_BYTES * per_node * factor
    options = f"offload_optimizer={_offload_str(offload)}"
    return DeepSpeedEstimate(2, _out(np.asarray(cpu, dtype=float)), _out(gpu),
                             _out(np.zeros_like(gpu)), options)


def estimate_zero3(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,
                   cpu_offload: bool = True, cpu_offload_params: bool = True,
                   zero_init: bool = True,
                   additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR) -> DeepSpeedEstimate:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (same defaults).

    ``largest_layer_params`` is the most parameters any one module owns directly (DeepSpeed's
    ``model_to_params``); the GPU always reserves 4 bytes for each of them (the gathered layer).
    ``cpu_offload`` is offload_optimizer=cpu, ``cpu_offload_params`` offload_param=cpu (only
    meaningful with ``cpu_offload``, as in DeepSpeed), ``zero_init`` whether the model is built
    under ``deepspeed.zero.Init`` (so no process ever holds the whole fp32 model).
    """
    params = check_params(total_params, "total_params")
    largest = check_params(largest_layer_params, "largest_layer_params")
    per_node = check_gpus(num_gpus_per_node, "num_gpus_per_node")
    nodes = check_gpus(num_nodes, "num_nodes")
    offload = check_flag(cpu_offload, "cpu_offload")
    offload_params = check_flag(cpu_offload_params, "cpu_offload_params")
    init = check_flag(zero_init, "zero_init")
    factor = _buffer_factor(additional_buffer_factor)
    params, largest, per_node, nodes = broadcast(total_params=params, largest_layer_params=largest,
                                                 num_gpus_per_node=per_node, num_nodes=nodes)
    if np.any(largest > params):
        raise ValueError("largest_layer_params must not exceed total_params")
    total_gpus = per_node * nodes
    gpus_factor = 1 / nodes  # DeepSpeed: n_gpus / total_gpus
    largest_layer = GATHERED_LAYER_BYTES * largest

    if offload and offload_params:
        gpu = largest_layer
        # 18 = 16 bytes of fp32 (params, grads, momentum, variance) + 2 bytes fp16 params.
        # Same operation order as DeepSpeed, so the float rounding (then int()) matches too.
        if init:
            cpu = params * 18 * gpus_factor * factor
        else:
            cpu = params * np.maximum(4 * per_node, 18 * gpus_factor) * factor
    elif offload:
        gpu = largest_layer + (2 * params) // total_gpus
        if init:
            cpu = params * 16 * gpus_factor * factor
        else:
            cpu = params * np.maximum(4 * per_node, 16 * gpus_factor) * factor
    else:
        gpu = largest_layer + (18 * params) // total_gpus
        held = largest if init else params  # zero.Init builds one layer at a time
        cpu = held * FP32_MODEL_BYTES * per_node * factor
    # DeepSpeed ignores offload_param when the optimizer is not offloaded; say what it computed.
    options = (f"offload_param={_offload_str(offload and offload_params)}, "
               f"offload_optimizer={_offload_str(offload)}, zero_init={1 if init else 0}")
    return DeepSpeedEstimate(3, _out(np.asarray(cpu, dtype=float)), _out(gpu), _out(largest_layer),
                             options)


# --- DeepSpeed's printed tables (GiB labelled "GB") -------------------------------------------

def format_gib(n_bytes, width: int = 6) -> str:
    """Bytes as DeepSpeed prints them: GiB with two decimals and the label "GB"."""
    if isinstance(n_bytes, (bool, np.bool_)) or not isinstance(n_bytes, numbers.Real):
        raise TypeError(f"n_bytes must be a number of bytes, got {n_bytes!r}")
    if isinstance(width, bool) or not isinstance(width, int):
        raise TypeError(f"width must be a whole number of characters, got {width!r}")
    if width < 0:
        raise ValueError(f"width must be 0 or more characters, got {width!r}")
    return f"{n_bytes / GiB:{width}.2f}GB"


def format_row(per_cpu, per_gpu, options: str) -> str:
    """One table line, laid out as DeepSpeed's ``*_all_cold`` functions print it."""
    return f" {format_gib(per_cpu, 7)} | {format_gib(per_gpu, 6)} | {options}"


def _header(total_params: int, num_gpus_per_node: int, num_nodes: int,
            extra: str = "") -> list[str]:
    nodes_str = "nodes" if num_nodes > 1 else "node"
    gpus_str = "GPUs" if num_gpus_per_node > 1 else "GPU"
    return ["Estimated memory needed for params, optim states and gradients for a:",
            f"HW: Setup with {num_nodes} {nodes_str}, {num_gpus_per_node} {gpus_str} per node.",
            f"SW: Model with {int(total_params / 1e6)}M total params{extra}.",
            "  per CPU  |  per GPU |   Options"]


def zero2_table(total_params, num_gpus_per_node=1, num_nodes=1,
                additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR,
                formula: str = "v0.14.3") -> list[str]:
    """The lines ``estimate_zero2_model_states_mem_needs_all_cold`` prints."""
    params = check_single(total_params, check_params, "total_params")
    per_node = check_single(num_gpus_per_node, check_gpus, "num_gpus_per_node")
    nodes = check_single(num_nodes, check_gpus, "num_nodes")
    lines = _header(params, per_node, nodes)
    for offload in (True, False):
        lines.append(estimate_zero2(params, per_node, nodes, offload, additional_buffer_factor,
                                    formula).row())
    return lines


def zero3_table(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1,
                additional_buffer_factor=ADDITIONAL_BUFFER_FACTOR) -> list[str]:
    """The lines ``estimate_zero3_model_states_mem_needs_all_cold`` prints."""
    params = check_single(total_params, check_params, "total_params")
    largest = check_single(largest_layer_params, check_params, "largest_layer_params")
    per_node = check_single(num_gpus_per_node, check_gpus, "num_gpus_per_node")
    nodes = check_single(num_nodes, check_gpus, "num_nodes")
    lines = _header(params, per_node, nodes, f", {int(largest / 1e6)}M largest layer params")
    for offload, offload_params in ((True, True), (True, False), (False, False)):
        for init in (True, False):
            lines.append(estimate_zero3(params, largest, per_node, nodes, offload, offload_params,
                                        init, additional_buffer_factor).row())
    return lines


# --- DeepSpeed's buffers that neither estimator counts ---------------------------------------

# DeepSpeed's zero_optimization defaults are the working set's own constants (with their
# source there): REDUCE_BUCKET_SIZE, ALLGATHER_BUCKET_SIZE, STAGE3_* in elements.


@dataclass(frozen=True)
class BufferDefault:
    """One DeepSpeed setting that sizes memory outside the model-state formulas."""

    key: str            # the zero_optimization config key
    elements: int       # its default, in elements
    stages: tuple[int, ...]
    what: str


BUFFER_DEFAULTS = (
    BufferDefault("reduce_bucket_size", REDUCE_BUCKET_SIZE, (1, 2, 3),
                  "bucket gradients are reduced through; stages 1-2 allocate it during backward "
                  "and free it after the reduction, stage 3 allocates it once and keeps it"),
    BufferDefault("allgather_bucket_size", ALLGATHER_BUCKET_SIZE, (1, 2),
                  "bounds the all-gather of updated parameters inside the step (temporary)"),
    BufferDefault("stage3_prefetch_bucket_size", STAGE3_PREFETCH_BUCKET_SIZE, (3,),
                  "parameters fetched ahead of the layer that needs them"),
    BufferDefault("stage3_max_live_parameters", STAGE3_MAX_LIVE_PARAMETERS, (3,),
                  "gathered parameters kept alive for reuse in backward: below 1e9 parameters, "
                  "the whole model after the forward"),
    BufferDefault("stage3_param_persistence_threshold", STAGE3_PARAM_PERSISTENCE_THRESHOLD, (3,),
                  "tensors smaller than this are never partitioned: every rank keeps them whole"),
)


def buffer_defaults(element_bytes: int = 2):
    """DeepSpeed's buffer defaults as a table: config key, elements, bytes at ``element_bytes``
    per element (2 for bf16/fp16, 4 for fp32), stages, what the buffer is."""
    import pandas as pd
    if isinstance(element_bytes, bool) or element_bytes not in (2, 4):
        raise ValueError(f"element_bytes must be 2 (bf16/fp16) or 4 (fp32), got {element_bytes!r}")
    return pd.DataFrame({
        "config key": [b.key for b in BUFFER_DEFAULTS],
        "default [elements]": [b.elements for b in BUFFER_DEFAULTS],
        f"at {element_bytes} B per element [B]": [b.elements * element_bytes
                                                   for b in BUFFER_DEFAULTS],
        "stages": [", ".join(map(str, b.stages)) for b in BUFFER_DEFAULTS],
        "what it is": [b.what for b in BUFFER_DEFAULTS],
    })


# --- The chapter's formula turned into DeepSpeed's, term by term -----------------------------

CHAPTER_LAYOUT = "mixed-adam"  # 2 + 2 + 12: the recipe DeepSpeed's multipliers assume
GAP_COLUMNS = ("ZeRO-2, v0.14.3 on", "ZeRO-2, up to v0.14.2 (the docs)", "ZeRO-3")
# Each row names the bytes it adds (P parameters, N GPUs, L largest-layer parameters).
GAP_TERMS = (
    "chapter (2 + 2 + 12 B per parameter)",
    "+ fp16 gradients not partitioned: 2 B x (P - P/N)",   # the pre-v0.14.3 ZeRO-2 term 4P
    "+ fp32 gradient shard for the step: 4 B x P/N",       # memory.rst: "converted into fp32"
    "- fp16 gradient shard (not in the 18): 2 B x P/N",   # ZeRO-3's 18 = 2 fp16 params + 16 fp32
    "+ gathered largest layer: 4 B x L",                  # 2 B fp16 params + 2 B fp16 grads
    "rounding: ceil(P/N) vs int(k P/N)",
    "= DeepSpeed's estimate per GPU",
)


def convention_gap(total_params, largest_layer_params, num_gpus_per_node=1, num_nodes=1):
    """How the chapter's per-GPU model state becomes DeepSpeed's per-GPU estimate (no offload).

    One column per estimator (ZeRO-2 as coded since v0.14.3, ZeRO-2 as coded up to v0.14.2,
    which the documentation prints, and ZeRO-3), one row per term of :data:`GAP_TERMS`, in
    bytes: the rows above the last add up to the last. A term an estimator lacks is 0.
    """
    import pandas as pd
    params = check_single(total_params, check_params, "total_params")
    largest = check_single(largest_layer_params, check_params, "largest_layer_params")
    per_node = check_single(num_gpus_per_node, check_gpus, "num_gpus_per_node")
    nodes = check_single(num_nodes, check_gpus, "num_nodes")
    if largest > params:
        raise ValueError("largest_layer_params must not exceed total_params")
    gpus = per_node * nodes

    def chapter(stage):
        return int(model_state(params, gpus, stage, CHAPTER_LAYOUT).total)

    shard = params // gpus  # P/N whole; what truncation leaves over goes to the rounding row
    columns = {
        GAP_COLUMNS[0]: (chapter(2), 0, 4 * shard, 0, 0,
                         estimate_zero2(params, per_node, nodes, cpu_offload=False).per_gpu),
        GAP_COLUMNS[1]: (chapter(2), 2 * (params - shard), 4 * shard, 0, 0,
                         estimate_zero2(params, per_node, nodes, cpu_offload=False,
                                        formula="v0.14.2").per_gpu),
        GAP_COLUMNS[2]: (chapter(3), 0, 4 * shard, -2 * shard, GATHERED_LAYER_BYTES * largest,
                         estimate_zero3(params, largest, per_node, nodes, cpu_offload=False,
                                        cpu_offload_params=False).per_gpu),
    }
    table = {}
    for name, (*terms, estimate) in columns.items():
        table[name] = [*terms, estimate - sum(terms), estimate]
    return pd.DataFrame(table, index=pd.Index(GAP_TERMS, name="term"), dtype="int64")
