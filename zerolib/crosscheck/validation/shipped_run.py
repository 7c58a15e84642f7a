"""Measure what shipped transformer blocks save for backward on the CPU (needs PyTorch and
transformers).

Each block runs inside a one-layer model built from a configuration written here (no download):
``GPT2Model`` and ``LlamaModel`` with bf16 weights, in training mode, on ``inputs_embeds`` of
``micro_batch`` x ``seq_len`` x ``hidden``, so the causal mask, the position embeddings and the
rotary tables come from the model as they would in training. Every tensor autograd packs while
the block runs is seen by ``torch.autograd.graph.saved_tensors_hooks``; each distinct storage
(``untyped_storage().data_ptr()``) counts once with its full size, so a saved view keeps its whole
base. Parameters and buffers are model state and are left out. Each storage is named by the
block's submodule that was running when it was first saved and by the first autograd node that
saved it (``NodeName.attribute``, read back from the graph).
"""
from __future__ import annotations

import torch
import transformers

from zerolib.crosscheck.validation.explain_shipped import BLOCKS, CASES, ShippedBlock

SEED = 0


def _model(block: ShippedBlock):
    if block.model == "gpt2":
        config = transformers.GPT2Config(
            n_embd=block.hidden, n_head=block.heads, n_layer=1, n_positions=block.seq_len,
            vocab_size=256, bos_token_id=None, eos_token_id=None, use_cache=block.use_cache,
            attn_implementation=block.attention)
        model = transformers.GPT2Model(config)
        return model, model.h[0]
    config = transformers.LlamaConfig(
        hidden_size=block.hidden, num_attention_heads=block.heads, num_key_value_heads=block.kv_heads,
        head_dim=block.head_dim, intermediate_size=block.ffn_hidden, num_hidden_layers=1,
        max_position_embeddings=block.seq_len, vocab_size=256, use_cache=block.use_cache,
        attn_implementation=block.attention)
    model = transformers.LlamaModel(config)
    return model, model.layers[0]


def _first_savers(output: torch.Tensor) -> dict[int, str]:
    """Storage address -> the first node (in forward order) that saved it, as Node.attribute."""
    nodes, seen, todo = [], set(), [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        todo += [child for child, _ in node.next_functions]
    savers: dict[int, str] = {}
    for node in sorted(nodes, key=lambda n: n._sequence_nr()):
        for attribute in sorted(a for a in dir(node) if a.startswith("_saved_")):
            value = getattr(node, attribute)
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    savers.setdefault(tensor.untyped_storage().data_ptr(),
                                      f"{node.name()}.{attribute.removeprefix('_saved_')}")
    return savers


def measure_case(block: ShippedBlock, micro_batch: int) -> list[dict]:
    """One row per distinct storage the block saved: block, micro_batch, module, saved_by,
    saved_dtype, saved_shape, measured_bytes (forward order)."""
    torch.manual_seed(SEED)
    model, layer = _model(block)
    model = model.to(torch.bfloat16).train()
    names = {module: name or "(block)" for name, module in layer.named_modules()}
    running: list[str] = []   # the block's submodules now in forward, innermost last

    def enter(module, args):
        running.append(names[module])

    def leave(module, args, output):
        running.pop()

    hooks = [hook for module in layer.modules()
             for hook in (module.register_forward_pre_hook(enter), module.register_forward_hook(leave))]
    saved: dict[int, tuple[str, int, tuple, torch.dtype, torch.Tensor]] = {}

    def pack(tensor):
        if running:
            storage = tensor.untyped_storage()
            saved.setdefault(storage.data_ptr(), (running[-1], storage.nbytes(), tuple(tensor.shape),
                                                  tensor.dtype, tensor))
        return tensor

    embeddings = torch.randn(micro_batch, block.seq_len, block.hidden, dtype=torch.bfloat16,
                             requires_grad=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            output = model(inputs_embeds=embeddings).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()
    savers = _first_savers(output)
    output.float().square().mean().backward()   # the saved tensors suffice for a real backward
    state = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    return [{"block": block.name, "micro_batch": micro_batch, "module": module,
             "saved_by": savers.get(address, "(no node)"),
             "saved_dtype": str(dtype).removeprefix("torch."),
             "saved_shape": "x".join(str(n) for n in shape), "measured_bytes": nbytes}
            for address, (module, nbytes, shape, dtype, _) in saved.items()
            if address not in state and nbytes]


def measure_shipped(cases=CASES) -> list[dict]:
    """``measure_case`` for every (block name, micro-batch) case, in order."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # same kernels every time; the shapes are tiny
    try:
        return [row for name, micro_batch in cases for row in measure_case(BLOCKS[name], micro_batch)]
    finally:
        torch.set_num_threads(previous)
