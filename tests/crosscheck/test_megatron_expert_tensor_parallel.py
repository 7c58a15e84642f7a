"""Megatron-LM's theoretical_memory_usage at ETP other than t still reconciles with zerolib's
model state, and with the planner's array path (which now searches ETP).

Mixtral-8x7B, one routed expert of a layer 3 x 4096 x 14336 = 176,160,768 parameters. t = 1,
d = 16 (16 GPUs), E = 2, ETP = 4: a GPU holds 8 / 2 = 4 experts a layer, each split 4 ways, so
32 x 4 x 176,160,768 / 4 = 5,637,144,576 expert parameters; EDP = 16 / (4 x 2 x 1) = 2; under
the distributed optimizer 6 + 12 / 2 = 12 bytes each: 67,645,734,912 B.
"""
from __future__ import annotations

import numpy as np

from zerolib.core.catalogue.models import get_model
from zerolib.core.memory.accounting import get_layout
from zerolib.core.memory.expert_parallel import ExpertLayout, expert_model_state, expert_state_of
from zerolib.core.memory.model_parallel import parallel_grid, parameters_on
from zerolib.crosscheck.conventions import megatron_theoretical_memory as megatron

EXPERT = 176_160_768


def test_etp_above_t_by_hand():
    args = megatron.args_for("mixtral-8x7b", 4096, 1,
                             megatron.ParallelFlags(1, data_parallel=16, expert_parallel=2, expert_tensor_parallel=4),
                             distributed_optimizer=True)
    assert megatron.expert_data_parallel_size(args) == 2
    assert megatron.moe_weight_and_optimizer_bytes(args)["experts"] == 32 * 4 * EXPERT // 4 * 12
    assert 32 * 4 * EXPERT // 4 * 12 == 67_645_734_912


def test_comparison_at_etp_other_than_t_agrees_on_the_experts():
    settings = ((1, 1, 16, 2, 4, True), (1, 1, 16, 1, 2, True), (2, 1, 8, 2, 1, True),
                (2, 1, 8, 2, 4, False), (4, 1, 4, 2, 1, True))
    frame = megatron.moe_comparison(settings=settings)
    assert len(frame) == 3 * len(settings)
    experts = frame[frame["item"] == "experts"]
    assert (experts["difference_bytes"] == 0).all()
    total = frame[(frame["item"] == "total")]
    assert (total["difference_bytes"] == 0).all()     # p = 1, no latent attention: nothing named


def test_the_planners_array_path_is_the_per_setting_count():
    config = get_model("mixtral-8x7b")
    widths = get_layout("mixed-adam")
    for t, d, e, etp in ((1, 16, 2, 4), (2, 8, 2, 1), (2, 8, 4, 4), (4, 4, 2, 1)):
        state = expert_model_state(config, t, 1, d, 1, widths, expert_parallel=e,
                                   expert_tensor_parallel=etp)    # p = 1: stage 0
        params = parameters_on(parallel_grid(config, t, 1, 0, "1f1b", 1))
        groups = ExpertLayout(*(np.int64(n) for n in (t, 1, d, e, etp)))
        got = expert_state_of(config, np.int64(params), np.int64(32), groups, np.int64(1), widths)
        assert int(got) == state.total
