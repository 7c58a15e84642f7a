"""Context parallelism against Megatron-LM's theoretical_memory_usage.py, term by term: the
estimate reads no context_parallel_size (its activations are all s tokens') and divides the
distributed optimizer by d = world / (t p C); zerolib divides the activations by C and shards
over d x C. Worked by hand (Llama-2-70B: h = 8192, 64 heads, 8 key/value heads, SwiGLU of 28,672,
80 layers, vocabulary 32,000 padded to 32,768 at t = 8)."""
from __future__ import annotations

from fractions import Fraction

from zerolib.core.memory.model_parallel import parameters_per_gpu
from zerolib.core.memory.working_set import WorkingSetSettings, peak
from zerolib.crosscheck.conventions import megatron_theoretical_memory as megatron

S, H, A, L, T, VP = 32_768, 8192, 64, 80, 8, 32_768


def test_the_estimate_ignores_context_parallelism():
    one, four = (megatron.activation_bytes(megatron.args_for(
        "llama-2-70b", S, 1, megatron.ParallelFlags(T, sequence_parallel=True, context_parallel=c),
        recompute="selective")) for c in (1, 4))
    assert one == four                                                     # "no-context-parallel"
    # Every term of the formula is linear in seq_length: at s / C it is a C-th of it.
    local = megatron.activation_bytes(megatron.args_for("llama-2-70b", S // 4, 1,
                                                        megatron.ParallelFlags(T, sequence_parallel=True),
                                                        recompute="selective"))
    assert local * 4 == one


def test_activations_at_the_local_tokens_reconcile_term_by_term():
    # C = 4: 8,192 tokens per rank. Megatron-LM at those tokens:
    #   (s h (18 + 4 x 28672/8192) L + 8 s + s h + 4 s h (1 + VP / h)) / t
    # zerolib (flash attention, sequence parallel, selective), in s h / t: 40.5 per layer (its own
    # block, see test_megatron_theoretical_memory), the recomputed layer's fp32 log-sum-exp
    # (4 a s / t), the final norm's and output layer's inputs (2 + 2), the logits in 2 bytes and
    # their fp32 copy over the rank's 4,096 padded rows (6 s VP / t).
    s = S // 4
    theirs = Fraction(s * H * 32 * L + 8 * s + s * H + s * H * 4 * (1 + Fraction(VP, H)), T)
    ours = Fraction(81, 2) * L * s * H / T + Fraction(4 * A * s, T) + Fraction(4 * s * H, T) + 6 * s * VP // T
    frame = megatron.context_parallel_comparison("llama-2-70b", S, T, (1, 4))
    row = frame.set_index("context_parallel").loc[4]
    assert row["megatron_at_local_tokens_bytes"] == int(theirs) == 21_651_005_440
    assert row["zerolib_bytes"] == ours == 27_414_233_088
    # The differences, each a named convention: the layer formula (40.5 against 32 s h / t per
    # layer), the recomputed layer, the logits' widths (6 against 4 bytes), the token ids and
    # the embedding's dropout mask the estimate charges.
    per_layer = Fraction(17, 2) * L * s * H / T                       # "per-layer-formula"
    transient = Fraction(4 * A * s, T)                                # "recompute-transient"
    logits = Fraction(2 * s * VP, T)                                  # "output-terms"
    token_ids, dropout = Fraction(8 * s, T), Fraction(s * H, T)       # "token-ids", "embedding-dropout"
    assert ours - theirs == per_layer + transient + logits - token_ids - dropout
    # At C = 1 everything is four times as large: zerolib divides by C, the estimate would have to.
    whole = frame.set_index("context_parallel").loc[1]
    assert whole["zerolib_bytes"] == 4 * row["zerolib_bytes"]
    assert whole["megatron_bytes"] == row["megatron_bytes"] == 4 * row["megatron_at_local_tokens_bytes"]


def test_the_distributed_optimizer_shards_over_data_and_context_parallel_gpus():
    # 64 GPUs, t = 8, C = 4: d = 64 / 32 = 2. The estimate charges 6 + 12 / 2 = 12 bytes per
    # parameter; the optimizer shards over d x C = 8 GPUs: 6 + 12 / 8 (zerolib's ZeRO-1 with bf16
    # weights, fp32 gradients and fp32 Adam, the layout of Megatron-LM's 18 bytes).
    args = megatron.args_for("llama-2-70b", S, 1,
                             megatron.ParallelFlags(T, data_parallel=2, context_parallel=4),
                             distributed_optimizer=True)
    assert megatron.bytes_per_parameter(args) == 12                        # "optimizer-over-d"
    settings = WorkingSetSettings(seq_len=S, tensor_parallel=T, context_parallel=4,
                                  sequence_parallel=True, recompute="selective")
    result = peak("llama-2-70b", 64, 1, settings, "bf16-fp32-grads")
    params = int(parameters_per_gpu("llama-2-70b", T, 1, pipeline_stage=0))
    assert params % 8 == 0
    assert result.persistent["total"] == 6 * params + 12 * params // 8
