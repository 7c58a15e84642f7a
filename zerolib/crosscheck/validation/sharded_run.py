"""A real sharded training step on the CPU, measured per rank (needs PyTorch).

``measure_sharded(workers)`` starts ``workers`` processes (gloo on 127.0.0.1; the rendezvous
store listens on a free port the OS picks) and in each trains every model of ``setups.MODELS``
under every strategy of ``setups.STRATEGIES``:

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

import datetime
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

with warnings.catch_warnings():
    # Importing torch.distributed.optim scripts its functional optimizers with torch.jit.script,
    # which warns that it is deprecated (PyTorch 2.13); nothing for this module to act on.
    warnings.simplefilter("ignore", DeprecationWarning)
    from torch.distributed.optim import ZeroRedundancyOptimizer

from zerolib.core.accounting import CATEGORIES
from zerolib.crosscheck.validation.setups import MODELS, STRATEGIES, ModelSpec, Strategy

SEED = 0
BATCH = 8
LEARNING_RATE = 1e-3
TIMEOUT = datetime.timedelta(seconds=120)
HOST = "127.0.0.1"


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


def _build(spec: ModelSpec) -> tuple[nn.Sequential, list[nn.Linear]]:
    layers = [nn.Linear(inp, out) for inp, out in zip(spec.widths, spec.widths[1:])]
    modules: list[nn.Module] = []
    for index, layer in enumerate(layers):
        modules += [layer] if index == len(layers) - 1 else [layer, nn.ReLU()]
    return nn.Sequential(*modules), layers


def _wrap(strategy: Strategy, model: nn.Sequential, layers: list[nn.Linear]):
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
    for layer in layers:
        fully_shard(layer, reshard_after_forward=strategy.reshard_after_forward, mp_policy=policy)
    fully_shard(model, reshard_after_forward=strategy.reshard_after_forward, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    return model, optimizer, optimizer.state


def _rows(strategy, spec, workers, rank, phase, snapshot, where) -> list[dict]:
    return [{"strategy": strategy.name, "model": spec.name, "workers": workers, "rank": rank,
             "phase": phase, "category": category, "measured_bytes": snapshot[category][0],
             "storages": snapshot[category][1], "sampled_at": where}
            for category in CATEGORIES]


def _measure_one(strategy: Strategy, spec: ModelSpec, rank: int, workers: int) -> list[dict]:
    torch.manual_seed(SEED)  # the same initial weights on every rank
    model, layers = _build(spec)
    wrapped, optimizer, state = _wrap(strategy, model, layers)
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


def _worker(rank: int, workers: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # several ranks share two cores
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # stay on loopback
    store = dist.TCPStore(HOST, port, is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=workers, timeout=TIMEOUT)
    try:
        rows = [row for spec in MODELS.values() for strategy in STRATEGIES.values()
                for row in _measure_one(strategy, spec, rank, workers)]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(rows))
        dist.barrier()  # every rank has written its rows
    except BaseException:
        dist.destroy_process_group()
        raise
    # Done: leave without the interpreter's teardown. Destroying gloo's and the store's C++
    # threads at exit sometimes aborts the process ("terminate called without an active
    # exception", SIGABRT; seen about once in 20 runs here) after all the work is done.
    os._exit(0)


def measure_sharded(workers: int) -> list[dict]:
    """Measured rows (one per strategy, model, rank, phase, category) from ``workers`` processes."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
        raise ValueError(f"workers must be a whole number of processes >= 2, got {workers!r}")
    # The parent serves the rendezvous store on a port the OS picks and keeps it bound, so no
    # other program can take the port between choosing it and the workers connecting.
    store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    with tempfile.TemporaryDirectory(prefix="zerolib-validate-") as out_dir:
        mp.start_processes(_worker, args=(workers, store.port, out_dir), nprocs=workers,
                           join=True, start_method="spawn")
        return [row for rank in range(workers)
                for row in json.loads(Path(out_dir, f"rank{rank}.json").read_text())]
