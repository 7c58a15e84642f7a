"""A real tensor-parallel step on the CPU, measured per rank (needs PyTorch).

``measure_tensor_parallel(workers)`` starts ``workers`` processes through the shared harness
(gloo on 127.0.0.1), builds :class:`llama_block.TinyLlama` from
``explain_tensor_parallel.TINY_LLAMA`` with the same weights on every rank, applies
``torch.distributed.tensor.parallel.parallelize_module`` with
``llama_block.tensor_parallel_plan`` on a 1-D device mesh of all ranks, and on each rank records

- ``parameters``: every parameter's local shard (a DTensor's ``to_local()``; a replicated norm
  weight as is), summed per zerolib module name over the layers;
- ``activations``: every distinct storage autograd saves for backward while the first decoder
  block runs (``torch.autograd.graph.saved_tensors_hooks``; a DTensor counts its local tensor),
  parameters and buffers left out, labelled by the block; then the rest of the model, the loss
  and a real backward pass.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from zerolib.crosscheck.validation.explain_tensor_parallel import SHAPE, TINY_LLAMA
from zerolib.crosscheck.validation.harness import join_gloo, spawn
from zerolib.crosscheck.validation.llama_block import TinyLlama, tensor_parallel_plan

SEED = 0


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _shape_text(shape) -> str:
    return "x".join(str(n) for n in shape)


def _parameter_rows(model, rank: int, workers: int) -> list[dict]:
    by_module: dict[str, dict] = {}
    for name, parameter in model.named_parameters():
        module = name.split(".")[-2]               # layers.0.query_projection.weight -> query_projection
        local = _local(parameter)
        row = by_module.setdefault(module, {"kind": "parameters", "workers": workers, "rank": rank,
                                            "item": module, "saved_dtype": str(local.dtype).removeprefix("torch."),
                                            "shape": _shape_text(local.shape), "tensors": 0,
                                            "measured_bytes": 0})
        row["tensors"] += 1
        row["measured_bytes"] += local.untyped_storage().nbytes()
    return list(by_module.values())


def _activation_rows(model, rank: int, workers: int) -> list[dict]:
    generator = torch.Generator().manual_seed(SEED)     # the same tokens on every rank
    ids = torch.randint(0, TINY_LLAMA.vocab, (SHAPE.micro_batch, SHAPE.seq_len), generator=generator)
    saved: dict[int, tuple[int, tuple, torch.dtype]] = {}

    def pack(tensor):
        local = getattr(tensor, "_local_tensor", tensor)
        storage = local.untyped_storage()
        saved.setdefault(storage.data_ptr(), (storage.nbytes(), tuple(local.shape), local.dtype))
        return tensor

    notes: dict = {}
    hidden = model.embedding(ids)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        hidden = model.layers[0](hidden, notes)
    for layer in model.layers[1:]:
        hidden = layer(hidden)
    logits = model.output_projection(model.final_norm(hidden))
    F.cross_entropy(logits.float().flatten(0, 1), ids.flatten()).backward()   # a real backward
    state = {_local(t).untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    rows = []
    for address, (nbytes, shape, dtype) in saved.items():
        if address in state or nbytes == 0:
            continue
        label = notes[address][0] if address in notes else f"unlabelled {_shape_text(shape)} {dtype}"
        rows.append({"kind": "activations", "workers": workers, "rank": rank, "item": label,
                     "saved_dtype": str(dtype).removeprefix("torch."), "shape": _shape_text(shape),
                     "tensors": 1, "measured_bytes": nbytes})
    return rows


def _rank(rank: int, workers: int) -> list[dict]:
    join_gloo()
    mesh = init_device_mesh("cpu", (workers,))
    torch.manual_seed(SEED)                                  # the same initial weights everywhere
    model = TinyLlama(TINY_LLAMA).to(torch.bfloat16)
    parallelize_module(model, mesh, tensor_parallel_plan(TINY_LLAMA))
    rows = _parameter_rows(model, rank, workers) + _activation_rows(model, rank, workers)
    dist.barrier()
    return rows


def measure_tensor_parallel(workers: int) -> list[dict]:
    """Measured rows (parameters per module, saved activations per storage) of every rank."""
    return [row for rows in spawn(_rank, workers) for row in rows]
