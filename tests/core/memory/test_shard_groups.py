"""Sharding groups (``model_state(..., shard_group=G)``): state sharded over G of N workers,
replicated over N / G groups (HSDP, MiCS). Expected values worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zerolib.core.memory.accounting import STAGES, model_state

GB = 10**9
P7B = 7 * 10**9


def test_group_size_curve_by_hand():
    # 7B, 64 GPUs, stage 3, mixed-adam (16 B per parameter), everything divided by G.
    state = model_state(P7B, 64, 3, "mixed-adam", shard_group=[1, 2, 4, 8, 16, 32, 64])
    assert state.total.tolist() == [112 * GB, 56 * GB, 28 * GB, 14 * GB, 7 * GB, 3_500_000_000,
                                    1_750_000_000]
    # Every GPU counts, replicas included: 64 x the per-GPU bytes.
    assert state.cluster_total.tolist() == [64 * t for t in state.total.tolist()]


def test_stage_1_and_2_shard_only_their_categories():
    # Stage 1, G = 8 of 64: 2 + 2 bytes whole, 12 / 8 = 1.5 bytes of optimizer state.
    assert int(model_state(P7B, 64, 1, shard_group=8).total) == P7B * 4 + P7B * 12 // 8
    # Stage 2: 2 whole, (2 + 12) / 8.
    assert int(model_state(P7B, 64, 2, shard_group=8).total) == P7B * 2 + P7B * 14 // 8


def test_uneven_group_rounds_up_per_worker():
    # 10 parameters sharded over 3: the most-loaded worker holds ceil(10 / 3) = 4 of each.
    state = model_state(10, 6, 3, "mixed-adam", shard_group=3)
    assert (int(state.parameters), int(state.gradients), int(state.optimizer)) == (8, 8, 48)


@given(params=st.integers(1, 10**13), gpus_exp=st.integers(0, 12), stage=st.sampled_from(STAGES))
def test_group_of_all_gpus_is_todays_zero_and_group_of_one_is_data_parallelism(params, gpus_exp,
                                                                                 stage):
    gpus = 2**gpus_exp
    plain = model_state(params, gpus, stage)
    full = model_state(params, gpus, stage, shard_group=gpus)
    for name in ("parameters", "gradients", "optimizer", "total", "cluster_total"):
        assert np.array_equal(getattr(full, name), getattr(plain, name)), name
    assert int(model_state(params, gpus, stage, shard_group=1).total) == int(
        model_state(params, gpus, 0).total)


def test_shard_group_broadcasts_with_the_other_inputs():
    state = model_state(P7B, 64, [[0], [3]], shard_group=[8, 64])
    assert state.total.shape == (2, 2)
    assert state.total[0].tolist() == [112 * GB, 112 * GB]
    assert state.total[1].tolist() == [14 * GB, 1_750_000_000]


@pytest.mark.parametrize("group, says", [(3, "shard_group must divide gpus"),
                                         (128, "shard_group must divide gpus"),
                                         (0, "shard_group must be a positive whole number"),
                                         (2.5, "shard_group"), ("8", "shard_group")])
def test_bad_shard_groups_are_named(group, says):
    with pytest.raises((ValueError, TypeError), match=says):
        model_state(P7B, 64, 3, shard_group=group)


def test_bad_shard_group_in_an_array_names_the_offending_value():
    with pytest.raises(ValueError, match="shard_group 6 with gpus 64"):
        model_state(P7B, 64, 3, shard_group=[8, 6])
