"""Measure what one GPT block saves for backward on the CPU (needs PyTorch).

Every tensor autograd packs is seen by ``torch.autograd.graph.saved_tensors_hooks``; each
distinct storage (``untyped_storage().data_ptr()``) counts once with its full size, so Q, K
and V saved as views of one buffer count as that buffer. The block's parameters are model
state, not activations, and are left out.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from zerolib.crosscheck.validation.block import GPTBlock
from zerolib.crosscheck.validation.explain_activations import (
    CASES,
    SHAPE,
    ActivationCase,
    BlockShape,
)

SEED = 0
DROPOUT_P = 0.1
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _shape_text(shape) -> str:
    return "x".join(str(n) for n in shape)


def measure_case(case: ActivationCase, shape: BlockShape = SHAPE) -> list[dict]:
    """One row per distinct saved storage: case, item, saved_dtype, saved_shape, measured_bytes."""
    torch.manual_seed(SEED)
    dtype = DTYPES[case.dtype]
    block = GPTBlock(shape.hidden, shape.heads, shape.seq_len, dropout_p=DROPOUT_P,
                     dropout_kernel=case.dropout_kernel, attention=case.attention,
                     selective=case.recompute == "selective").to(dtype).train()
    x = torch.randn(shape.micro_batch, shape.seq_len, shape.hidden, dtype=dtype,
                    requires_grad=True)
    saved: dict[int, tuple[int, tuple, torch.dtype]] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved.setdefault(storage.data_ptr(), (storage.nbytes(), tuple(tensor.shape), tensor.dtype))
        return tensor

    notes: dict = {}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        if case.recompute == "full":
            out = checkpoint(block, x, notes, use_reentrant=True)
        else:
            out = block(x, notes)
    out.float().square().mean().backward()  # the saved tensors suffice for a real backward
    state = {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    rows = []
    for address, (nbytes, tensor_shape, tensor_dtype) in saved.items():
        if address in state or nbytes == 0:
            continue
        label = notes[address][0] if address in notes else (
            f"unlabelled {_shape_text(tensor_shape)} {tensor_dtype}")
        rows.append({"case": case.name, "item": label,
                     "saved_dtype": str(tensor_dtype).removeprefix("torch."),
                     "saved_shape": _shape_text(tensor_shape), "measured_bytes": nbytes})
    return rows


def measure_activations(cases=CASES, shape: BlockShape = SHAPE) -> list[dict]:
    """``measure_case`` for every case, in order."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # same kernels every time; the shapes are tiny
    try:
        return [row for case in cases for row in measure_case(case, shape)]
    finally:
        torch.set_num_threads(previous)
