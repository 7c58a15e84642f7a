"""Step time (zerolib.core.step.time): compute from FLOPs, communication from the ring model, and
the stated overlap. Expected values are worked out by hand in the comments."""
import math

import numpy as np
import pytest

from zerolib.core.catalogue.nodes import interconnect
from zerolib.core.memory.placement import Placement
from zerolib.core.step.time import ComputeSettings, compute_seconds, step_time
from zerolib.core.step.traffic import flat_traffic, traffic
from zerolib.crosscheck.paper import PAPER_V100

P7 = 6_738_415_616                     # Llama-2-7B parameters
H100 = 989.5e12                        # dense bf16 FLOP/s


def test_compute_seconds_by_hand():
    # 6 x 6,738,415,616 x 4096 = 1.6560e14 FLOPs at 0.4 x 989.5e12 = 3.958e14 FLOP/s: 0.41840 s,
    # a third of it forward (2 of the 6 FLOPs), two thirds backward.
    forward, backward = compute_seconds(P7, "h100-80gb", ComputeSettings(4096, 0.4))
    assert math.isclose(float(forward + backward), 0.41840, rel_tol=1e-4)
    assert math.isclose(float(backward), 2 * float(forward))
    # Full recomputation: 8 FLOPs instead of 6, the extra forward inside the backward.
    forward, backward = compute_seconds(P7, "h100-80gb", ComputeSettings(4096, 0.4, "full"))
    assert math.isclose(float(forward + backward), 0.41840 * 8 / 6, rel_tol=1e-4)
    assert math.isclose(float(backward), 3 * float(forward))


def test_v100_and_t4_use_their_fp16_peak():
    from zerolib.core.catalogue.devices import get_device
    assert get_device("v100-32gb").peak_dtype == "fp16"
    assert get_device("t4-16gb").peak_flops == 65 * 10**12
    # 6 x 10^9 x 1000 FLOPs at 0.5 x 125e12: 0.096 s on a V100.
    forward, backward = compute_seconds(10**9, "v100-32gb", ComputeSettings(1000, 0.5))
    assert math.isclose(float(forward + backward), 0.096)


def test_a_bandwidth_bound_stage_0_by_hand():
    # Llama-2-7B on 64 GPUs over one NDR port per GPU (50 GB/s, every ring step on the network).
    # All-reduce: 2 x 63 x 105,287,744 x 2 bytes = 26,532,511,488 B / 50e9 = 0.530650 s, plus
    # 8.4 + 126 x 14.0 = 1772.4 us of latency: 0.532423 s, against 0.278934 s of backward
    # compute: 0.253489 s exposed; step 0.418401 + 0.253489 = 0.671890 s.
    t = traffic("llama-2-7b", 64, 0)
    s = step_time(t, interconnect("ib-ndr", efficiency="line-rate"), "h100-80gb")
    assert math.isclose(float(s.communication_seconds), 0.532423, rel_tol=1e-5)
    assert math.isclose(float(s.exposed_seconds), 0.532423 - 0.278934, rel_tol=1e-4)
    assert math.isclose(float(s.step_seconds), 0.671890, rel_tol=1e-5)
    assert math.isclose(float(s.network_wait_fraction), 0.253489 / 0.671890, rel_tol=1e-4)


def test_hidden_when_the_network_keeps_up():
    # On DGX H100 nodes (400 GB/s across nodes) the same all-reduce takes 0.0669 s, well inside
    # the 0.279 s backward: nothing exposed, the step is the compute.
    s = step_time(traffic("llama-2-7b", 64, 0), interconnect("dgx-h100", efficiency="line-rate"), "h100-80gb")
    assert float(s.exposed_seconds) == 0.0
    assert float(s.step_seconds) == float(s.compute_seconds)


def test_stages_1_and_2_wait_for_the_gather_after_the_step():
    # The updated parameters are all-gathered after the optimizer step: nothing to hide behind.
    # 13,266,255,744 B / 400e9 = 0.0331656 s plus 296.8 us of latency.
    s = step_time(traffic("llama-2-7b", 64, [1, 2]), interconnect("dgx-h100", efficiency="line-rate"), "h100-80gb")
    assert np.allclose(s.exposed["after_step"], 0.0331656 + 296.8e-6, rtol=1e-5)
    assert np.all(s.exposed["backward"] == 0) and np.all(s.exposed["forward"] == 0)


