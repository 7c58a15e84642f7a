"""Expert parallelism's all-to-alls, against bytes worked out by hand.

Mixtral-8x7B: hidden 4096, 8 experts, top-2, 32 layers. One micro-batch of 4,096 tokens in
16-bit: dropless, 4096 x 2 = 8,192 rows of 4096 x 2 bytes = 67,108,864 bytes handed to each
all-to-all; on E = 8 ranks 7/8 of it leaves the GPU.
"""
from __future__ import annotations

import pytest

from zerolib.core.catalogue.nodes import interconnect
from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.step.expert_parallel_traffic import expert_traffic, expert_traffic_seconds


def test_dropless_bytes_per_all_to_all_and_per_step():
    traffic = expert_traffic("mixtral-8x7b", 4096, 1, 8, micro_batches=3)
    assert traffic.rows == 8192
    assert traffic.handed_bytes == 8192 * 4096 * 2 == 67_108_864
    assert traffic.sent_bytes == 67_108_864 * 7 // 8
    assert traffic.calls == 4 * 32 * 3
    assert traffic.step_sent_bytes == 384 * 58_720_256


def test_capacity_factor_pads_every_expert_buffer():
    # c = 1.25: each of 8 experts takes ceil(1.25 x 2 x 1000 / 8) = ceil(312.5) = 313 rows
    traffic = expert_traffic("mixtral-8x7b", 1000, 1, 4, options=ActivationOptions(capacity_factor=1.25))
    assert traffic.rows == 8 * 313
    assert traffic.sent_bytes == 3 * 2 * 313 * 4096 * 2      # 3 other ranks, 2 experts each


def test_sequence_parallel_tensor_ranks_dispatch_their_part():
    traffic = expert_traffic("mixtral-8x7b", 4096, 1, 2, tensor_parallel=4,
                             options=ActivationOptions(sequence_parallel=True))
    assert traffic.tokens == 1024


def test_no_expert_parallelism_no_all_to_all():
    traffic = expert_traffic("mixtral-8x7b", 4096, 1, 1)
    assert (traffic.calls, traffic.step_sent_bytes) == (0, 0)
    assert expert_traffic_seconds(traffic, interconnect("dgx-h100")) == 0.0


def test_seconds_are_latency_plus_bytes_over_the_ring_bandwidth():
    from zerolib.core.step.collectives import ring_timing
    ic = interconnect("dgx-h100")
    traffic = expert_traffic("mixtral-8x7b", 4096, 1, 8)
    latency, bandwidth = ring_timing(ic, "all_to_all", 8)
    expected = traffic.calls * float(latency) + traffic.step_sent_bytes / float(bandwidth)
    assert expert_traffic_seconds(traffic, ic) == pytest.approx(expected, rel=1e-12)
    # ranks t = 8 apart leave the node: slower than inside it
    assert expert_traffic_seconds(traffic, ic, stride=8) > expert_traffic_seconds(traffic, ic)


@pytest.mark.parametrize("kwargs, words", [
    ({"expert_parallel": 3}, "expert_parallel must divide the routed experts"),
    ({"expert_parallel": 2, "tensor_parallel": 2}, "needs sequence_parallel"),
    ({"expert_parallel": 2, "options": {"capacity_factor": 0.5}}, "capacity_factor must be"),
])
def test_refusals(kwargs, words):
    with pytest.raises(ValueError, match=words):
        options = kwargs.pop("options", {})
        expert_traffic("mixtral-8x7b", 4096, 1, options=ActivationOptions(**options), **kwargs)


def test_dense_model_refused():
    with pytest.raises(ValueError, match="needs a mixture of experts"):
        expert_traffic("llama-2-7b", 4096, 1, 2)
