"""Expert tensor parallelism's collectives and their time in the step, against bytes by hand.

A small mixture of experts (hidden 16, ffn 32, 4 experts, top-2, 2 layers), sequence 8,
micro-batch 1, 16-bit rows of 16 x 2 = 32 bytes. Megatron-LM's alltoall dispatcher
(token_dispatcher.py at d98e8a64) per MoE layer and micro-batch: the all-to-all over E, then over
the ETP ranks an all-gather before the experts and a reduce-scatter after (forward), the reverse
of each in backward: 2 all-gathers and 2 reduce-scatters of an ETP x R-row tensor, of which a GPU
sends (ETP - 1) x R rows.

t = 2 with sequence parallelism: a rank routes 4 tokens, R = 8 rows (256 B per all-to-all, half
of it to the other of E = 2 ranks).
  ETP = 1: no gather;  ETP = 2 = t: tensor 2 x 8 x 32 = 512 B, sent 1 x 8 x 32 = 256 B per call
  (the dispatcher gathers over the ETP group at ETP = t too, token_dispatcher.py 741-751, 829);
  ETP = 4: tensor 4 x 8 x 32 = 1,024 B, sent 3 x 8 x 32 = 768 B per call.
t = 1: R = 16 rows; ETP = 2: tensor 2 x 16 x 32 = 1,024 B, sent 512 B per call.
"""
from __future__ import annotations

import numpy as np
import pytest

from zerolib.core.catalogue.models import TransformerConfig
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.step.expert_parallel_traffic import expert_traffic, expert_traffic_seconds
from zerolib.core.step.parallel import cluster_interconnect, parallel_step_time

TINY = TransformerConfig("tiny-moe", hidden=16, layers=2, heads=2, kv_heads=2, ffn_hidden=32,
                         vocab=64, max_positions=64, tied_embeddings=False, gated_mlp=True,
                         experts=4, experts_per_token=2)
IC = cluster_interconnect("dgx-h100", 8)


def _t2(etp, micro_batches=1):
    return expert_traffic(TINY, 8, 1, 2, tensor_parallel=2, micro_batches=micro_batches,
                          options=ActivationOptions(sequence_parallel=True, expert_tensor_parallel=etp))


# Was (0, 0, 0) at ETP = t as well: the dispatcher's collectives over ETP = t are now counted
# (4 per layer x 2 layers x 3 micro-batches = 24 calls of a 2 x 256 B tensor, 256 B sent each).
@pytest.mark.parametrize("etp, etp_traffic", [(None, (24, 512, 256)), (1, (0, 0, 0)),
                                              (2, (24, 512, 256))])
def test_at_t_2_etp_1_adds_no_collective_and_etp_2_its_own(etp, etp_traffic):
    traffic = _t2(etp, micro_batches=3)
    assert (traffic.tokens, traffic.rows, traffic.handed_bytes, traffic.sent_bytes) == (4, 8, 256, 128)
    assert (traffic.etp_calls, traffic.etp_tensor_bytes, traffic.etp_sent_bytes) == etp_traffic


def test_at_t_2_etp_4_gathers_and_scatters_the_rows():
    traffic = _t2(4, micro_batches=3)
    assert (traffic.etp_tensor_bytes, traffic.etp_sent_bytes) == (1024, 768)
    assert traffic.etp_calls == 4 * 2 * 3              # 4 per layer, 2 layers, 3 micro-batches
    assert traffic.step_etp_sent_bytes == 24 * 768
    assert traffic.sent_bytes == 128                   # the all-to-alls are unchanged
    assert traffic.as_dict()["etp_sent_bytes_per_step"] == 18_432


def test_at_t_1_etp_2():
    traffic = expert_traffic(TINY, 8, 1, 2, options=ActivationOptions(expert_tensor_parallel=2))
    assert (traffic.rows, traffic.etp_tensor_bytes, traffic.etp_sent_bytes) == (16, 1024, 512)


def test_a_capacity_factor_pads_the_gathered_rows():
    # c = 1.5 at t = 1: each of 4 experts ceil(1.5 x 2 x 8 / 4) = 6 rows, R = 24; ETP = 2 sends 24 rows
    traffic = expert_traffic(TINY, 8, 1, 2, options=ActivationOptions(expert_tensor_parallel=2,
                                                                 capacity_factor=1.5))
    assert (traffic.rows, traffic.etp_sent_bytes) == (24, 24 * 32)


@pytest.mark.parametrize("changes, message", [
    (dict(expert_tensor_parallel=3), r"expert_tensor_parallel must divide ffn_hidden \(each expert's "
                                     r"width\): tiny-moe has 32, got expert_tensor_parallel 3"),
    (dict(expert_tensor_parallel=1, tensor_parallel=2, expert_parallel=1),
     "expert_tensor_parallel other than tensor_parallel needs sequence_parallel"),
])
def test_traffic_refusals(changes, message):
    args = {"expert_parallel": 2, "tensor_parallel": 1, **changes}
    e, t = args.pop("expert_parallel"), args.pop("tensor_parallel")
    with pytest.raises(ValueError, match=message):
        expert_traffic(TINY, 8, 1, e, tensor_parallel=t, options=ActivationOptions(**args))