def test_stage_3_forward_gathers_overlap_the_forward():
    # 1 GB of fp32 parameters as one layer on 2 GPUs over PCIe 4.0 (31.5 GB/s), 1 token per GPU:
    # the forward is 2 x 10^9 / 0.4 x 312e12 = 16 us of compute against a gather of
    # 0.5e9 x 4 B = 2 GB / 31.5e9 = 63.5 ms: almost all of it exposed.
    t = flat_traffic(10**9, 2, 3, "fp32-adam")
    s = step_time(t, interconnect("pcie4-x16", efficiency="line-rate"), "a100-80gb", ComputeSettings(1, 0.4))
    gather = 2e9 / 31.5e9 + 8.4e-6 + 5.7e-6
    assert math.isclose(float(s.slot_seconds["forward_all_gather"]), gather, rel_tol=1e-9)
    assert math.isclose(float(s.exposed["forward"]), gather - 2e9 / (0.4 * 312e12), rel_tol=1e-9)


def test_compute_settings_are_checked():
    for bad in (0, 1.5, float("nan"), -0.1):
        with pytest.raises(ValueError, match="mfu"):
            ComputeSettings(mfu=bad)
    with pytest.raises(TypeError, match="mfu"):
        ComputeSettings(mfu=True)
    with pytest.raises(ValueError, match="tokens_per_gpu"):
        ComputeSettings(tokens_per_gpu=0)
    for bad in ("yes", True, None):
        with pytest.raises(ValueError, match="recompute must be one of none, selective, full"):
            ComputeSettings(recompute=bad)
    with pytest.raises(ValueError, match="attention_flops_per_token"):
        ComputeSettings(attention_flops_per_token=-1)
    with pytest.raises(ValueError, match="no peak"):
        compute_seconds(10**9, PAPER_V100)
    with pytest.raises(TypeError, match="traffic"):
        step_time("llama-2-7b", interconnect("dgx-h100", efficiency="line-rate"), "h100-80gb")


def test_the_rings_are_placed_on_the_interconnects_nodes():
    # 7e9 parameters, stage 0, on 32 GPUs of DGX-2 nodes (16 V100s, NVSwitch 150 GB/s, 8 x 100
    # Gb/s ports = 100 GB/s a node): the all-reduce over 2 nodes runs at min(150, 100) GB/s,
    # whatever node size the traffic was counted on: 2 x 31 x 218,750,000 x 2 B / 100e9 s, plus
    # 8.4 us + 60 NVLink steps of 3.4 us and 2 network steps of 14.0 us = 240.4 us of latency.
    ic = interconnect("dgx-2", efficiency="line-rate")
    seconds = step_time(traffic(7_000_000_000, 32, 0), ic).slot_seconds["gradient_all_reduce"]
    sent = 2 * 31 * 218_750_000 * 2
    assert float(seconds) == pytest.approx(sent / 100e9 + 240.4e-6, rel=1e-12)
    # A shard group's validity depends on where the nodes fall: counted on nodes of 8, refused.
    with pytest.raises(ValueError, match="placed on nodes of 8 GPUs"):
        step_time(traffic(7_000_000_000, 32, 2, shard_group=8), ic)
    assert step_time(traffic(7_000_000_000, 32, 2, shard_group=8,
                             placement=Placement(gpus_per_node=16)), ic)


def test_parse_fraction():
    from zerolib.core.parse import parse_fraction
    assert [parse_fraction(text, "--mfu") for text in ("0.4", "40%", "4e-1", "1", "100%")] == [
        0.4, 0.4, 0.4, 1.0, 1.0]
    for bad in ("0", "0%", "1.01", "-0.5", "nan", "40 percent", "", "٠.4"):
        with pytest.raises(ValueError, match="--mfu"):
            parse_fraction(bad, "--mfu")
    with pytest.raises(TypeError, match="--mfu"):
        parse_fraction(True, "--mfu")
