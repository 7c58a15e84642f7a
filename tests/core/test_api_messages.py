"""Issue 24, item 10: a wrong argument gets a TypeError/ValueError naming it and what is allowed,
never a Python internal ("'int' object is not iterable") or another argument's name."""
from __future__ import annotations

import pytest

import zerolib as zl

PLAN = ("llama-2-7b", 8, 8, "h100-80gb", 4096, 8)


@pytest.mark.parametrize("option, value, error, says", [
    ("stages", 3, TypeError, "stages must be a list or tuple of 0, 1, 2, 3, got 3"),
    ("stages", None, TypeError, "stages must be a list or tuple of 0, 1, 2, 3, got None"),
    ("recompute", "none", TypeError, "recompute must be a list or tuple of none, selective, full, "
                                     "op-selective, got 'none'"),
    ("offload", "none", TypeError, "offload must be a list or tuple of none, optimizer, "
                                   "optimizer+parameters, got 'none'"),
    ("chunks", 1, TypeError, "chunks must be a list or tuple of whole numbers"),
    ("sequence_parallel", True, TypeError, "sequence_parallel must be a list or tuple of False, "
                                           "True, got True"),
    ("shard_groups", None, ValueError, "shard_groups must be from all, whole, got None"),
    # a run's field: the run names it by its noun
    ("host_link", 3, ValueError, "cluster.host_link must be a PCIe link (pcie4-x16, pcie5-x16), got 3"),
    ("host_link", "warp", ValueError, "cluster.host_link must be a PCIe link (pcie4-x16, pcie5-x16), "
                                      "got 'warp'"),
])
def test_plan_names_the_argument(option, value, error, says):
    with pytest.raises(error) as caught:
        zl.plan(*PLAN, **{option: value})
    assert str(caught.value).startswith(says), str(caught.value)


@pytest.mark.parametrize("call", [
    lambda extra: zl.fewest_gpus(7 * 10**9, 3, extra_bytes=extra),
    lambda extra: zl.largest_model(64, 3, extra_bytes=extra),
    lambda extra: zl.model_state_fits(7 * 10**9, 8, 3, extra_bytes=extra),
])
def test_extra_bytes_empty_or_ragged_is_named(call):
    with pytest.raises(ValueError, match="^extra_bytes must not be empty"):
        call([])
    with pytest.raises(TypeError, match="^extra_bytes must be a number of bytes or an array"):
        call([[1], [2, 3]])


def test_a_single_value_in_a_list_still_plans():
    # 7B on 8 H100s at stage 0/1 with 1F1B only: some configurations run.
    result = zl.plan(*PLAN, stages=[0, 1], chunks=[1], recompute=("none",), offload=["none"],
                     sequence_parallel=[False], max_micro_batch=1)
    assert result.counts()["runnable"] > 0
