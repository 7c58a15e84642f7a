"""Micro-batches in flight and activations per pipeline stage.

The closed forms in zerolib.core.memory.pipeline_schedule are checked against a step-by-step replay of
Megatron-LM's schedules written here from their rules (megatron/core/pipeline_parallel/
schedules.py: ``get_pp_rank_microbatches`` for the warm-up counts, ``get_schedule_table`` for
the order of model chunks, backward passes taking the chunks in reverse), not from zerolib.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from zerolib.core.catalogue.models import MODELS
from zerolib.core.memory.activations import ActivationOptions, model_activation_terms
from zerolib.core.memory.model_parallel import Pipeline
from zerolib.core.memory.pipeline_schedule import (
    activation_bytes_per_gpu,
    embedding_micro_batches,
    layer_activations_held,
    micro_batches_in_flight,
    stage_activation_terms,
)


def replay(p: int, v: int, m: int, rank: int):
    """In-flight chunk passes on ``rank`` after every step of Megatron's schedule: a list of
    {chunk: passes whose backward is still to come}."""
    table = []                             # forward order: groups of p micro-batches per chunk
    for low in range(0, m, p):
        high = m if low + p >= m else low + p
        table += [(mb, chunk) for chunk in range(v) for mb in range(low, high)]
    total = m * v
    if v == 1:
        warmup = min(p - rank - 1, total)
    else:
        warmup = min(2 * (p - rank - 1) + (v - 1) * p, total)
    flight, history, f, b = {}, [], 0, 0

    def forward():
        nonlocal f
        chunk = table[f][1]
        flight[chunk] = flight.get(chunk, 0) + 1
        f += 1
        history.append(dict(flight))

    def backward():
        nonlocal b
        chunk = v - 1 - table[b][1]
        flight[chunk] -= 1
        b += 1
        history.append(dict(flight))

    for _ in range(warmup):
        forward()
    for _ in range(total - warmup):
        forward()
        backward()
    while b < total:
        backward()
    return history


SCHEDULES = [(p, v, m) for p in (2, 3, 4, 8) for v in (1, 2, 3) for m in range(1, 4 * p + 1)
             if v == 1 or (m % p == 0)]


@pytest.mark.parametrize("p, v, m", SCHEDULES)
def test_in_flight_counts_match_a_replay_of_megatrons_schedule(p, v, m):
    schedule = "interleaved" if v > 1 else "1f1b"
    for rank in range(p):
        history = replay(p, v, m, rank)
        most = max(sum(state.values()) for state in history)
        assert int(micro_batches_in_flight(p, rank, schedule=schedule, chunks=v, micro_batches=m)) == most
        at_peak = [state for state in history if sum(state.values()) == most]
        if rank == 0:
            # The first chunk's passes peak at a moment when the total peaks too, so the two
            # maxima add up: the stage's activations peak there.
            first = max(state.get(0, 0) for state in history)
            assert max(state.get(0, 0) for state in at_peak) == first
            assert int(embedding_micro_batches(p, schedule=schedule, micro_batches=m)) == first
        if rank == p - 1:
            assert max(state.get(v - 1, 0) for state in history) == 1    # the output layer's


def test_first_stage_holds_L_layers_or_korthikantis_interleave_factor():
    # 1F1B: p micro-batches of L / p layers: L layers, whatever p (Korthikanti et al. Sec. 4.2.3).
    for p in (1, 2, 4, 8, 16):
        assert int(layer_activations_held(96, p, 0)) == 96
    # Fewer micro-batches than stages: only m of them.
    assert int(layer_activations_held(96, 8, 0, micro_batches=3)) == 3 * 12
    # Interleaved with v chunks: L (1 + (p - 1) / (p v)) layers. 175B: 96 layers, p = 8, v = 3:
    # 96 x 31/24 = 124. 530B: 105 layers, p = 35, v = 3: 105 x 139/105 = 139.
    for L, p, v in ((96, 8, 3), (105, 35, 3), (80, 4, 2), (128, 8, 4)):
        held = int(layer_activations_held(L, p, 0, schedule="interleaved", chunks=v))
        assert Fraction(held, L) == 1 + Fraction(p - 1, p * v)
    # With only m = p micro-batches nothing overlaps: every chunk pass of one group, L layers.
    assert int(layer_activations_held(96, 8, 0, schedule="interleaved", chunks=3, micro_batches=8)) == 96


def test_one_stage_is_the_unpipelined_model():
    options = [dict(), dict(recompute="selective"), dict(recompute="full", sequence_parallel=True),
               dict(flash_attention=True, logits_bytes=(4,)), dict(dropout=True, mask_bytes=2)]
    for name in MODELS:
        seq = min(2048, MODELS[name].max_positions)
        for option in options:
            for t in (1, 2, 4):
                if MODELS[name].kv_heads % t:
                    continue
                kept = ActivationOptions(**option)
                expected = dict(model_activation_terms(name, seq, 2, t, kept))
                assert dict(stage_activation_terms(name, seq, 2, t, options=kept)) == expected
                assert int(activation_bytes_per_gpu(name, seq, 2, t, options=kept)) == sum(expected.values())


def test_terms_live_where_their_modules_are():
    # Llama-2-7B, 4 stages of 8 layers, t = 2, SP, full pipeline: the first stage holds 4
    # micro-batches of 8 layers (32 layers' worth), no logits; the last 1 micro-batch of 8
    # layers and the logits; the middle ones 3 and 2 micro-batches.
    sp = ActivationOptions(sequence_parallel=True)
    one = model_activation_terms("llama-2-7b", 4096, 1, 2, sp)
    layer = one["transformer_layers"] // 32
    stages = [stage_activation_terms("llama-2-7b", 4096, 1, 2, 4, r, sp) for r in range(4)]
    assert [s["transformer_layers"] for s in stages] == [32 * layer, 24 * layer, 16 * layer, 8 * layer]
    assert [s["logits_loss"] for s in stages] == [0, 0, 0, one["logits_loss"]]
    assert [s["final_norm_input"] for s in stages] == [0, 0, 0, one["final_norm_input"]]
    assert stages[1]["embedding_dropout_mask"] == 0


def test_embedding_dropout_is_held_for_every_micro_batch_in_flight():
    # GPT-2 trains with dropout: its embedding mask (1 byte x s x b x h) once per micro-batch in
    # flight on the first stage: 4 stages -> 4 copies; interleaved (v = 3) -> 2 x 4 = 8.
    mask = 1024 * 2 * 768
    one_f = stage_activation_terms("gpt2", 1024, 2, 1, 4, 0)
    inter = stage_activation_terms("gpt2", 1024, 2, 1, Pipeline(4, "interleaved", 3), 0)
    assert one_f["embedding_dropout_mask"] == 4 * mask
    assert inter["embedding_dropout_mask"] == 8 * mask


def test_most_loaded_stage_is_the_first_or_the_last():
    for name, t, p in (("llama-3-8b", 4, 4), ("gpt2", 2, 3), ("qwen2.5-7b", 4, 7), ("llama-2-7b", 1, 32)):
        seq = min(4096, MODELS[name].max_positions)
        for options, m in ((dict(), None), (dict(recompute="full"), None),
                           (dict(sequence_parallel=True), 2)):
            options, pipeline = ActivationOptions(**options), Pipeline(p, micro_batches=m)
            every = [int(activation_bytes_per_gpu(name, seq, 1, t, pipeline, pipeline_stage=r,
                                                  options=options)) for r in range(p)]
            assert int(activation_bytes_per_gpu(name, seq, 1, t, pipeline, options=options)) == max(every)


def test_vectorised_activations_match_one_at_a_time():
    t = np.array([1, 2, 4, 8])[:, None]
    p = np.array([1, 2, 4, 8, 16])[None, :]
    options = ActivationOptions(sequence_parallel=True, recompute="selective", flash_attention=True)
    grid = activation_bytes_per_gpu("llama-2-70b", 4096, 1, t, Pipeline(p, micro_batches=8),
                                    options=options)
    for i in range(4):
        for j in range(5):
            pipeline = Pipeline(int(p[0, j]), micro_batches=8)
            one = stage_activation_terms("llama-2-70b", 4096, 1, int(t[i, 0]), pipeline, 0, options)
            last = stage_activation_terms("llama-2-70b", 4096, 1, int(t[i, 0]), pipeline,
                                          int(p[0, j]) - 1, options)
            assert grid[i, j] == max(sum(one.values()), sum(last.values()))


@pytest.mark.parametrize("call, fragment", [
    (lambda: stage_activation_terms("llama-2-7b", 4096, 1, 1, 4, 4), "pipeline_stage"),
    (lambda: stage_activation_terms("llama-2-7b", 4096, 1, [1, 2], 1, 0), "single number"),
    (lambda: stage_activation_terms("llama-2-7b", 4096, 1, 1, Pipeline(4, micro_batches=0), 0),
     "micro_batches"),
    (lambda: stage_activation_terms("llama-2-7b", 4096, 1, 1, 4, 0,
                                    ActivationOptions(recompute="some")), "recompute"),
    (lambda: activation_bytes_per_gpu("llama-2-7b", 2**24, 2**16, 1, 1), "lower seq_len"),
])
def test_bad_input_is_named(call, fragment):
    with pytest.raises((ValueError, TypeError), match=fragment):
        call()


def test_the_array_path_equals_activation_bytes_per_gpu():
    """stage_activation_totals over activation_unit_terms (the planner's path) is
    activation_bytes_per_gpu, setting by setting, under both schedules."""
    from zerolib.core.memory.pipeline_schedule import (
        UNIT_TERMS,
        activation_unit_terms,
        stage_activation_totals,
    )
    t = np.array([1, 2, 4, 8, 8, 2])
    p = np.array([1, 2, 4, 2, 8, 4])
    m = np.array([1, 8, 4, 4, 16, 8])
    for schedule, chunks, sel in (("1f1b", 1, slice(None)), ("interleaved", 2, slice(1, None))):
        for sp, rec, b in ((True, "selective", 1), (False, "none", 2), (True, "full", 3)):
            options = ActivationOptions(sequence_parallel=sp, recompute=rec, flash_attention=True)
            units = {name: np.array([activation_unit_terms(
                "llama-2-70b", 4096, b, int(x), options)[name] for x in t[sel]]) for name in UNIT_TERMS}
            for r in (np.zeros_like(p[sel]), p[sel] - 1):
                got = stage_activation_totals("llama-2-70b", units, p[sel], r, schedule=schedule,
                                              chunks=chunks, micro_batches=m[sel])
                want = activation_bytes_per_gpu(
                    "llama-2-70b", 4096, b, t[sel], Pipeline(p[sel], schedule, chunks, m[sel]),
                    pipeline_stage=r, options=options)
                assert np.array_equal(got, want)


def test_the_remembered_unit_terms_still_check_their_arguments():
    from zerolib.core.memory.pipeline_schedule import activation_unit_terms
    activation_unit_terms("llama-2-7b", 4096, 1, 2)                  # remembered
    with pytest.raises(TypeError, match="seq_len"):
        activation_unit_terms("llama-2-7b", True, 1, 2)
    with pytest.raises(TypeError, match="sequence_parallel"):
        activation_unit_terms("llama-2-7b", 4096, 1, 2, ActivationOptions(sequence_parallel=1))
    with pytest.raises(ValueError, match="recompute"):
        activation_unit_terms("llama-2-7b", 4096, 1, 2, ActivationOptions(recompute="half"))
