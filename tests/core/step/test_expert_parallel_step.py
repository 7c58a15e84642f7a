"""parallel_step_time with expert parallelism (E as an array): the all-to-alls as the ``expert``
part, the rules it refuses in one ValueError each, and E = 1 exactly as before."""
from __future__ import annotations

import numpy as np
import pytest

from zerolib.core.memory.activations import ActivationOptions
from zerolib.core.step.expert_parallel_traffic import expert_traffic, expert_traffic_seconds
from zerolib.core.step.parallel import PARTS, cluster_interconnect, parallel_step_time

IC = cluster_interconnect("dgx-h100", 8)
BASE = dict(seq_len=1024, micro_batch=1, tensor_parallel=1, pipeline_parallel=1, data_parallel=8,
            stage=1, micro_batches=2)


def test_expert_part_is_the_all_to_alls_and_adds_up():
    times = parallel_step_time("mixtral-8x7b", IC, "h100-80gb", **BASE, expert_parallel=np.array([1, 8]))
    assert PARTS == ("compute", "tensor", "context", "expert", "pipeline", "data_parallel", "bubble")
    # m = 2 micro-batches, 32 MoE layers, 4 all-to-alls each: 256 calls of 1,792 x 8,192 bytes.
    traffic = expert_traffic("mixtral-8x7b", 1024, 1, 8, micro_batches=2)
    assert traffic.calls == 256
    assert times.parts["expert"][0] == 0.0
    assert times.parts["expert"][1] == pytest.approx(expert_traffic_seconds(traffic, IC), rel=1e-12)
    assert times.step_seconds == pytest.approx(sum(times.parts.values()))
    assert times.network_seconds[1] > times.parts["expert"][1]


def test_one_degree_is_the_plain_step():
    plain = parallel_step_time("mixtral-8x7b", IC, "h100-80gb", **BASE)
    ones = parallel_step_time("mixtral-8x7b", IC, "h100-80gb", **BASE, expert_parallel=1)
    assert float(plain.step_seconds) == float(ones.step_seconds)


@pytest.mark.parametrize("model, changes, message", [
    ("llama-2-7b", dict(expert_parallel=2), "expert_parallel above 1 needs a mixture of experts; "
                                            "llama-2-7b has no experts"),
    ("mixtral-8x7b", dict(expert_parallel=3, data_parallel=6), "expert_parallel must divide the routed experts"),
    ("mixtral-8x7b", dict(expert_parallel=8, data_parallel=4), "expert_parallel must divide data_parallel"),
    ("mixtral-8x7b", dict(expert_parallel=2, tensor_parallel=2, data_parallel=4),
     "needs sequence_parallel"),
    ("mixtral-8x7b", dict(expert_parallel=2, stage=3, shard_group=4), "whole shard groups and no offload"),
])
def test_rules_refused_naming_them(model, changes, message):
    with pytest.raises(ValueError, match=message):
        parallel_step_time(model, IC, "h100-80gb", **{**BASE, **changes})


def test_a_capacity_factor_pads_the_dispatch():
    # Capacity 1.25: each of the 8 experts takes ceil(1.25 x 2 x 1024 / 8) = 320 rows from a GPU,
    # 2,560 in all, 2,240 of them for the other 7 ranks' experts.
    times = parallel_step_time("mixtral-8x7b", IC, "h100-80gb", **BASE, expert_parallel=8,
                               capacity_factor=1.25)
    traffic = expert_traffic("mixtral-8x7b", 1024, 1, 8, micro_batches=2,
                             options=ActivationOptions(capacity_factor=1.25))
    assert (traffic.rows, traffic.sent_bytes) == (2560, 2240 * 4096 * 2)
    assert float(times.parts["expert"]) == pytest.approx(expert_traffic_seconds(traffic, IC), rel=1e-12)


def test_a_capacity_factor_is_checked():
    with pytest.raises(ValueError, match="capacity_factor"):
        parallel_step_time("mixtral-8x7b", IC, "h100-80gb", **BASE, expert_parallel=8,
                           capacity_factor=-1.0)
