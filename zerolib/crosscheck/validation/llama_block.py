"""A tiny Llama-style model for the tensor-parallel run (needs PyTorch).

Module names are zerolib's (:func:`zerolib.core.catalogue.models.modules`), so a measured parameter maps to
its split rule by name: ``embedding``, per layer ``attention_norm``, ``query_projection``,
``key_projection``, ``value_projection``, ``attention_output_projection``, ``mlp_norm``,
``mlp_gate_projection``, ``mlp_up_projection``, ``mlp_down_projection``, then ``final_norm``
and ``output_projection``. The block is Llama's: RMSNorm (``torch.nn.RMSNorm``), rotary
positions, grouped-query attention through ``F.scaled_dot_product_attention(enable_gqa=True)``
(the CPU's flash kernel), SwiGLU ``down(silu(gate(x)) * up(x))``, no biases, no dropout.

``Block.forward(x, notes)`` labels every tensor it knows autograd will keep (storage address ->
(label, tensor)), as ``block.GPTBlock`` does: its own intermediates, and what the ops save
internally (read from ``grad_fn._saved_*``): RMSNorm's fp32 copy of its input, its per-token
1/rms and its normalised fp32 values; the attention kernel's output and log-sum-exp.

:func:`tensor_parallel_plan` is the tensor-parallel plan (``torch.distributed.tensor.parallel``): the vocabulary
-parallel embedding and output layer, column-parallel Q, K, V, gate and up projections,
row-parallel attention-output and down projections; the norms stay whole on every rank.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from zerolib.core.catalogue.models import TransformerConfig

ROPE_THETA = 10_000.0


def _note(notes, label: str, tensor) -> None:
    """First label wins; the tensor is kept alive so its address cannot be reused meanwhile."""
    if notes is not None and tensor is not None:
        local = getattr(tensor, "_local_tensor", tensor)
        notes.setdefault(local.untyped_storage().data_ptr(), (label, local))


def _saved(node, attribute: str):
    return getattr(node, attribute, None) if node is not None else None


def _rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Block(nn.Module):
    """One Llama decoder layer; the number of local heads follows the projections' width."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        h, d = config.hidden, config.head_width
        self.head_dim = d
        self.attention_norm = nn.RMSNorm(h, eps=1e-5)
        self.query_projection = nn.Linear(h, config.heads * d, bias=False)
        self.key_projection = nn.Linear(h, config.kv_heads * d, bias=False)
        self.value_projection = nn.Linear(h, config.kv_heads * d, bias=False)
        self.attention_output_projection = nn.Linear(config.heads * d, h, bias=False)
        self.mlp_norm = nn.RMSNorm(h, eps=1e-5)
        self.mlp_gate_projection = nn.Linear(h, config.ffn_hidden, bias=False)
        self.mlp_up_projection = nn.Linear(h, config.ffn_hidden, bias=False)
        self.mlp_down_projection = nn.Linear(config.ffn_hidden, h, bias=False)
        inverse = 1.0 / ROPE_THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = torch.outer(torch.arange(config.max_positions, dtype=torch.float32), inverse)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _norm(self, norm, x, label, notes):
        out = norm(x)
        # torch 2.13's CPU rms_norm: upcast to fp32, x * rsqrt(mean(x^2) + eps), times the weight
        # (in fp32), cast back. The weight product saves the normalised fp32 values; the first
        # product saves the fp32 input and the per-token 1/rms.
        weighted = out.grad_fn.next_functions[0][0] if out.grad_fn is not None else None
        normalised = weighted.next_functions[0][0] if weighted is not None else None
        _note(notes, f"{label} normalised (fp32)", _saved(weighted, "_saved_self"))
        _note(notes, f"{label} input (fp32 copy)", _saved(normalised, "_saved_self"))
        _note(notes, f"{label} 1/rms (fp32)", _saved(normalised, "_saved_other"))
        return out

    def _rope(self, x):
        s = x.shape[-2]
        cos, sin = self.cos[:s], self.sin[:s]          # views of the buffers: nothing new saved
        return x * cos + _rotate_half(x) * sin

    def forward(self, x, notes: dict | None = None):
        b, s, _ = x.shape
        normed = self._norm(self.attention_norm, x, "attention norm", notes)
        _note(notes, "QKV projection input", normed)
        q = self._rope(self.query_projection(normed).view(b, s, -1, self.head_dim).transpose(1, 2))
        k = self._rope(self.key_projection(normed).view(b, s, -1, self.head_dim).transpose(1, 2))
        v = self.value_projection(normed).view(b, s, -1, self.head_dim).transpose(1, 2)
        _note(notes, "query (rotated)", q)
        _note(notes, "key (rotated)", k)
        _note(notes, "value", v)
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        merged = context.transpose(1, 2).reshape(b, s, -1)
        _note(notes, "output projection input", merged)
        _note(notes, "flash output", _saved(context.grad_fn, "_saved_output"))
        _note(notes, "flash log-sum-exp", _saved(context.grad_fn, "_saved_logsumexp"))
        x = x + self.attention_output_projection(merged)
        normed = self._norm(self.mlp_norm, x, "MLP norm", notes)
        _note(notes, "MLP input", normed)
        gate = self.mlp_gate_projection(normed)
        _note(notes, "gate projection output", gate)
        activated = F.silu(gate)
        _note(notes, "SiLU output", activated)
        up = self.mlp_up_projection(normed)
        _note(notes, "up projection output", up)
        product = activated * up
        _note(notes, "down projection input", product)
        return x + self.mlp_down_projection(product)


class TinyLlama(nn.Module):
    """Embedding, ``config.layers`` blocks, final RMSNorm, untied output layer."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.tied_embeddings or not config.gated_mlp or config.norm != "rmsnorm":
            raise ValueError("TinyLlama builds untied, gated, RMSNorm models only")
        self.embedding = nn.Embedding(config.vocab, config.hidden)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.final_norm = nn.RMSNorm(config.hidden, eps=1e-5)
        self.output_projection = nn.Linear(config.hidden, config.vocab, bias=False)


def tensor_parallel_plan(config: TransformerConfig) -> dict:
    """``parallelize_module``'s plan for :class:`TinyLlama` (module path -> style)."""
    out = {"embedding": RowwiseParallel(input_layouts=Replicate()),
           "output_projection": ColwiseParallel(output_layouts=Replicate())}
    for index in range(config.layers):
        for name in ("query_projection", "key_projection", "value_projection",
                     "mlp_gate_projection", "mlp_up_projection"):
            out[f"layers.{index}.{name}"] = ColwiseParallel()
        for name in ("attention_output_projection", "mlp_down_projection"):
            out[f"layers.{index}.{name}"] = RowwiseParallel()
    return out
