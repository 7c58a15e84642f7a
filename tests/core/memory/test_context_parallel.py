"""Context parallelism and ZeRO-R's partitioned activation checkpoints in the working set, worked
by hand from the block's saved tensors (zerolib.core.memory.activations' module doc)."""
from __future__ import annotations

import pytest

from zerolib.core.memory.activations import checkpoint_terms, context_parallel_tokens
from zerolib.core.memory.working_set import WorkingSetSettings, fewest_gpus_for_peak, peak, working_set

# Llama-2-7B: h = 4096, 32 heads (no GQA), SwiGLU of f = 11008, 32 layers, vocabulary 32,000,
# no dropout, Psi = 6,738,415,616 parameters.
H, F, A, L, V, PSI = 4096, 11008, 32, 32, 32_000, 6_738_415_616


def llama_layer(tokens: int) -> int:
    # Flash attention, no recomputation, 2-byte elements, per layer: two norm inputs, the QKV
    # input, Q, K, V, the output projection's input, the MLP input (8 tensors of s h x 2 bytes),
    # four SwiGLU tensors (s f x 2 bytes each) and one fp32 log-sum-exp per head and token.
    return 16 * tokens * H + 8 * tokens * F + 4 * A * tokens


def test_tokens_per_rank_follow_the_2c_chunks():
    assert context_parallel_tokens(8192, 1) == 8192
    assert context_parallel_tokens(8192, 4) == 2048
    assert context_parallel_tokens(8192, 1024) == 8
    with pytest.raises(ValueError, match=r"multiple of 2 x context_parallel \(2 x 3 = 6\)"):
        context_parallel_tokens(8192, 3)
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel"):
        context_parallel_tokens(4100, 4)     # 4 divides 4100, 8 does not: the causal split needs 2C


def test_a_cp_rank_keeps_the_activations_of_its_tokens():
    # s = 8192 over C = 4: each GPU holds 2048 tokens of the sequence. By hand: 32 layers, the
    # final norm's and output projection's inputs (2 x 2 bytes x s h), the logits in 2 bytes plus
    # their fp32 copy (6 s V).
    tokens = 2048
    assert llama_layer(tokens) == 314_834_944
    settings = WorkingSetSettings(seq_len=8192, context_parallel=4)
    terms = working_set("llama-2-7b", 1, settings)
    assert terms["activations"] == L * 314_834_944 + 4 * tokens * H == 10_108_272_640
    assert terms["logits_loss"] == 6 * tokens * V == 393_216_000
    # Everything is linear in the tokens: a quarter of the unsplit sequence's.
    whole = working_set("llama-2-7b", 1, WorkingSetSettings(seq_len=8192))
    assert 4 * terms["activations"] == whole["activations"]
    assert 4 * terms["logits_loss"] == whole["logits_loss"]


def test_zero_shards_over_data_and_context_parallel_gpus():
    # 16 GPUs, C = 4, t = p = 1: d = 4, and ZeRO-1 shards the optimizer state over d x C = 16
    # (Megatron-LM's distributed optimizer over the data-parallel group with CP): 2 + 2 bytes per
    # parameter kept, 12 x Psi / 16 of the optimizer state.
    result = peak("llama-2-7b", 16, 1, WorkingSetSettings(seq_len=8192, context_parallel=4))
    assert result.persistent["optimizer"] == 12 * PSI // 16 == 5_053_811_712
    assert result.persistent["total"] == 4 * PSI + 12 * PSI // 16 == 32_007_474_176


def test_gpus_must_hold_whole_context_parallel_groups():
    settings = WorkingSetSettings(seq_len=8192, tensor_parallel=2, context_parallel=4)
    with pytest.raises(ValueError, match=r"multiple of tensor_parallel x context_parallel x "
                                         r"pipeline_parallel \(2 x 4 x 1 = 8\)"):
        peak("llama-2-7b", 12, 1, settings)


def test_context_parallel_needs_flash_attention_and_a_divisible_sequence():
    with pytest.raises(ValueError, match="context_parallel above 1 needs flash_attention"):
        WorkingSetSettings(seq_len=8192, context_parallel=2, flash_attention=False)
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel"):
        WorkingSetSettings(seq_len=4096 + 4, context_parallel=4)
    with pytest.raises(ValueError, match="context_parallel must be a positive whole number, got 2.5"):
        WorkingSetSettings(context_parallel=2.5)
    with pytest.raises(TypeError, match="context_parallel must be a positive whole number"):
        WorkingSetSettings(context_parallel="2")
    assert type(WorkingSetSettings(context_parallel=2.0).context_parallel) is int
    with pytest.raises(ValueError, match="context_parallel must be at most 1,024"):
        WorkingSetSettings(seq_len=2**20, context_parallel=2048)


