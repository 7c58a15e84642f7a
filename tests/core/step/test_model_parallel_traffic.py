"""Tensor- and pipeline-parallel traffic per step, against the papers' own counts."""
from __future__ import annotations

from fractions import Fraction

import pytest

from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.memory.model_parallel import Pipeline
from zerolib.core.memory.pipeline_schedule import micro_batches_in_flight
from zerolib.core.step.model_parallel_traffic import (
    pipeline_traffic,
    tensor_parallel_traffic,
    traffic_frame,
)
from zerolib.crosscheck.korthikanti import PRINTED, RUNS, SEQ_LEN

LAYER_ROWS = ("attention and MLP outputs (g)",
              "gradients of the QKV and MLP up projections' inputs (f)")


def ring_bytes(row) -> Fraction:
    """Bytes one rank puts on its ring link for a call (all-reduce = reduce-scatter + all-gather)."""
    share = Fraction(row.group_size - 1, row.group_size) * row.tensor_bytes
    return {"all-reduce": 2 * share, "all-gather": share, "reduce-scatter": share}[row.collective]


def test_two_all_reduces_forward_and_two_backward_per_layer():
    # Llama-2-70B, t = 8, one stage of 80 layers, 4 micro-batches of 1 x 4096 tokens, 2 bytes.
    rows = tensor_parallel_traffic("llama-2-70b", 4096, 1, 8, Pipeline(1, micro_batches=4))
    bsh = 2 * 4096 * 8192
    layers = {row.what: row for row in rows if row.what in LAYER_ROWS}
    assert {(row.collective, row.phase, row.calls, row.tensor_bytes) for row in layers.values()} == {
        ("all-reduce", "forward", 2 * 80 * 4, bsh), ("all-reduce", "backward", 2 * 80 * 4, bsh)}
    # Narayanan et al. Sec. 3.2: "8bsh((t - 1)/t) per layer per device for each microbatch".
    per_layer = sum(ring_bytes(row) * row.calls for row in layers.values()) / (80 * 4)
    assert per_layer == 8 * Fraction(bsh, 2) * Fraction(7, 8) * 2          # elements x 2 bytes
    # Around the layers: the embedding's forward all-reduce, the output layer's backward one,
    # and the vocabulary-parallel cross entropy's three fp32 values per token.
    others = {row.what: (row.collective, row.phase, row.calls, row.tensor_bytes)
              for row in rows if row.what not in LAYER_ROWS}
    assert others["vocabulary-parallel embedding output"] == ("all-reduce", "forward", 4, bsh)
    assert others["gradient of the output layer input"] == ("all-reduce", "backward", 4, bsh)
    assert others[next(k for k in others if k.startswith("cross entropy"))] == (
        "all-reduce", "forward", 12, 4 * 4096)


def test_sequence_parallelism_uses_the_same_ring_bandwidth():
    # Korthikanti et al. Sec. 4.2.2: four all-gathers and four reduce-scatters replace four
    # all-reduces, "the communication bandwidth used ... are the same"; the extra all-gathers
    # of the saved shards in backward come on top.
    plain = tensor_parallel_traffic("llama-2-70b", 4096, 1, 8, Pipeline(2, micro_batches=4), 1)
    sp = tensor_parallel_traffic("llama-2-70b", 4096, 1, 8, Pipeline(2, micro_batches=4), 1,
                                 ActivationOptions(sequence_parallel=True))
    layer_plain = sum(ring_bytes(r) * r.calls for r in plain if r.what in LAYER_ROWS)
    regather = [r for r in sp if r.what.startswith("saved sequence shards")]
    layer_sp = sum(ring_bytes(r) * r.calls for r in sp if r.what.startswith(("layer inputs", "attention and MLP",
                                                                             "gradients of the")))
    assert layer_sp == layer_plain
    assert len(regather) == 1 and regather[0].calls == 2 * 40 * 4
    counts = {}
    for row in sp:
        if not row.what.startswith(("saved", "output", "gradient of the output", "cross")):
            counts[row.collective] = counts.get(row.collective, 0) + row.calls
    assert counts == {"all-gather": 4 * 40 * 4, "reduce-scatter": 4 * 40 * 4}


