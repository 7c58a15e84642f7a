"""Full recomputation re-runs a MoE layer's forward, its dispatch and combine all-to-alls
included (Megatron-LM d98e8a64: transformer_block.py 662-663 checkpoints whole layers,
tensor_parallel/random.py 659 re-runs them in the backward, moe_layer.py 680-685 dispatches and
combines inside); selective recomputation's default, core attention, re-runs none of them.

Hand-worked, tiny MoE (h 16, ffn 32, 4 experts, top-2, 2 layers), s 8, b 1, E 2, t 1: T = 8
tokens, R = 8 x 2 = 16 rows of 16 x 2 = 32 B, 512 B handed to each all-to-all, half of it
(8 rows, 256 B) for the other rank's experts. Per layer and micro-batch 4 all-to-alls (none,
selective) or 6 (full), x 2 layers.
"""
from __future__ import annotations

import numpy as np
import pytest

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.catalogue.nodes import cluster_interconnect
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.step.collectives import ring_timing_of
from zerolib.core.step.expert_parallel_step import all_to_all_seconds_of
from zerolib.core.step.expert_parallel_traffic import expert_traffic, expert_traffic_seconds
from zerolib.core.step.parallel import ParallelSettings

TINY = TransformerConfig("tiny-moe", hidden=16, layers=2, heads=2, kv_heads=2, ffn_hidden=32,
                         vocab=64, max_positions=64, tied_embeddings=False, gated_mlp=True,
                         experts=4, experts_per_token=2)
IC = cluster_interconnect("dgx-h100", 8)


@pytest.mark.parametrize("recompute, calls", [("none", 8), ("selective", 8), ("full", 12)])
def test_all_to_alls_per_step_by_recomputation(recompute, calls):
    traffic = expert_traffic(TINY, 8, 1, 2, options=ActivationOptions(recompute=recompute))
    assert (traffic.rows, traffic.handed_bytes, traffic.sent_bytes) == (16, 512, 256)
    assert traffic.calls == calls
    assert traffic.step_handed_bytes == calls * 512      # 4,096 B; 6,144 B under full
    assert traffic.step_sent_bytes == calls * 256        # 2,048 B; 3,072 B under full
    assert traffic.as_dict()["all_to_all_calls"] == calls
    assert traffic.etp_calls == 0                        # ETP = t = 1


@pytest.mark.parametrize("recompute, calls", [("none", 8), ("full", 12)])
def test_the_planners_seconds_count_the_same_calls(recompute, calls):
    latency, bandwidth = ring_timing_of(IC, "all_to_all", np.int64(2), np.int64(1))
    by_hand = calls * (latency + 256 / bandwidth)
    traffic = expert_traffic(TINY, 8, 1, 2, options=ActivationOptions(recompute=recompute))
    assert expert_traffic_seconds(traffic, IC) == pytest.approx(by_hand, rel=1e-12)
    # the planner's path, per micro-batch, one micro-batch here
    settings = ParallelSettings(seq_len=8, micro_batch=1, tensor_parallel=1, pipeline_parallel=1,
                                data_parallel=2, stage=0, micro_batches=1, expert_parallel=2,
                                recompute=recompute)
    planned = all_to_all_seconds_of(TINY, IC, settings, 2)
    assert float(planned) == pytest.approx(by_hand, rel=1e-12)


def test_full_recomputation_at_t_2_counts_both_kinds_again():
    # t 2 under sequence parallelism, ETP 2: T = 4, R = 8 rows of 32 B, 128 B sent per
    # all-to-all, 12 of them; the ETP collectives 12 x 256 B (test_moe_tensor_collectives.py)
    traffic = expert_traffic(TINY, 8, 1, 2, tensor_parallel=2, options=ActivationOptions(
        sequence_parallel=True, recompute="full"))
    assert (traffic.calls, traffic.step_sent_bytes) == (12, 1536)
    assert (traffic.etp_calls, traffic.step_etp_sent_bytes) == (12, 3072)
