"""A real sharded training step on the CPU, measured per rank (needs PyTorch).

``measure_sharded(workers)`` starts ``workers`` processes through the shared harness
(:mod:`zerolib.crosscheck.validation.harness`: gloo on 127.0.0.1) and in each trains every
model of ``setups.TINY_MODELS`` under every strategy of ``setups.STRATEGIES`` that runs on that
many ranks (HSDP needs at least two shard groups):

1. one step: forward, backward, ``optimizer.step()``; then measure "rest";
2. ``zero_grad(set_to_none=False)`` (gradient buffers stay allocated, as the ZeRO accounting
   assumes) and the next forward, sampling after every layer's forward (before FSDP can
   reshard it) and after the whole forward, before backward; the sample with the most bytes
   is "peak".

A measurement counts each distinct storage once (``untyped_storage().data_ptr()``), with its
full size: a view into a padded or bucketed buffer counts the whole buffer. Categories:
parameters (the sharded parameters plus whatever the module holds at that moment, e.g.
gathered full parameters), gradients (``.grad`` of both), optimizer (every tensor in the
optimizer's state, step counters included).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

with warnings.catch_warnings():
    # Importing torch.distributed.optim scripts its functional optimizers with torch.jit.script,
    # which warns that it is deprecated (PyTorch 2.13); nothing for this module to act on.
    warnings.simplefilter("ignore", DeprecationWarning)
    from torch.distributed.optim import ZeroRedundancyOptimizer

from zerolib.core.memory.accounting import CATEGORIES
from zerolib.crosscheck.validation.harness import build_linear_stack, join_gloo, spawn
from zerolib.crosscheck.validation.setups import STRATEGIES, TINY_MODELS, ModelSpec, Strategy

SEED = 0
BATCH = 8
LEARNING_RATE = 1e-3


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank; a plain tensor as is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _count(tensors, seen: set) -> tuple[int, int]:
    """(bytes, storages) of the distinct non-empty storages behind ``tensors`` not yet ``seen``."""
    total = count = 0
    for tensor in tensors:
        if tensor is None:
            continue
        storage = _local(tensor).untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
        count += 1
    return total, count


def _snapshot(sharded_params, module, optimizer_state) -> dict:
    """Bytes and storages per category live right now on this rank."""
    with torch.no_grad():
        current = list(module.parameters())
        groups = {
            "parameters": [*sharded_params, *current],
            "gradients": [p.grad for p in (*sharded_params, *current)],
            "optimizer": [v for state in optimizer_state.values() for v in state.values()
                          if isinstance(v, torch.Tensor)],
        }
        seen: set = set()
        return {category: _count(groups[category], seen) for category in CATEGORIES}


def _mesh(strategy: Strategy, workers: int):
    """HSDP's 2-D mesh (replicate, shard): dim 0 replicates, dim 1 shards (FSDP2's
    ``fully_shard`` docs: a 2-D mesh gives ``(Replicate(), Shard(0))`` placements)."""
    if strategy.shard_group is None:
        return None
    return init_device_mesh("cpu", (workers // strategy.shard_group, strategy.shard_group),
                            mesh_dim_names=("replicate", "shard"))


def wrap(strategy: Strategy, model: nn.Sequential, layers: list[nn.Linear], workers: int):
    """(module to call, optimizer, optimizer state dict) for this strategy."""
    if strategy.kind in ("ddp", "zero1"):
        wrapped = DistributedDataParallel(model, gradient_as_bucket_view=True)
        if strategy.kind == "ddp":
            optimizer = torch.optim.AdamW(wrapped.parameters(), lr=LEARNING_RATE)
            return wrapped, optimizer, optimizer.state
        optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.AdamW,
                                            lr=LEARNING_RATE)
        return wrapped, optimizer, optimizer.optim.state  # the rank's own (partitioned) AdamW
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if strategy.bf16_compute else MixedPrecisionPolicy())
    mesh = _mesh(strategy, workers)   # None: FSDP2's default, all ranks
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward,
                    mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=strategy.reshard_after_forward,
                mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    return model, optimizer, optimizer.state


def _rows(strategy, spec, workers, rank, phase, snapshot, where) -> list[dict]:
    return [{"strategy": strategy.name, "model": spec.name, "workers": workers, "rank": rank,
             "phase": phase, "category": category, "measured_bytes": snapshot[category][0],
             "storages": snapshot[category][1], "sampled_at": where}
            for category in CATEGORIES]


def _measure_one(strategy: Strategy, spec: ModelSpec, rank: int, workers: int) -> list[dict]:
    model, layers = build_linear_stack(spec, SEED)  # the same initial weights on every rank
    wrapped, optimizer, state = wrap(strategy, model, layers, workers)
    sharded = list(model.parameters())  # FSDP2: the DTensor shards; otherwise the parameters
    generator = torch.Generator().manual_seed(SEED + rank)  # each rank its own batch
    inputs = torch.randn(BATCH, spec.widths[0], generator=generator)

    wrapped(inputs).square().mean().backward()
    optimizer.step()
    rest = _snapshot(sharded, model, state)
    rows = _rows(strategy, spec, workers, rank, "rest", rest, "after step")

    optimizer.zero_grad(set_to_none=False)
    samples = []

    def sample(where):
        samples.append((where, _snapshot(sharded, model, state)))

    # prepend=True: run before FSDP2's own post-forward hook, which may reshard the layer.
    handles = [layer.register_forward_hook(lambda *_, i=i: sample(f"after layer {i} forward"),
                                           prepend=True) for i, layer in enumerate(layers)]
    wrapped(inputs)
    sample("after forward")
    for handle in handles:
        handle.remove()
    where, peak = max(samples, key=lambda s: sum(b for b, _ in s[1].values()))  # first on ties
    rows += _rows(strategy, spec, workers, rank, "peak", peak, where)
    dist.barrier()
    return rows


def _rank(rank: int, workers: int) -> list[dict]:
    join_gloo()
    return [row for spec in TINY_MODELS.values() for strategy in STRATEGIES.values()
            if strategy.runs_on(workers) for row in _measure_one(strategy, spec, rank, workers)]


def measure_sharded(workers: int) -> list[dict]:
    """Measured rows (one per strategy, model, rank, phase, category) from ``workers`` processes."""
    return [row for rows in spawn(_rank, workers) for row in rows]