def test_full_recomputation_repeats_the_forward_collectives():
    base = tensor_parallel_traffic("llama-2-7b", 4096, 1, 4, Pipeline(1, micro_batches=2))
    full = tensor_parallel_traffic("llama-2-7b", 4096, 1, 4, Pipeline(1, micro_batches=2),
                                   options=ActivationOptions(recompute="full"))
    selective = tensor_parallel_traffic("llama-2-7b", 4096, 1, 4, Pipeline(1, micro_batches=2),
                                        options=ActivationOptions(recompute="selective"))
    extra = sum(r.total_bytes for r in full) - sum(r.total_bytes for r in base)
    assert extra == 2 * 32 * 2 * (2 * 4096 * 4096)          # 2 all-reduces x 32 layers x 2 micro-batches
    assert sum(r.total_bytes for r in selective) == sum(r.total_bytes for r in base)
    assert tensor_parallel_traffic("llama-2-7b", 4096, 1, 1) == ()


def test_pipeline_sends_bsh_per_micro_batch_per_direction():
    # Narayanan et al. Sec. 3.2: bsh per micro-batch between consecutive stages, each way.
    bsh = 2 * 4096 * 8192
    first = pipeline_traffic("llama-2-70b", 4096, 1, 8, Pipeline(4, micro_batches=16), 0)
    middle = pipeline_traffic("llama-2-70b", 4096, 1, 8, Pipeline(4, micro_batches=16), 1)
    last = pipeline_traffic("llama-2-70b", 4096, 1, 8, Pipeline(4, micro_batches=16), 3)
    assert [(r.phase, r.calls, r.tensor_bytes) for r in first] == [("forward", 16, bsh)]
    assert [(r.phase, r.calls, r.tensor_bytes) for r in middle] == [("forward", 16, bsh), ("backward", 16, bsh)]
    assert [(r.phase, r.calls, r.tensor_bytes) for r in last] == [("backward", 16, bsh)]
    # Sequence parallelism or the scatter/gather optimisation (Sec. 4.1): bsh / t per message;
    # scatter/gather then all-gathers what arrives over the tensor-parallel group.
    sp = pipeline_traffic("llama-2-70b", 4096, 1, 8, Pipeline(4, micro_batches=16), 1,
                          options=ActivationOptions(sequence_parallel=True))
    assert {r.tensor_bytes for r in sp} == {bsh // 8}
    sg = pipeline_traffic("llama-2-70b", 4096, 1, 8, Pipeline(4, micro_batches=16), 1, scatter_gather=True)
    assert [(r.group, r.collective, r.tensor_bytes) for r in sg] == [
        ("pipeline", "send", bsh // 8), ("pipeline", "send", bsh // 8),
        ("tensor", "all-gather", bsh), ("tensor", "all-gather", bsh)]
    # Interleaved, v = 2: "the amount of communication also increases by v" (Sec. 2.2.2).
    inter = pipeline_traffic("llama-2-70b", 4096, 1, 8, Pipeline(4, "interleaved", 2, 16), 1)
    assert sum(r.total_bytes for r in inter) == 2 * sum(r.total_bytes for r in middle)
    assert pipeline_traffic("llama-2-70b", 4096, 1, 8, 1, 0) == ()


def test_korthikanti_appendix_b_first_stage_output_tensors():
    # Appendix B: the output tensor each in-flight micro-batch keeps on the first stage of the
    # 530B model: "sbhp = 2.73 GB" (2 bytes per element; the paper's GB is GiB here).
    run = RUNS["530B"]
    (forward,) = [r for r in pipeline_traffic(run.model, SEQ_LEN, 1, 8, Pipeline(35, micro_batches=280), 0)
                  if r.phase == "forward"]
    held = forward.tensor_bytes * int(micro_batches_in_flight(35, 0, micro_batches=280))
    assert held == 2 * 2048 * 1 * 20480 * 35 == 2_936_012_800
    assert f"{held / 2**30:.2f}" == PRINTED["deallocation, 530B"][1]


def test_frame_and_bad_input():
    frame = traffic_frame(tensor_parallel_traffic("gpt2", 1024, 1, 2, Pipeline(1, micro_batches=2)))
    assert list(frame.columns)[-1] == "total_bytes" and (frame.total_bytes == frame.calls * frame.tensor_bytes).all()
    assert list(traffic_frame(()).columns)[-1] == "total_bytes"
    with pytest.raises(ValueError, match="pipeline_stage"):
        pipeline_traffic("llama-2-7b", 4096, 1, 1, 4, 4)
    with pytest.raises(ValueError, match="divide heads"):
        tensor_parallel_traffic("llama-2-7b", 4096, 1, 3)
    with pytest.raises(ValueError, match="recompute"):
        tensor_parallel_traffic("llama-2-7b", 4096, 1, 2, options=ActivationOptions(recompute="some"))
    with pytest.raises(ValueError, match="micro_batches"):
        pipeline_traffic("llama-2-7b", 4096, 1, 1, Pipeline(4, micro_batches=0), 0)
