"""Megatron-LM's theoretical_memory_usage.py, reproduced, and reconciled with zerolib term by
term: each difference is one of the named conventions of
zerolib.crosscheck.conventions.megatron_theoretical_memory, worked out here by hand."""
from __future__ import annotations

from fractions import Fraction

import pytest

from zerolib.core.catalogue.models import get_model
from zerolib.core.memory.accounting import model_state
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.memory.model_parallel import Pipeline, parameters_per_gpu
from zerolib.core.memory.pipeline_schedule import stage_activation_terms
from zerolib.crosscheck.conventions import megatron_theoretical_memory as megatron
from zerolib.crosscheck.korthikanti import LOGITS_BYTES, RUNS, SEQ_LEN


def test_padded_vocabulary():
    assert megatron.padded_vocab_size(50_257, 8) == 51_200       # Shoeybi et al. Sec. 5.1
    assert megatron.padded_vocab_size(32_000, 8) == 32_768
    assert megatron.padded_vocab_size(128_256, 8) == 129_024
    assert megatron.padded_vocab_size(51_200, 8) == 51_200


def test_weights_and_optimizer_of_the_175b_model_by_hand():
    # t = 8, p = 8, 96 layers: (12h^2 L / p + V h) / t + (4h L + 2h) / p parameters, 18 bytes each.
    run = RUNS["175B"]
    h, L, V = 12_288, 96, 51_200
    args = megatron.args_for(run.model, SEQ_LEN, 1, megatron.ParallelFlags(8, 8, chunks=3))
    expected = Fraction(12 * h * h * L // 8 + V * h, 8) + Fraction(4 * h * L + 2 * h, 8)
    assert megatron.parameters_on_most_loaded_shard(args) == expected
    assert megatron.weight_and_optimizer_bytes(args) == 18 * expected
    # The distributed optimizer over d replicas: 6 + 12 / d bytes per parameter.
    sharded = megatron.args_for(run.model, SEQ_LEN, 1, megatron.ParallelFlags(8, 8, data_parallel=4),
                                distributed_optimizer=True)
    assert megatron.bytes_per_parameter(sharded) == 9


def test_parameter_conventions_reconcile_for_the_175b_model():
    # zerolib's first stage: 12 layers with their biases (column-parallel QKV 3h and fc1 4h split
    # 8 ways, row-parallel biases 2h whole) and the learned positions (s h); Megatron-LM charges
    # the first stage 2h / 8 of the final LayerNorm and leaves out biases and positions.
    run = RUNS["175B"]
    h = 12_288
    args = megatron.args_for(run.model, SEQ_LEN, 1, megatron.ParallelFlags(8, 8, chunks=3))
    ours = int(parameters_per_gpu(run.model, 8, 8, pipeline_stage=0, schedule="interleaved", chunks=3))
    biases = 12 * (Fraction(7 * h, 8) + 2 * h)          # "no-linear-biases"
    positions = SEQ_LEN * h
    final_norm = Fraction(2 * h, 8)                      # "final-norm-per-stage"
    assert ours - megatron.parameters_on_most_loaded_shard(args) == biases + positions - final_norm
    # The same bytes per parameter as zerolib's bf16 weights + fp32 gradients + fp32 Adam layout.
    assert int(model_state(ours, 1, 0, "bf16-fp32-grads").total) == 18 * ours


def test_parameter_conventions_reconcile_for_llama_2_70b():
    # t = 8, p = 4. Megatron-LM pads 32,000 to 32,768 rows, takes the first stage as the most
    # loaded and charges it h / 4 of the final RMSNorm; zerolib, asked to pad the same way, finds
    # the last stage heavier (the untied output layer plus the whole final norm).
    config, h = get_model("llama-2-70b"), 8192
    args = megatron.args_for(config, 4096, 1, megatron.ParallelFlags(8, 4))
    first = int(parameters_per_gpu(config, 8, 4, pipeline_stage=0, vocab_divisible_by=128))
    most = int(parameters_per_gpu(config, 8, 4, vocab_divisible_by=128))
    assert megatron.parameters_on_most_loaded_shard(args) - first == Fraction(h, 4)
    assert most - first == h                              # "first-stage-only"
    assert first == 20 * (855_638_016 // 8 + 2 * h) + 32_768 * h // 8


@pytest.mark.parametrize("name", ["22B", "175B", "1T"])
def test_activation_conventions_reconcile_with_sequence_parallelism(name):
    # compute_activation_memory (sequence parallel + selective): 34 sbh L per layer for these
    # GPTs, as zerolib; the differences are the token ids (8 bytes x s b p), the embedding's
    # copies under interleaving and, on zerolib's side, the layer recomputed in backward.
    run = RUNS[name]
    s, b, h, a, t, p = SEQ_LEN, run.micro_batch, run.model.hidden, run.model.heads, 8, run.pipeline_parallel
    chunks = run.chunks if run.chunks > 1 else None
    args = megatron.args_for(run.model, s, b,
                             megatron.ParallelFlags(t, p, chunks=chunks, sequence_parallel=True),
                             recompute="selective")
    theirs = megatron.activation_bytes(args, run.micro_batches)
    ours = stage_activation_terms(run.model, s, b, t,
                                  Pipeline(p, run.schedule, run.chunks, run.micro_batches), 0,
                                  ActivationOptions(sequence_parallel=True, recompute="selective",
                                                    dropout=True, logits_bytes=LOGITS_BYTES))
    factor = 1 + Fraction(p - 1, p * run.chunks) if chunks else 1
    token_ids = Fraction(8 * s * b * p, t) * factor                          # "token-ids"
    dropout_theirs = Fraction(s * b * h * p, t) * factor                     # "interleave-penalty"
    transient = Fraction(5 * a * s * s * b, t)                               # recompute_transient
    assert ours["recompute_transient"] == transient
    assert theirs - sum(ours.values()) == token_ids + dropout_theirs - ours["embedding_dropout_mask"] - transient


def test_activation_conventions_without_sequence_parallelism():
    # compute_activation_memory_without_sp, 22B (p = 1, t = 8, selective): sbh(10 + 24/t) per
    # layer like zerolib's Table 2 row, then token ids, the embedding dropout, 2-byte logits and
    # one sbh tensor, all x 1.05 and not divided by t.
    run = RUNS["22B"]
    s, b, h, V = SEQ_LEN, 4, 6144, 51_200
    args = megatron.args_for(run.model, s, b, megatron.ParallelFlags(8, 1), recompute="selective")
    layers = s * b * h * (10 + Fraction(24, 8)) * 48
    expected = (layers + 8 * s * b + s * b * h + (Fraction(s * b * V, 8) + s * b * h) * 2) * Fraction(105, 100)
    assert megatron.activation_bytes(args) == expected
    ours = stage_activation_terms(run.model, s, b, 8,
                                  options=ActivationOptions(recompute="selective", dropout=True))
    assert ours["transformer_layers"] == layers


def test_llama_layer_formula_differs_by_the_block_it_leaves_out():
    # Megatron-LM's sbh(18 + 4 ffn/h) per layer assumes a GPT block; zerolib counts Llama-2-70B's
    # own: per layer, under sequence parallelism and selective recomputation, in units of sbh/t:
    # two norm inputs (2 + 2), QKV and MLP inputs (2 + 2), Q (2), K and V at 1024/8192 of h
    # (0.25 + 0.25), the output projection's input (2), four SwiGLU tensors of 28672/8192 h
    # (4 x 2 x 3.5 = 28), no dropout masks: 40.5 against Megatron's 18 + 14 = 32.
    s, b, h, t = 4096, 1, 8192, 8
    ours = stage_activation_terms("llama-2-70b", s, b, t, 1, 0,
                                  ActivationOptions(sequence_parallel=True, recompute="selective"))
    assert Fraction(ours["transformer_layers"], 80) == Fraction(81, 2) * Fraction(s * b * h, t)
    args = megatron.args_for("llama-2-70b", s, b, megatron.ParallelFlags(t, 1, sequence_parallel=True),
                             recompute="selective")
    theirs = megatron.activation_bytes(args)
    assert theirs == (s * b * h * 32 * 80 + 8 * s * b + s * b * h
                      + s * b * h * 4 * (1 + Fraction(32_768, h))) / t


def test_bad_arguments():
    with pytest.raises(ValueError, match="recompute"):
        megatron.args_for("gpt2", 1024, 1, recompute="some")
    with pytest.raises(ValueError, match="tensor_parallel"):
        megatron.padded_vocab_size(50_257, 0)