BASE = dict(seq_len=8, micro_batch=1, tensor_parallel=1, pipeline_parallel=1, data_parallel=4,
            stage=1, micro_batches=2, expert_parallel=2)


def test_the_step_times_the_etp_collectives():
    times = parallel_step_time(TINY, IC, "h100-80gb", **BASE, expert_tensor_parallel=np.array([1, 2]))
    plain = expert_traffic(TINY, 8, 1, 2, micro_batches=2)
    wide = expert_traffic(TINY, 8, 1, 2, micro_batches=2, options=ActivationOptions(expert_tensor_parallel=2))
    # the all-to-alls' E ranks are ETP apart (t x C at ETP = t)
    assert times.parts["expert"][0] == pytest.approx(expert_traffic_seconds(plain, IC, 1), rel=1e-12)
    assert times.parts["expert"][1] == pytest.approx(expert_traffic_seconds(wide, IC, 2), rel=1e-12)
    assert times.parts["expert"][1] > times.parts["expert"][0]


def test_etp_equal_to_t_is_the_step_as_before():
    before = parallel_step_time(TINY, IC, "h100-80gb", **BASE)
    same = parallel_step_time(TINY, IC, "h100-80gb", **BASE, expert_tensor_parallel=1)
    assert float(same.step_seconds) == float(before.step_seconds)
    for name, seconds in before.parts.items():
        assert float(same.parts[name]) == float(seconds)


def test_experts_split_etp_ways_send_half_the_bytes_on_two_rings():
    # ETP = 2 halves each expert a GPU holds and halves its expert-data-parallel group (4 -> 2).
    # Stage 2 under DeepSpeed (the default engine), t = 1, d = 4, E = 1, 2 micro-batches: each
    # micro-batch all-reduces the gradients and the step all-gathers the parameters once, neither
    # hidden at stage 2; every ring inside one DGX H100: NCCL's 8.4 us plus 3.4 us per NVLink
    # step, at NVLink's achieved 370 GB/s.
    # ETP = 1: all 16,592 parameters (1,024 + 2 x 7,264 + 16 + 1,024) over the 4 GPUs in chunks
    # of 4,148: the all-reduce sends 2 x 3 x 4,148 x 2 B = 49,776 B in 8.4 + 6 x 3.4 = 28.8 us of
    # latency, the all-gather 3 x 4,148 x 2 B = 24,888 B in 8.4 + 3 x 3.4 = 18.6 us.
    # ETP = 2: the dense 4,304 over the 4 (chunks of 1,076: 12,912 B and 6,456 B), and the 6,144
    # expert elements a GPU holds (half of 2 x 4 x 1,536) over its expert-data-parallel pair 2
    # ranks apart (chunks of 3,072: 12,288 B in 8.4 + 2 x 3.4 = 15.2 us, 6,144 B in 11.8 us).
    us, rate = 1e-6, 370e9
    one = 2 * (28.8 * us + 49_776 / rate) + 18.6 * us + 24_888 / rate
    two = 2 * ((28.8 + 15.2) * us + (12_912 + 12_288) / rate) + (18.6 + 11.8) * us + (6_456 + 6_144) / rate
    times = parallel_step_time(TINY, IC, "h100-80gb", **{**BASE, "expert_parallel": 1, "stage": 2},
                               expert_tensor_parallel=np.array([1, 2]))
    assert float(times.data_parallel[0]) == pytest.approx(one, rel=1e-12)
    assert float(times.data_parallel[1]) == pytest.approx(two, rel=1e-12)
    # Half the bytes a step (63,000 B against 124,440 B), but a second ring's latency on every
    # call: on a model this small the step's data-parallel part grows (by 42 us).
    assert 2 * (12_912 + 12_288) + 6_456 + 6_144 == 63_000 < 124_440 == 2 * 49_776 + 24_888
    assert times.data_parallel[1] > times.data_parallel[0]


@pytest.mark.parametrize("changes, message", [
    (dict(expert_tensor_parallel=3), "expert_tensor_parallel must divide ffn_hidden"),
    (dict(expert_tensor_parallel=8), "expert_tensor_parallel x expert_parallel must divide "
                                     "tensor_parallel x data_parallel"),
    (dict(expert_tensor_parallel=1, tensor_parallel=2, data_parallel=2),
     "expert_tensor_parallel other than tensor_parallel needs sequence_parallel"),
    (dict(expert_tensor_parallel=2, stage=3, shard_group=2), "whole shard groups and no offload"),
])
def test_step_refusals_one_each(changes, message):
    with pytest.raises(ValueError, match=message):
        parallel_step_time(TINY, IC, "h100-80gb", **{**BASE, **changes})
