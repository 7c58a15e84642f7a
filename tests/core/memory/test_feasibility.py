"""Fit, fewest workers and largest model, checked against hand-solved inequalities."""
import numpy as np
import pytest

from zerolib.core.memory.feasibility import fewest_gpus, largest_model, model_state_fits

A100_80GB = 80 * 2**30      # 85_899_345_920 bytes
V100_32GB = 32 * 2**30


def test_fits_at_the_boundary():
    # 16 bytes per parameter on one worker: A100_80GB / 16 = 5_368_709_120 parameters exactly.
    assert model_state_fits(5_368_709_120, 1, 0)
    assert not model_state_fits(5_368_709_121, 1, 0)
    assert model_state_fits(5_368_709_120, 1, 0, extra_bytes=0)
    assert not model_state_fits(5_368_709_120, 1, 0, extra_bytes=1)


def test_fewest_gpus_7b_on_a100_80gb():
    # Stage 0 needs 112 GB on every worker: never. Stage 1: 28 GB + 84 GB / N <= 85.9 GB -> N >= 1.45.
    # Stage 2: 14 + 98/N -> N >= 1.36; stage 3: 112/N -> N >= 1.30. So 2 for each ZeRO stage.
    assert fewest_gpus(7_000_000_000, 0) is None
    assert [fewest_gpus(7_000_000_000, s) for s in (1, 2, 3)] == [2, 2, 2]


def test_fewest_gpus_70b():
    # Stage 3: 1120 GB / N <= 85.899 GB -> N >= 13.04 -> 14. Stages 1-2 replicate 140 GB of
    # parameters alone: never.
    assert fewest_gpus(70_000_000_000, 3) == 14
    assert fewest_gpus(70_000_000_000, 1) is None and fewest_gpus(70_000_000_000, 2) is None
    # Vectorised: 0 marks "never".
    assert list(fewest_gpus(70_000_000_000, [0, 1, 2, 3])) == [0, 0, 0, 14]


def test_fewest_gpus_respects_max_gpus_and_extra_bytes():
    assert fewest_gpus(70_000_000_000, 3, max_gpus=13) is None
    # Reserving 10 GB per worker: 1120/N <= 75.899 -> N >= 14.76 -> 15.
    assert fewest_gpus(70_000_000_000, 3, extra_bytes=10 * 10**9) == 15


def test_largest_model():
    assert largest_model(1, 0) == A100_80GB // 16
    # V100 32GB, stage 3 on 64 workers: ceil(P/64) * 16 <= 32 GiB -> P <= 64 * 2**31.
    assert largest_model(64, 3, device="v100-32gb") == 64 * 2**31
    # Stage 1 on 64 V100s: 4P + 12 ceil(P/64) <= 32 GiB.
    p = largest_model(64, 1, device="v100-32gb")
    assert 4 * p + 12 * -(-p // 64) <= V100_32GB < 4 * (p + 1) + 12 * -(-(p + 1) // 64)
    assert list(largest_model([1, 64], 3, device="v100-32gb")) == [V100_32GB // 16, 64 * 2**31]


@pytest.mark.parametrize("call, error, names", [
    (lambda: model_state_fits(7e9, 0, 3), ValueError, "gpus"),
    (lambda: fewest_gpus(-7, 3), ValueError, "params"),
    (lambda: fewest_gpus(7e9, 5), ValueError, "stage"),
    (lambda: largest_model(64, 3, device="tpu"), ValueError, "device"),
    (lambda: model_state_fits(7e9, 4, 3, extra_bytes=-1), ValueError, "extra_bytes"),
    (lambda: fewest_gpus(7e9, 3, max_gpus=0), ValueError, "max_gpus"),
    (lambda: fewest_gpus(7e9, 3, max_gpus=[8, 16]), TypeError, "max_gpus"),
    (lambda: fewest_gpus(7e9, 3, layout="adam-4bit"), ValueError, "layout"),
    (lambda: largest_model([1, 2], 3, extra_bytes=[1, 2, 3]), ValueError, "gpus, stage, extra_bytes"),
])
def test_bad_input_names_the_argument(call, error, names):
    with pytest.raises(error, match=names):
        call()


def test_extra_bytes_broadcast_like_the_other_arguments():
    # 70B under stage 3 with 0 or 10 GB per worker reserved: 14 and 15 GPUs (worked out above).
    assert list(fewest_gpus(70_000_000_000, 3, extra_bytes=[0, 10 * 10**9])) == [14, 15]


def test_fewest_gpus_agrees_with_a_linear_scan():
    params = np.array([1, 3, 7, 13, 30, 70, 175]) * 10**9
    found = fewest_gpus(params, 3, max_gpus=512)
    for p, n in zip(params, found):
        first = next((g for g in range(1, 513) if -(-p // g) * 16 <= A100_80GB), 0)
        assert n == first
