"""Issue 24, item 3: the API bounds every float it takes so that derived numbers stay finite."""
from __future__ import annotations

import math

import pytest

import zerolib as zl
from zerolib.core.catalogue.devices import Device
from zerolib.core.catalogue.links import Link
from zerolib.core.parse import parse_fraction
from zerolib.core.step.time import MIN_MFU, ComputeSettings, check_mfu, compute_seconds


@pytest.mark.parametrize("mfu", [1e-320, 5e-324, 1e-200, 0.000999])
def test_a_utilisation_below_a_tenth_of_a_percent_is_refused(mfu):
    with pytest.raises(ValueError, match=r"^mfu must be at least 0.001 \(0.1%\)"):
        check_mfu(mfu)
    with pytest.raises(ValueError, match="mfu must be at least"):
        ComputeSettings(mfu=mfu)
    with pytest.raises(ValueError, match="mfu must be at least"):
        zl.plan("llama-2-7b", 8, 8, "h100-80gb", 4096, 8, mfu=mfu, max_micro_batch=1)


def test_the_bound_itself_is_accepted_and_exactly_parsed():
    assert check_mfu(MIN_MFU) == 0.001
    assert parse_fraction("0.1%", "--mfu", minimum=MIN_MFU) == 0.001
    with pytest.raises(ValueError, match=r"--mfu must be at least 0.001 \(0.1%\), got '1e-320'"):
        parse_fraction("1e-320", "--mfu", minimum=MIN_MFU)


def test_the_worst_case_compute_time_is_finite():
    # 8 FLOPs x 10**15 parameters x 2**40 tokens / (65e12 FLOP/s x 0.001) is about 1.35e17 s.
    settings = ComputeSettings(tokens_per_gpu=2**40, mfu=MIN_MFU, recompute="full")
    forward, backward = compute_seconds(10**15, "t4-16gb", settings)
    total = float(forward + backward)
    assert math.isfinite(total)
    assert total == pytest.approx(8 * 10**15 * 2**40 / (65e12 * 0.001))


@pytest.mark.parametrize("peak", [1e-300, 0, -1, 10**22, True, 1.5])
def test_a_device_peak_must_be_a_whole_positive_number_of_flops(peak):
    with pytest.raises(ValueError, match="^peak_flops must be None or a whole number of FLOP/s"):
        Device("x", "x", 2**30, "a test", peak_flops=peak)


@pytest.mark.parametrize("capacity", [0, -5, 2**62 + 1, 1.5, True])
def test_a_device_capacity_must_be_whole_bytes_in_range(capacity):
    with pytest.raises(ValueError, match="^capacity must be a whole number of bytes"):
        Device("x", "x", capacity, "a test")


@pytest.mark.parametrize("latency", [float("inf"), float("nan"), -1e-6, 2.0, "1"])
def test_a_link_latency_must_be_finite_and_at_most_a_second(latency):
    with pytest.raises(ValueError, match="^hop_latency must be 0 to 1 seconds"):
        Link("x", "x", "network", 10**9, "1 GB/s", False, latency, "a test")


def test_a_link_bandwidth_has_an_upper_bound():
    with pytest.raises(ValueError, match="^bandwidth must be at most 1,000,000,000,000,000"):
        Link("x", "x", "network", 10**400, "fast", False, 1e-6, "a test")
