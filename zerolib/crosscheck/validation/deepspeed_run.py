"""Measure what DeepSpeed's ZeRO stages 0-3 really hold per rank, on the CPU.

    DS_ACCELERATOR=cpu python -m zerolib.crosscheck.validation.deepspeed_run --out data/deepspeed_measured.csv

Launches 2 and 4 ranks on 127.0.0.1 (torch.multiprocessing, DeepSpeed's CPU accelerator with its
gloo backend), trains small Linear stacks for two steps under each stage with AdamW, and on every
rank counts the bytes of distinct tensor storages reachable from the DeepSpeed engine, sorted
into parameters, gradients, optimizer state, fp32 master weights, reduce buckets and other.
Beside each measurement it writes the chapter's formula (zerolib.core.memory.accounting.model_state) and
DeepSpeed's own estimator (zerolib.crosscheck.deepspeed_estimator) for the same model, plus the versions used.
What the numbers show is explained in data/deepspeed_convention.md.

Needs the optional extra ``deepspeed`` (DeepSpeed built with DS_BUILD_OPS=0 and the CPU build of
torch); everything else in zerolib works without it. The notebook and the tests read the
recorded CSV; they never run this.
"""
from __future__ import annotations

import collections
import gc
import os
import platform
import types
from pathlib import Path
from typing import TYPE_CHECKING

from zerolib.core.memory.accounting import STAGES, model_state
from zerolib.crosscheck.deepspeed_estimator import estimate_zero2, estimate_zero3
from zerolib.crosscheck.validation.records import write_csv
from zerolib.crosscheck.validation.setups import ModelSpec

if TYPE_CHECKING:  # pandas is imported where a frame is built: commands that build none start without it
    pass

# The file the run writes into data/ (the notebook reads it with zerolib.crosscheck.validation.report).
RECORD_FILE = "deepspeed_measured.csv"

# "even": 1,837,312 parameters (a multiple of 4); "uneven": 1,838,337 (odd), so neither 2 nor 4
# ranks get equal shares without padding.
DEEPSPEED_MODELS = (ModelSpec("even", (512, 1024, 1024, 256), "512-1024-1024-256: a multiple of 4"),
          ModelSpec("uneven", (512, 1024, 1024, 257), "512-1024-1024-257: odd"))
WORKERS = (2, 4)
MICRO_BATCH = 4
# Measured on the second step, so the optimizer state of the first step exists.
DEEPSPEED_PHASES = ("after_forward", "before_reduction", "after_backward", "before_optimizer_step",
          "after_step")
# Precision -> the chapter's layout for the same training recipe (zerolib.core.memory.accounting.LAYOUTS).
PRECISIONS = {"fp32": "fp32-adam", "bf16": "mixed-adam"}
# bf16 with fp32 gradient accumulation ("data_types": {"grad_accum_dtype": "fp32"}): DeepSpeed's
# BF16_Optimizer at stage 1 (its layout: zerolib.core.deepspeed_config.BF16_OPTIMIZER), recorded
# apart in BF16_OPTIMIZER_FILE.
BF16_OPTIMIZER_PRECISION = "bf16-fp32-accum"
BF16_OPTIMIZER_FILE = "deepspeed_bf16_optimizer.csv"

MEASURED_CATEGORIES = ("parameters", "gradients", "optimizer", "master_weights", "buckets", "other")
COLUMNS = (
    "model", "precision", "workers", "rank", "stage", "phase", "params", "largest_layer_params",
    *(f"measured_{c}" for c in MEASURED_CATEGORIES), "measured_total",
    "formula_layout", "formula_parameters", "formula_gradients", "formula_optimizer",
    "formula_total",
    "deepspeed_estimator", "deepspeed_estimate_per_gpu", "deepspeed_estimate_per_cpu",
    "deepspeed_version", "torch_version", "python_version", "backend",
)
BUFFER_COLUMNS = ("model", "precision", "workers", "rank", "stage", "phase", "category",
                  "bytes", "where")


# --- Expected values (pure; no torch needed) ---------------------------------------------------

