"""Each MoE layer's tensor-parallel collectives as Megatron-LM's alltoall dispatcher runs them.

Hand-worked (Megatron-LM d98e8a64, megatron/core/transformer/moe/token_dispatcher.py: the
dispatcher's group is expt_tp, line 86; all-gather over it before the experts, lines 746-751;
reduce-scatter after, line 829). Tiny MoE: h 16, 4 experts, top-2, 2 layers, s 8, b 1, t 2 with
sequence parallelism, E 2: R = 8 / 2 tokens x 2 = 8 rows of 32 B = 256 B. Per MoE layer 4 calls
over ETP of an ETP x R tensor, (ETP - 1) x R sent: ETP 2: 8 x 256 = 2,048 B; ETP 4: 8 x 768 = 6,144 B.
Counted at ETP = t too, where the MoE layer runs none of the dense MLP's t-collectives.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.catalogue.nodes import cluster_interconnect
from zerolib.core.estimate import estimate
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.memory.model_parallel import Pipeline
from zerolib.core.planner import plan
from zerolib.core.step.collectives import ring_timing_of
from zerolib.core.step.expert_parallel_traffic import expert_traffic, expert_traffic_seconds
from zerolib.core.step.model_parallel_traffic import tensor_parallel_traffic
from zerolib.core.step.parallel import KIND_OF, parallel_step_time

TINY = TransformerConfig("tiny-moe", hidden=16, layers=2, heads=2, kv_heads=2, ffn_hidden=32,
                         vocab=64, max_positions=64, tied_embeddings=False, gated_mlp=True,
                         experts=4, experts_per_token=2)
IC = cluster_interconnect("dgx-h100", 8)
SP = ActivationOptions(sequence_parallel=True)


@pytest.mark.parametrize("etp, sent", [
    (2, 2048),
    (4, 6144)])
def test_dispatcher_etp_collectives_per_step(etp, sent):
    traffic = expert_traffic(TINY, 8, 1, 2, tensor_parallel=2, options=ActivationOptions(
        sequence_parallel=True, expert_tensor_parallel=etp))
    assert traffic.step_etp_sent_bytes == sent


# --- the MoE layer's whole share of the traffic over t and ETP, the table of the module doc ------

def _ring_sent(rows) -> int:
    """Bytes one GPU sends for ``rows`` on a ring of t: (t - 1) / t of an all-gather's output or
    a reduce-scatter's input, 2 (t - 1) / t of an all-reduce's input (per call)."""
    out = 0
    for row in rows:
        share = 2 if row.collective == "all-reduce" else 1
        out += row.calls * share * (row.group_size - 1) * row.tensor_bytes // row.group_size
    return out


# Tiny MoE at t = 2 under sequence parallelism, one stage, one micro-batch: b x s x h = 8 x 16 x 2
# = 256 B, 128 B sent per all-gather or reduce-scatter. Attention: 5 per layer (forward gather
# and scatter, their two backward reverses, the weight gradients' gather) x 2 layers = 10 calls;
# embedding 2 and output layer 2 calls; the loss's 3 all-reduces of 8 x 4 = 32 B, 32 B sent each.
AROUND = 10 * 128 + 2 * 128 + 2 * 128 + 3 * 32        # 1,888 B; with the MLP's 10 calls: 3,168


@pytest.mark.parametrize("etp, moe_share", [(1, 0), (2, 2048), (4, 6144)])
def test_the_moe_layers_share_is_the_dispatchers_etp_collectives(etp, moe_share):
    rows = tensor_parallel_traffic(TINY, 8, 1, 2, options=SP)
    assert _ring_sent(rows) == AROUND             # was 3,168: the MLP's 1,280 B do not run
    traffic = expert_traffic(TINY, 8, 1, 2, tensor_parallel=2, options=ActivationOptions(
        sequence_parallel=True, expert_tensor_parallel=etp))
    assert traffic.step_etp_sent_bytes == moe_share
    assert traffic.etp_calls == (0 if etp == 1 else 8)


def test_full_recomputation_runs_the_forwards_two_again():
    # ETP 2: 6 per layer x 2 layers = 12 calls of 256 B sent; attention's rows gain the recomputed
    # forward's gather and scatter: 7 x 2 = 14 calls of 128 B, plus the 608 B around the layers.
    traffic = expert_traffic(TINY, 8, 1, 2, tensor_parallel=2, options=ActivationOptions(
        sequence_parallel=True, recompute="full"))
    assert (traffic.etp_calls, traffic.step_etp_sent_bytes) == (12, 3072)
    rows = tensor_parallel_traffic(TINY, 8, 1, 2, options=ActivationOptions(sequence_parallel=True, recompute="full"))
    assert _ring_sent(rows) == 14 * 128 + 2 * 128 + 2 * 128 + 3 * 32


def test_a_shared_expert_keeps_its_mlp_collectives():
    shared = replace(TINY, name="tiny-moe-shared", shared_expert_ffn=32)
    rows = tensor_parallel_traffic(shared, 8, 1, 2, options=SP)
    assert _ring_sent(rows) == 20 * 128 + 2 * 128 + 2 * 128 + 3 * 32   # attention and shared MLP


def test_without_sequence_parallelism_the_dense_all_reduces_stand_in():
    # Megatron-LM refuses MoE training at t > 1 without it (moe_layer.py 636): 4 all-reduces per
    # layer of 256 B (256 B sent each) x 2 layers, embedding and output 1 each, the loss's 3.
    rows = tensor_parallel_traffic(TINY, 8, 1, 2)
    assert _ring_sent(rows) == 8 * 256 + 2 * 256 + 3 * 32
    traffic = expert_traffic(TINY, 8, 1, 1, tensor_parallel=2)
    assert traffic.etp_calls == 0


def test_a_plain_tensor_parallel_mixture_gets_them_in_the_step():
    # E = 1, ETP = t = 2: no all-to-all, the 8 ETP calls per micro-batch, 256 B sent each
    traffic = expert_traffic(TINY, 8, 1, 1, tensor_parallel=2, micro_batches=2, options=SP)
    assert (traffic.calls, traffic.etp_calls, traffic.step_etp_sent_bytes) == (0, 16, 4096)
    times = parallel_step_time(TINY, IC, "h100-80gb", seq_len=8, micro_batch=1, tensor_parallel=2,
                               pipeline_parallel=1, data_parallel=2, stage=1, micro_batches=2,
                               sequence_parallel=True)
    assert float(times.parts["expert"][()]) == pytest.approx(expert_traffic_seconds(traffic, IC),
                                                             rel=1e-12)
    # the tensor part times the same rows tensor_parallel_traffic gives the estimate
    rows = tensor_parallel_traffic(TINY, 8, 1, 2, Pipeline(1, micro_batches=2), options=SP)
    expected = 0.0
    for row in rows:
        latency, bandwidth = ring_timing_of(IC, KIND_OF[row.collective], np.int64(2))
        share = 2 if row.collective == "all-reduce" else 1
        expected += row.calls * (latency + share * row.tensor_bytes / 2 / bandwidth)
    assert float(times.parts["tensor"][()]) == pytest.approx(expected, rel=1e-12)


# --- estimate and plan: one configuration, the same tensor and expert seconds --------------------

@pytest.mark.parametrize("etp", [1, 2])
def test_estimate_and_plan_agree_on_the_experts_collectives(etp):
    # estimate times a link at t = 1 only; ETP 2 there runs the dispatcher's gathers over 2 ranks
    frame = plan("mixtral-8x7b", 64, 8, "h100-80gb", 4096, 64, links="dgx-h100",
                 engine="megatron", recompute=("full",), max_micro_batch=1, stages=(1,),
                 expert_parallel=(8,), context_parallel=(1,)).valid
    rows = frame[(frame.tensor_parallel == 1) & (frame.pipeline_parallel == 1)
                 & (frame.expert_tensor_parallel == etp)]
    assert len(rows) == 1
    m = int(rows.micro_batches.iloc[0])
    found = estimate("mixtral-8x7b", 64, **dict(seq_len=4096, recompute="full"),
                           device="h100-80gb", link="dgx-h100", stages=(1,), engine="megatron",
                           expert_parallel=8, expert_tensor_parallel=etp,
                           micro_batches=m).as_dict()
    step = found["stages"][0]["parallel_step"]
    for part in ("tensor", "expert", "data_parallel"):
        assert step["parts"][part] == pytest.approx(float(rows[f"{part}_seconds"].iloc[0]),
                                                    rel=1e-12)
    assert step["step_seconds"] == pytest.approx(float(rows.step_seconds.iloc[0]), rel=1e-12)
    # the estimate's bytes: 6 ETP calls per layer (full recomputation) x 32 MoE layers x m, each
    # sending (ETP - 1) x 4096 x 2 rows of 4096 x 2 B
    traffic = found["stages"][0]["expert_traffic"]
    assert traffic["etp_calls"] == (0 if etp == 1 else 6 * 32 * m)
    assert traffic["etp_sent_bytes_per_call"] == (etp - 1) * 4096 * 2 * 4096 * 2


# --- dense models: their tensor traffic unchanged ------------------------------------------------

# llama-2-7b (h 4096, 32 layers), s 4096, b 1, one stage: b x s x h x 2 = 33,554,432 B per call;
# the loss's 3 all-reduces of 4 x 4096 = 16,384 B.
BSH, LOSS = 2 * 4096 * 4096, 4 * 4096


@pytest.mark.parametrize("t, sp, calls, total, sent", [
    # all-reduces: 4 per layer x 32 + embedding + output = 130, ring 2 (t - 1) / t
    (2, False, 133, 130 * BSH + 3 * LOSS, 130 * BSH + 3 * LOSS),
    (4, False, 133, 130 * BSH + 3 * LOSS, 130 * BSH * 3 // 2 + 3 * LOSS * 3 // 2),
    # gathers and scatters: 10 per layer x 32 + 2 + 2 = 324, ring (t - 1) / t; the loss's too
    (2, True, 327, 324 * BSH + 3 * LOSS, 324 * BSH // 2 + 3 * LOSS),
    (4, True, 327, 324 * BSH + 3 * LOSS, 324 * BSH * 3 // 4 + 3 * LOSS * 3 // 2),
])
def test_a_dense_models_tensor_traffic_is_unchanged(t, sp, calls, total, sent):
    rows = tensor_parallel_traffic("llama-2-7b", 4096, 1, t, options=ActivationOptions(sequence_parallel=sp))
    assert sum(row.calls for row in rows) == calls
    assert sum(row.total_bytes for row in rows) == total
    assert _ring_sent(rows) == sent
    assert (total, sent) == {(2, False): (4_362_125_312, 4_362_125_312),
                             (4, False): (4_362_125_312, 6_543_187_968),
                             (2, True): (10_871_685_120, 5_435_867_136),
                             (4, True): (10_871_685_120, 8_153_800_704)}[(t, sp)]
