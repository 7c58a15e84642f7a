"""The logits and the loss, per implementation: the bytes per logit alive at the loss's peak.

A language model's loss turns N x V logits (N tokens, V the vocabulary, V / t on each of t
vocabulary-parallel ranks) into one number and back into their gradient. What is alive at the
peak depends on how the loss is written, not on the model. Each implementation below was run
with the real PyTorch code on the CPU (``data/mechanisms_measured.csv``, rows "logits and
loss"); per logit, with 2-byte (bf16) logits:

``stored`` (the chapter's count)
    the logits in the element size and their fp32 copy for the loss: what is *stored*, 6 bytes,
    or the widths ``logits_bytes`` names. Not the peak of any implementation measured.
``eager``
    ``F.cross_entropy(logits.float(), labels)`` (torchtitan's ``cross_entropy_loss``,
    transformers' ``ForCausalLMLoss``). Its backward peaks inside ``_log_softmax_backward_data``
    with the fp32 log-softmax (4, saved), its gradient (4) and the input gradient (4); the fp32
    copy (4) lived only during the forward: 12, plus the bf16 logits (2) when the caller keeps
    them: 14.
``eager-bf16``
    ``F.cross_entropy(logits, labels)`` on the bf16 logits: the same chain in 2 bytes, 6 (8 kept).
``chunked``
    K chunks of tokens, each ``F.cross_entropy(chunk.float(), reduction="sum")`` (torchtune's
    ``CEWithChunkedOutputLoss``): every chunk's fp32 log-softmax stays saved (4), only the
    gradients are per chunk. Kept: the backward's 2 + 4 + 8/K. Freed: the larger of the
    forward's bf16 logits, log-softmax and one chunk's fp32 copy (2 + 4 + 4/K) and the
    backward's 4 + 8/K.
``chunked-lm-head``
    torchtitan's ``ChunkedLossWrapper`` (``torchtitan/components/loss.py`` at 73aed7f): the
    model stops before its output layer; for each of K chunks of tokens in turn the output
    layer makes that chunk's logits, the eager loss runs on them and its backward runs at once,
    the chunk's hidden-state gradient copied into an fp32 buffer. Only one chunk's logits are
    ever alive: the bf16 logits (2) and the eager chain (12) of N x V / K logits: 14 per logit
    of one chunk. (The fp32 hidden-state gradient buffer, 4 bytes per token and hidden unit,
    and under FSDP2 the output layer's unsharded weight and gradient are left out.)
``compiled``
    ``torch.compile`` of the eager loss: inductor fuses the upcast, the log-softmax and its
    backward, keeping the bf16 logits (2) and making the bf16 gradient (2): 4 whether or not
    the caller keeps the logits (the compiled graph saves them itself).
``vocab-parallel``
    megatron-core's ``vocab_parallel_cross_entropy``: the fp32 copy of the rank's shard (4; exp,
    then softmax in place, saved, then turned into the gradient in place) and the bf16 gradient
    (2): 6, or 8 with the bf16 logits kept.

"Freed" is the trainer's convention: torchtitan deletes its logits before the backward
(``del pred`` in ``train.py``: "need to free to before bwd to avoid peaking memory"),
Megatron-LM's ``GPTModel.forward`` returns the loss and drops the logits, torchtune deletes
them (``del logits``); a loop that keeps a transformers model's output object keeps them.
Scalars and per-token tensors (the loss, the targets' mask) are under 0.3 % and left out.
"""
from __future__ import annotations

LOSSES = ("stored", "eager", "eager-bf16", "chunked", "chunked-lm-head", "compiled",
          "vocab-parallel")
MAX_LOSS_CHUNKS = 65536
LOGIT_BYTES = 2     # bf16 logits (the measured implementations' element size)
FP32 = 4


def check_loss(loss) -> str:
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    return loss


def loss_bytes(loss: str, logits: int, *, freed: bool = False, chunks: int = 8,
               widths: tuple[int, ...] = (2, 4)) -> int:
    """Bytes alive at the peak of ``loss`` (one of :data:`LOSSES`) over ``logits`` logits on one
    rank (N x V, or N x V / t for a vocabulary-parallel loss); ``freed``: the caller drops the
    bf16 logits before the backward; ``chunks``: K of the chunked loss; ``widths``: the
    ``stored`` count's tensors. Exact integers (the chunked loss's 4/K and 8/K per logit are
    whole bytes per chunk of logits)."""
    kept = 0 if freed else LOGIT_BYTES * logits
    if loss == "stored":
        return sum(widths) * logits
    if loss == "eager":
        return kept + 3 * FP32 * logits
    if loss == "eager-bf16":
        return kept + 3 * LOGIT_BYTES * logits
    if loss == "compiled":
        return 2 * LOGIT_BYTES * logits
    if loss == "vocab-parallel":
        return kept + (FP32 + LOGIT_BYTES) * logits
    if loss == "chunked-lm-head":   # one chunk's logits, kept through its own backward
        return (LOGIT_BYTES + 3 * FP32) * -(-logits // chunks)
    # chunked: every log-softmax saved, one chunk's fp32 tensors at a time
    per_chunk = -(-logits // chunks)
    backward = FP32 * logits + 2 * FP32 * per_chunk
    if not freed:
        return LOGIT_BYTES * logits + backward
    return max(LOGIT_BYTES * logits + FP32 * logits + FP32 * per_chunk, backward)