def formula_columns(spec: ModelSpec, workers: int, stage: int, precision: str) -> dict:
    """The chapter's per-worker bytes for the same model and recipe."""
    if precision == BF16_OPTIMIZER_PRECISION:
        from zerolib.core.deepspeed_config import BF16_OPTIMIZER as layout
    elif precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    else:
        layout = PRECISIONS[precision]
    state = model_state(spec.numel, workers, stage, layout)
    return {"formula_layout": getattr(layout, "name", layout),
            "formula_parameters": int(state.parameters), "formula_gradients": int(state.gradients),
            "formula_optimizer": int(state.optimizer), "formula_total": int(state.total)}


def estimator_columns(spec: ModelSpec, workers: int, stage: int) -> dict:
    """DeepSpeed's estimator for the run's setting: one node, no offload, no zero.Init.

    DeepSpeed only ships estimators for ZeRO-2 and ZeRO-3; stages 0 and 1 stay empty.
    """
    if stage == 2:
        estimate, name = estimate_zero2(spec.numel, workers, 1, cpu_offload=False), "zero2 v0.14.3"
    elif stage == 3:
        estimate = estimate_zero3(spec.numel, spec.largest_layer_params, workers, 1,
                                  cpu_offload=False, cpu_offload_params=False, zero_init=False)
        name = "zero3"
    else:
        return {"deepspeed_estimator": "", "deepspeed_estimate_per_gpu": "",
                "deepspeed_estimate_per_cpu": ""}
    return {"deepspeed_estimator": name, "deepspeed_estimate_per_gpu": estimate.per_gpu,
            "deepspeed_estimate_per_cpu": estimate.per_cpu}


# --- Inside a rank: walk the engine and classify storages --------------------------------------

def _storage_key(tensor):
    storage = tensor.untyped_storage()
    return (str(tensor.device), storage.data_ptr()), storage.nbytes()


def _reachable_storages(root, root_name: str = "engine") -> dict:
    """Distinct tensor storages reachable from ``root``: key -> (bytes, [paths]).

    Follows containers, tensor attributes (``.grad``, DeepSpeed's ``ds_tensor``...) and the
    attributes of DeepSpeed / torch.nn / torch.optim objects. Meta tensors own no memory.
    """
    import torch

    found: dict = {}
    seen: set[int] = set()
    queue = collections.deque([(root_name, root)])
    while queue:
        path, obj = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta":
                key, nbytes = _storage_key(obj)
                if nbytes:
                    found.setdefault(key, [nbytes, []])[1].append(path)
            if obj.is_leaf and obj.grad is not None:
                queue.append((f"{path}.grad", obj.grad))
            queue.extend((f"{path}.{k}", v) for k, v in getattr(obj, "__dict__", {}).items())
        elif isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(k, torch.Tensor):
                    queue.append((f"{path}[<tensor key>]", k))
                label = k if isinstance(k, (str, int)) else f"<{type(k).__name__}>"
                queue.append((f"{path}[{label}]", v))
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            queue.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
        elif isinstance(obj, (types.FunctionType, types.MethodType, type, types.ModuleType)):
            continue
        elif type(obj).__module__.startswith(("deepspeed", "torch.nn", "torch.optim")) and hasattr(
                obj, "__dict__"):
            queue.extend((f"{path}.{k}", v) for k, v in vars(obj).items())
    return found


def _is_bucket_path(path: str) -> bool:
    # DeepSpeed's reduce buckets (ipg_buckets[dtype].buffer), sized by reduce_bucket_size.
    return "bucket" in path.lower()


def _is_gradient_path(path: str) -> bool:
    # Attributes DeepSpeed names after gradients (averaged_gradients, grads_in_partition,
    # grad_partitions_flat_buffer, ...), but not the scalar global gradient norm.
    lowered = path.lower()
    return "grad" in lowered.replace("grad_norm", "")


def _torch_optimizer(engine):
    """The torch optimizer itself (stage 0), or the one inside DeepSpeed's wrappers."""
    inner = engine.optimizer
    while type(inner).__module__.startswith("deepspeed") and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    return inner


