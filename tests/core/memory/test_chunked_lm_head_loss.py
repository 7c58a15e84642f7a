"""torchtitan's ChunkedLossWrapper (torchtitan/components/loss.py at 73aed7f), the loss
``chunked-lm-head``: the output layer and the eager loss run one chunk of tokens at a time,
each chunk's backward at once, so only one chunk's logits are ever alive. By hand, then with
the real PyTorch code on the CPU."""
from __future__ import annotations

import pytest

from zerolib.core.memory.loss import LOSSES, loss_bytes


def test_one_chunk_of_logits_by_hand():
    assert "chunked-lm-head" in LOSSES
    # Qwen3 8B at 16 x 2,048 tokens per GPU, vocabulary 151,936, 8 chunks (the row
    # tt-nvfp4doc-qwen3-8b-bf16): 4,096 tokens x 151,936 = 622,329,856 logits a chunk, each the
    # bf16 logit 2 + the eager chain's fp32 log-softmax 4, its gradient 4, the input gradient 4.
    assert loss_bytes("chunked-lm-head", 32_768 * 151_936, chunks=8) == 14 * 622_329_856
    assert 14 * 622_329_856 == 8_712_617_984
    # the caller's logits never exist whole: freeing them changes nothing
    assert loss_bytes("chunked-lm-head", 1000, freed=True, chunks=3) == \
        loss_bytes("chunked-lm-head", 1000, chunks=3) == 14 * 334
    # against torchtune's chunked loss, which keeps every chunk's fp32 log-softmax
    assert loss_bytes("chunked", 8000, chunks=8) == 2 * 8000 + 4 * 8000 + 8 * 1000


def test_the_wrappers_loop_on_the_cpu_keeps_one_chunk():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from zerolib.crosscheck.validation.live_memory import StorageTracker

    tokens, hidden, vocab, chunks = 256, 64, 4096, 8
    torch.manual_seed(0)
    weight = torch.randn(vocab, hidden, dtype=torch.bfloat16)       # the output layer (frozen
    hidden_states = torch.randn(tokens, hidden, dtype=torch.bfloat16)  # here: its gradient apart)
    labels = torch.randint(0, vocab, (tokens,))

    def loop():
        # ChunkedLossWrapper.__call__: detached chunks as leaves, lm_head + cross_entropy_loss
        # (F.cross_entropy(pred.float(), labels, reduction="sum")) + backward per chunk, each
        # chunk's gradient copied into an fp32 GradAccumulator
        accumulated = torch.empty(tokens, hidden, dtype=torch.float32)
        size = tokens // chunks
        for i, h in enumerate(hidden_states.split(size)):
            h = h.detach().requires_grad_(True)
            logits = h @ weight.t()
            loss = F.cross_entropy(logits.float(), labels[i * size:(i + 1) * size], reduction="sum")
            loss.backward()
            accumulated[i * size:(i + 1) * size].copy_(h.grad)
            h.grad = None
        return accumulated

    tracker = StorageTracker()
    with tracker:
        loop()
    chunk_logits = tokens // chunks * vocab
    # the chunk's chain (14 x 32 x 4,096 = 1,835,008) beside the fp32 gradient buffer (4 x 256 x
    # 64 = 65,536, left out of the term); the chunk's bf16 hidden-state gradient comes after the
    # fp32 tensors are freed
    by_hand = loss_bytes("chunked-lm-head", tokens * vocab, chunks=chunks) + 4 * tokens * hidden
    assert by_hand == 14 * chunk_logits + 65_536 == 1_900_544
    # the rest: the loss scalars, under 0.1 % here
    assert by_hand <= tracker.peak <= by_hand * 1.001, (tracker.peak, by_hand)