def test_sequence_parallelism_splits_the_local_tokens():
    # Under sequence parallelism t must divide the s / C tokens a CP rank holds: 24 tokens over
    # C = 4 leave 6 per rank, which t = 4 does not divide, though it divides 24.
    settings = WorkingSetSettings(seq_len=24, context_parallel=4, tensor_parallel=4, sequence_parallel=True)
    with pytest.raises(ValueError, match="tensor_parallel must divide seq_len under sequence parallelism"):
        working_set("llama-2-7b", 1, settings)


def test_fewest_gpus_come_in_whole_cp_groups():
    # The peak falls with the ZeRO group, so the fewest GPUs at C = 4 is the fewest without CP's
    # constraint rounded up to whole CP groups of the same per-GPU working set.
    settings = WorkingSetSettings(seq_len=8192, context_parallel=4, recompute="full")
    found = fewest_gpus_for_peak("llama-2-7b", 3, settings, device="a100-80gb")
    assert found % 4 == 0
    assert peak("llama-2-7b", found, 3, settings).total <= 80 * 2**30
    if found > 4:
        assert peak("llama-2-7b", found - 4, 3, settings).total > 80 * 2**30


def test_checkpoint_terms_by_hand():
    # One layer's checkpoint: s b h elements of 2 bytes. s = 4096, b = 1, h = 4096, t = 8.
    whole = 2 * 4096 * 4096
    assert checkpoint_terms(4096, 1, 4096, tensor_parallel=8) == {"gpu": whole, "host": 0, "gathered": 0}
    assert checkpoint_terms(4096, 1, 4096, tensor_parallel=8, partition_activations=True) == {
        "gpu": whole // 8, "host": 0, "gathered": whole}
    assert checkpoint_terms(4096, 1, 4096, tensor_parallel=8, partition_activations=True,
                            cpu_checkpointing=True) == {"gpu": 0, "host": whole // 8, "gathered": whole}
    assert checkpoint_terms(4096, 1, 4096, tensor_parallel=8, cpu_checkpointing=True) == {
        "gpu": 0, "host": whole, "gathered": 0}
    # Sequence parallelism splits it already: P_a gathers nothing.
    assert checkpoint_terms(4096, 1, 4096, tensor_parallel=8, sequence_parallel=True,
                            partition_activations=True) == {"gpu": whole // 8, "host": 0, "gathered": 0}


def test_partitioned_checkpoints_in_the_working_set():
    # Full recomputation keeps one checkpoint per layer: 32 x 2 s h bytes replicated over t = 8
    # ranks, 32 x 2 s h / 8 with P_a, none on the GPU with P_a+cpu. The recomputed layer, the
    # final norm's and output projection's inputs and the logits do not change.
    base = dict(seq_len=4096, recompute="full", tensor_parallel=8)
    plain = working_set("llama-2-7b", 1, WorkingSetSettings(**base))
    pa = working_set("llama-2-7b", 1, WorkingSetSettings(**base, partition_activations=True))
    cpu = working_set("llama-2-7b", 1, WorkingSetSettings(**base, partition_activations=True,
                                                          cpu_checkpointing=True))
    checkpoint = 2 * 4096 * 4096
    assert plain["activations"] - pa["activations"] == L * (checkpoint - checkpoint // 8)
    assert pa["activations"] - cpu["activations"] == L * checkpoint // 8
    assert plain["logits_loss"] == pa["logits_loss"] == cpu["logits_loss"]


def test_zero_r_needs_checkpoints():
    for name in ("partition_activations", "cpu_checkpointing"):
        with pytest.raises(ValueError, match=f"{name} applies to activation checkpoints: it needs "
                                             f"recompute='full', got 'selective'"):
            WorkingSetSettings(recompute="selective", **{name: True})
        with pytest.raises(TypeError, match=name):
            WorkingSetSettings(recompute="full", **{name: 1})


def test_defaults_change_nothing():
    assert WorkingSetSettings().context_parallel == 1
    assert not WorkingSetSettings().partition_activations
    assert not WorkingSetSettings().cpu_checkpointing
