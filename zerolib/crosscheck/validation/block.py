"""A small GPT-style transformer block for measuring saved activations (needs PyTorch).

Pre-norm, as GPT-2 and Korthikanti et al. Sec. 4.1: x + Dropout(Proj(Attention(LN(x)))), then
x + Dropout(FC2(GeLU(FC1(LN(x))))) with FC1 4h wide. ``forward(x, notes)`` writes into
``notes`` (storage address -> (label, tensor)) a label for every tensor it knows autograd will
keep, so the measurement can say which saved tensor is which:

- the block's own intermediates (it holds them), and
- tensors the ops save internally, read from the node that saved them (``grad_fn._saved_*``):
  LayerNorm's per-token mean and 1/std, and F.dropout's noise on the CPU.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

DROPOUT_KERNELS = ("native", "functional")
ATTENTIONS = ("explicit", "sdpa")


def _note(notes, label: str, tensor) -> None:
    """First label wins; the tensor is kept alive so its address cannot be reused meanwhile."""
    if notes is not None and tensor is not None:
        notes.setdefault(tensor.untyped_storage().data_ptr(), (label, tensor))


def _note_saved(notes, label: str, tensor: torch.Tensor, attribute: str) -> None:
    """Label a tensor the op that made ``tensor`` saved for backward (absent under no_grad)."""
    node = tensor.grad_fn
    if node is not None and hasattr(node, attribute):
        _note(notes, label, getattr(node, attribute))


class GPTBlock(nn.Module):
    """One transformer layer; ``dropout_kernel`` and ``attention`` pick the ops measured.

    dropout_kernel "native": ``torch.native_dropout``, the kernel CUDA's F.dropout runs; it saves
    a 1-byte bool mask. "functional": ``F.dropout``, which on the CPU multiplies by a noise tensor
    in the activation dtype and saves that. attention "explicit": softmax(QK^T/sqrt(d) + causal)
    with dropout, then x V; "sdpa": ``F.scaled_dot_product_attention`` (a flash kernel on the CPU,
    which offers no dropout there, so attention dropout is off). ``selective`` recomputes the
    attention core (QK^T, softmax, dropout, x V) in backward, as Korthikanti et al. Sec. 5.
    """

    def __init__(self, hidden: int, heads: int, max_seq: int, *, dropout_p: float = 0.1,
                 dropout_kernel: str = "native", attention: str = "explicit",
                 selective: bool = False):
        super().__init__()
        if dropout_kernel not in DROPOUT_KERNELS:
            raise ValueError(f"dropout_kernel must be one of {DROPOUT_KERNELS}, "
                             f"got {dropout_kernel!r}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        self.heads, self.dropout_p = heads, dropout_p
        self.dropout_kernel, self.attention, self.selective = dropout_kernel, attention, selective
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)
        # Additive causal bias: adding saves nothing for backward (masked_fill would save a mask).
        causal = torch.full((max_seq, max_seq), float("-inf")).triu(1)
        self.register_buffer("causal_bias", causal, persistent=False)

    def _dropout(self, x, label, notes):
        if self.dropout_p == 0:
            return x
        if self.dropout_kernel == "native":
            out, mask = torch.native_dropout(x, self.dropout_p, True)
            if out.grad_fn is not None:
                _note(notes, label, mask)
            return out
        out = F.dropout(x, self.dropout_p, training=True)
        _note_saved(notes, label, out, "_saved_other")  # CPU: x * noise, noise saved
        return out

    def _norm(self, norm, x, label, notes):
        out = norm(x)
        _note_saved(notes, f"{label} mean", out, "_saved_result1")
        _note_saved(notes, f"{label} 1/std", out, "_saved_result2")
        return out

    def _core(self, q, k, v, notes=None):
        """softmax(QK^T / sqrt(d) + causal) -> dropout -> x V, per head."""
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        probs = torch.softmax(scores + self.causal_bias[:s, :s].to(scores.dtype), dim=-1)
        _note(notes, "softmax output", probs)
        dropped = self._dropout(probs, "attention dropout mask", notes)
        _note(notes, "attention dropout output", dropped)
        return dropped @ v

    def forward(self, x, notes: dict | None = None):
        b, s, h = x.shape
        a = self.heads
        _note(notes, "block input", x)
        normed = self._norm(self.ln1, x, "attention norm", notes)
        _note(notes, "QKV projection input", normed)
        # One contiguous per-head copy holds Q, K and V: the tensors QK^T and x V save.
        qkv = self.qkv(normed).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4).contiguous()
        _note(notes, "Q, K, V (per-head layout)", qkv)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if self.attention == "sdpa":
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.selective:
            context = checkpoint(self._core, q, k, v, use_reentrant=True)
        else:
            context = self._core(q, k, v, notes)
        merged = context.transpose(1, 2).reshape(b, s, h)
        _note(notes, "output projection input", merged)
        if self.attention == "sdpa":  # after `merged`: the flash output may be the same storage
            _note_saved(notes, "flash output", context, "_saved_output")
            _note_saved(notes, "flash log-sum-exp", context, "_saved_logsumexp")
        x = x + self._dropout(self.proj(merged), "attention output dropout mask", notes)
        _note(notes, "MLP norm input", x)
        normed = self._norm(self.ln2, x, "MLP norm", notes)
        _note(notes, "MLP input", normed)
        up = self.fc1(normed)
        _note(notes, "GeLU input", up)
        act = F.gelu(up)
        _note(notes, "GeLU output", act)
        return x + self._dropout(self.fc2(act), "MLP dropout mask", notes)
