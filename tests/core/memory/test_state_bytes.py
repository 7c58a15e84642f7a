"""The scalar path of one answer (state_bytes, check_one, check_stages) gives exactly what the
array path gives: the same bytes and the same errors, word for word."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolib.core.estimate import estimate
from zerolib.core.inputs import (
    MAX_GPUS,
    MAX_PARAMS,
    check_gpus,
    check_one,
    check_params,
    check_single,
    check_stage,
    check_stages,
)
from zerolib.core.memory.accounting import LAYOUTS, Layout, model_state, state_bytes

EIGHTHS = st.integers(0, 8 * 20).map(lambda n: n / 8)   # widths in whole bits
LAYOUT = st.one_of(st.sampled_from(list(LAYOUTS.values())),
                   st.builds(Layout.custom, EIGHTHS, EIGHTHS, EIGHTHS))


@settings(max_examples=300, deadline=None)
@given(params=st.integers(1, MAX_PARAMS), gpus=st.integers(1, MAX_GPUS),
       stage=st.integers(0, 3), layout=LAYOUT)
def test_state_bytes_is_model_state(params, gpus, stage, layout):
    arrays = model_state(params, gpus, stage, layout).as_dict()
    assert state_bytes(params, gpus, stage, layout) == {k: int(v) for k, v in arrays.items()}


def test_state_bytes_by_hand():
    # 1B parameters on 4 workers, 2 + 2 + 12 bytes: the README's 16.0, 7.0, 5.5, 4.0 GB.
    totals = [state_bytes(10**9, 4, stage, LAYOUTS["mixed-adam"])["total"] for stage in range(4)]
    assert totals == [16 * 10**9, 7 * 10**9, 5_500_000_000, 4 * 10**9]
    # 3 bits of optimizer state on 1 parameter take a whole byte; 10 parameters over 4 workers
    # keep ceil(10 / 4) = 3 on the most-loaded one.
    assert state_bytes(1, 1, 0, Layout.custom(0, 0, 0.375))["optimizer"] == 1
    assert state_bytes(10, 4, 3, LAYOUTS["mixed-adam"])["parameters"] == 6
    # 10^15 parameters on 2^24 GPUs: the cluster total passes int64 and stays exact.
    big = state_bytes(MAX_PARAMS, MAX_GPUS, 0, LAYOUTS["mixed-adam"])["cluster_total"]
    assert big == 16 * MAX_PARAMS * MAX_GPUS


BAD = [0, -1, 1.5, float("nan"), float("inf"), 10**15 + 1, 2**70, -(2**70), True, "7B", None,
       [1, 2], np.int64(0), 7.0e15]


@pytest.mark.parametrize("check, name, value", [
    *((check_params, "params", value) for value in BAD),
    *((check_gpus, "gpus", value) for value in [*BAD, 2**24 + 1, 16777217.0])])
def test_check_one_refuses_as_check_single_does(check, name, value):
    with pytest.raises((ValueError, TypeError)) as expected:
        check_single(value, check, name)
    with pytest.raises(expected.type) as got:
        check_one(value, check, name)
    assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("value", [1, 64, 7e9, 2**24, np.int64(8)])
def test_check_one_accepts_as_check_single_does(value):
    assert check_one(value, check_gpus if value <= 2**24 else check_params, "x") == int(value)


@pytest.mark.parametrize("stages", [(0, 1, 2, 3), [3], (2, 0), 1, np.array([0, 3]), [1.0]])
def test_check_stages_is_check_stage(stages):
    assert check_stages(stages) == tuple(check_stage(stages, "stages").ravel().tolist())


@pytest.mark.parametrize("stages", [(), (4,), (0, -1), [True], "0", (0, 1.5)])
def test_check_stages_refuses_as_check_stage_does(stages):
    with pytest.raises((ValueError, TypeError)) as expected:
        check_stage(stages, "stages")
    with pytest.raises(expected.type) as got:
        check_stages(stages)
    assert str(got.value) == str(expected.value)


def test_estimate_rows_are_the_array_rows():
    for params, gpus, device in ((7e9, 64, None), (175_000_000_001, 1000, "a100-80gb"),
                                 (10**15, 2**24, "h100-80gb")):
        got = estimate(params, gpus, device=device).stages
        state = model_state(int(params), gpus, [0, 1, 2, 3]).as_dict()
        for index, row in enumerate(got):
            assert {k: row[k] for k in state} == {k: int(v[index]) for k, v in state.items()}