def classify(engine) -> dict[str, list[tuple[int, str]]]:
    """Storages held by ``engine`` per category: {category: [(bytes, where), ...]}.

    Priority: a storage that backs a model parameter (its data, or its ZeRO-3 shard
    ``ds_tensor``) is "parameters"; one in the torch optimizer's state is "optimizer"; a tensor
    the torch optimizer updates that is not a model parameter is DeepSpeed's fp32
    "master_weights"; a reduce bucket (even while gradients are written into it) is "buckets";
    gradients of either kind of parameter, or a storage only reachable through a gradient
    attribute, is "gradients"; everything else (norms, overflow flags) is "other".
    """
    module = engine.module
    inner = _torch_optimizer(engine)

    def keys(tensors):
        return {_storage_key(t)[0] for t in tensors
                if t is not None and t.device.type != "meta" and t.untyped_storage().nbytes()}

    model_params = list(module.parameters())
    parameter_keys = keys([p.data for p in model_params]
                          + [getattr(p, "ds_tensor", None) for p in model_params])
    optimizer_keys = keys([v for state in inner.state.values() for v in state.values()
                           if hasattr(v, "untyped_storage")])
    # What the torch optimizer updates: its param groups, and the keys of its state (ZeRO-3
    # empties the groups between steps but keeps the fp32 shards as state keys).
    updated = [p for group in inner.param_groups for p in group["params"]] + list(inner.state)
    master_keys = keys(updated) - parameter_keys
    gradient_keys = keys([p.grad for p in model_params + updated])

    result: dict[str, list[tuple[int, str]]] = {c: [] for c in MEASURED_CATEGORIES}
    for key, (nbytes, paths) in _reachable_storages(engine).items():
        if key in parameter_keys:
            category = "parameters"
        elif key in optimizer_keys:
            category = "optimizer"
        elif key in master_keys:
            category = "master_weights"
        elif any(_is_bucket_path(p) for p in paths):
            category = "buckets"
        elif key in gradient_keys or any(_is_gradient_path(p) for p in paths):
            category = "gradients"
        else:
            category = "other"
        # Name the storage by the shortest path that explains its category.
        telling = [p for p in paths if _is_bucket_path(p)] if category == "buckets" else paths
        result[category].append((nbytes, min(telling, key=lambda p: (len(p), p))))
    return result


def _ds_config(stage: int, precision: str) -> dict:
    # Everything else stays at DeepSpeed's defaults (bucket sizes, persistence thresholds...).
    return {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage}, "bf16": {"enabled": precision.startswith("bf16")},
            **({"data_types": {"grad_accum_dtype": "fp32"}} if precision == BF16_OPTIMIZER_PRECISION
               else {}),
            "steps_per_print": 2**30, "wall_clock_breakdown": False}


def _measure_one(spec: ModelSpec, stage: int, precision: str, rank: int,
                 workers: int) -> tuple[list, list]:
    import deepspeed
    import torch

    from zerolib.crosscheck.validation.harness import build_linear_stack

    model, _ = build_linear_stack(spec, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config=_ds_config(stage, precision))
    generator = torch.Generator().manual_seed(1000 + rank)
    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float32
    inputs = torch.randn(MICRO_BATCH, spec.widths[0], generator=generator).to(dtype)
    targets = torch.randn(MICRO_BATCH, spec.widths[-1], generator=generator).to(dtype)
    rows, buffers = [], []
    base = {"model": spec.name, "precision": precision, "workers": workers, "rank": rank,
            "stage": stage}

    def record(phase):
        held = classify(engine)
        row = dict(base, phase=phase)
        for category in MEASURED_CATEGORIES:
            row[f"measured_{category}"] = sum(n for n, _ in held[category])
            for nbytes, where in sorted(held[category], key=lambda item: (-item[0], item[1])):
                if category in ("buckets", "other"):
                    buffers.append(dict(base, phase=phase, category=category, bytes=nbytes,
                                        where=where))
        row["measured_total"] = sum(row[f"measured_{c}"] for c in MEASURED_CATEGORIES)
        rows.append(row)

    # Gradients exist in full (stage 0/1) or in reduce buckets (stage 2/3) at the end of
    # autograd, before DeepSpeed's epilogue reduces and partitions them: wrap the engine's
    # reduction entry point to look just before it.
    reduce_gradients = engine.allreduce_gradients
    measuring = [False]

    def allreduce_gradients(*args, **kwargs):
        if measuring[0]:
            record("before_reduction")
        return reduce_gradients(*args, **kwargs)

    engine.allreduce_gradients = allreduce_gradients

    # Inside engine.step(), DeepSpeed hands the torch optimizer fp32 gradients for its shard
    # (ZeRO 1/2 build them then): look just before the torch optimizer's own step.
    inner = _torch_optimizer(engine)
    inner_step = inner.step

    def step_and_record(*args, **kwargs):
        if measuring[0]:
            record("before_optimizer_step")
        return inner_step(*args, **kwargs)

    inner.step = step_and_record
    for step in range(2):
        measuring[0] = step == 1
        loss = torch.nn.functional.mse_loss(engine(inputs).float(), targets.float())
        if step == 1:
            record("after_forward")
        engine.backward(loss)
        if step == 1:
            record("after_backward")
        engine.step()
    record("after_step")
    if hasattr(engine, "destroy"):  # drops ZeRO-3 hooks before the next stage's engine
        engine.destroy()
    gc.collect()
    return rows, buffers


def start_deepspeed() -> str:
    """In a rank's process: DeepSpeed on its CPU accelerator, its warnings and logs quiet, its
    process group started (the DeepSpeed runs' one start-up); returns the backend's name."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.utils import logger

    logger.setLevel(logging.ERROR)
    backend = get_accelerator().communication_backend_name()
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
    return backend


def _rank(rank: int, workers: int, jobs: list) -> dict:
    backend = start_deepspeed()
    import torch

    rows, buffers = [], []
    for name, stage, precision in jobs:
        spec = next(m for m in DEEPSPEED_MODELS if m.name == name)
        new_rows, new_buffers = _measure_one(spec, stage, precision, rank, workers)
        for row in new_rows:
            row["backend"] = backend
        rows += new_rows
        buffers += new_buffers
        torch.distributed.barrier()
    return {"rows": rows, "buffers": buffers}


def run(workers_list=WORKERS, stages=STAGES, precisions=tuple(PRECISIONS),
        models=DEEPSPEED_MODELS) -> tuple[list[dict], list[dict]]:
    """Launch each worker count, return (rows, other-buffer rows) sorted deterministically."""
    import deepspeed
    import torch

    from zerolib.crosscheck.validation.harness import spawn

    versions = {"deepspeed_version": deepspeed.__version__,
                "torch_version": torch.__version__,
                "python_version": platform.python_version()}
    jobs = [(m.name, s, p) for m in models for p in precisions for s in stages]
    rows, buffers = [], []
    for workers in workers_list:
        for record in spawn(_rank, workers, jobs):
            rows += record["rows"]
            buffers += record["buffers"]
    spec_by_name = {m.name: m for m in models}
    for row in rows:
        spec = spec_by_name[row["model"]]
        row.update(params=spec.numel, largest_layer_params=spec.largest_layer_params)
        row.update(formula_columns(spec, row["workers"], row["stage"], row["precision"]))
        row.update(estimator_columns(spec, row["workers"], row["stage"]))
        row.update(versions)

    def order(row):
        return (row["model"], row["precision"], row["workers"], row["stage"],
                DEEPSPEED_PHASES.index(row["phase"]), row["rank"])

    rows.sort(key=order)
    buffers.sort(key=lambda b: (*order(b), -b["bytes"], b["where"]))
    return rows, buffers


def buffers_path(out: Path) -> Path:
    """Where the per-storage list of 'buckets' and 'other' goes, beside the main CSV."""
    return out.with_name(out.stem + "_buffers" + out.suffix)


def record(rows: list[dict], buffers: list[dict], out: Path) -> tuple[Path, Path]:
    """Write both CSVs (atomically, deterministic): ``out`` and its ``_buffers`` list."""
    import pandas as pd
    write_csv(pd.DataFrame(rows, columns=list(COLUMNS)), out)
    write_csv(pd.DataFrame(buffers, columns=list(BUFFER_COLUMNS)), buffers_path(out))
    return out, buffers_path(out)
