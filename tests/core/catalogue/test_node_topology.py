"""Issue 22, item 10: the MI300X node is fully connected, and a ring across DGX A100 nodes pays
NCCL's network overhead of an AMD host on its intra-node steps.

MI300X: eight GPUs, each joined to the seven others by its own Infinity Fabric link (AMD ROCm
MI300 documentation), 64 GB/s per link (AMD ROCm blog 'Understanding RCCL Bandwidth and xGMI
Performance on AMD Instinct MI300X', 2025), about 48 GB/s usable. A ring over p of the node's GPUs
uses the p - 1 links among them (several rings at once): (p - 1) x 48 GB/s; 7 x 48 = 336 GB/s for
all eight, at line rate 7 x 64 = 448.

Latency, NCCL 2.30.7 src/graph/tuning.cc (Ring, Simple): baseLat 8.4 us; per step hwLat NVLink
3.4 us, network 14.0 us; once a ring spans nodes each intra-node step costs
max(hwLat, 3 x netOverhead), netOverhead (getNetOverhead) 2 us on AMD x86 hosts and 1 us on Intel.
DGX A100 has AMD EPYC 7742 hosts (NVIDIA DGX A100 datasheet), DGX H100 Intel Xeon 8480C.
"""
import math

import pytest

from zerolib.core.catalogue.nodes import NODES, bus_bandwidth, interconnect, ring_latency
from zerolib.core.step.collectives import ring_timing
from zerolib.core.step.time import send_seconds

GB = 10**9
US = 1e-6


def test_the_mi300x_node_is_fully_connected():
    node = NODES["mi300x-8"]
    assert node.fully_connected and node.intra.name == "xgmi-mi300x"
    ic = interconnect("mi300x-8")
    # Rings of 2, 4 and 8 GPUs inside the node: 1, 3 and 7 links of 48 GB/s.
    assert [float(b) for b in bus_bandwidth(ic, [2, 4, 8])] == [48e9, 144e9, 336e9]
    line = interconnect("mi300x-8", efficiency="line-rate")
    assert [float(b) for b in bus_bandwidth(line, [2, 4, 8])] == [64e9, 192e9, 448e9]


def test_a_fully_connected_ring_across_nodes_and_with_a_stride():
    ic = interconnect("mi300x-8")
    # 16 GPUs on two nodes: inside 336 GB/s, out of a node 8 x 400 Gb/s ports at 48 GB/s
    # = 384 GB/s: 336 binds.
    assert float(ring_timing(ic, "all_reduce", 16)[1]) == 336e9
    # Data-parallel rings of ranks 2 apart (tensor parallelism 2): 4 of each ring's GPUs per node,
    # the 3 links among them inside (144 GB/s); across nodes the ports shared by the node's 2
    # rings, 384 x 4 / 8 = 192 GB/s, against 144 inside: 144.
    assert float(ring_timing(ic, "all_gather", 4, 2)[1]) == 144e9
    assert float(ring_timing(ic, "all_gather", 8, 2)[1]) == 144e9
    # One GPU of the ring per node (stride 8): the port's 48 GB/s, one link's worth inside.
    assert float(ring_timing(ic, "all_gather", 4, 8)[1]) == 48e9


def test_a_point_to_point_message_uses_one_link():
    # A pipeline message between two MI300X of a node goes over their one link: 48 GB/s.
    ic = interconnect("mi300x-8")
    assert math.isclose(float(send_seconds(ic, 48e6, False)), 11.8 * US + 1e-3)


def test_a_switched_node_is_not_fully_connected():
    for name in ("dgx-h100", "dgx-a100", "dgx-2", "dgx-b200", "pcie-8x-l40s"):
        assert not NODES[name].fully_connected
        ic = interconnect(name)
        assert float(bus_bandwidth(ic, 2)) == float(bus_bandwidth(ic, ic.gpus_per_node))


def test_dgx_a100_latency_follows_nccls_model_on_amd_hosts():
    ic = interconnect("dgx-a100")
    assert ic.host_cpu == "amd"
    # All-reduce over 64 GPUs on 8 nodes: 2 x 63 = 126 steps, 2 x 7 = 14 across nodes.
    # 8.4 + 112 x max(3.4, 3 x 2.0) + 14 x 14.0 = 8.4 + 672 + 196 = 876.4 us (585.2 us before).
    assert float(ring_latency(ic, "all_reduce", 64)) == pytest.approx(876.4 * US, rel=1e-12)
    # An all-gather over 64: 63 steps, 7 across: 8.4 + 56 x 6.0 + 7 x 14.0 = 442.4 us.
    assert float(ring_latency(ic, "all_gather", 64)) == pytest.approx(442.4 * US, rel=1e-12)
    # Inside one node no network post is launched: 8.4 + 14 x 3.4 = 56 us.
    assert float(ring_latency(ic, "all_reduce", 8)) == pytest.approx(56.0 * US, rel=1e-12)


def test_intel_hosts_keep_nvlinks_step_latency():
    # 3 x 1.0 us = 3.0 us < NVLink's 3.4 us: DGX H100, DGX B200 and DGX-2 rings are unchanged.
    for name in ("dgx-h100", "dgx-b200"):
        ic = interconnect(name)
        assert ic.host_cpu == "intel"
        assert float(ring_latency(ic, "all_reduce", 64)) == pytest.approx(585.2 * US, rel=1e-12)
    # DGX-2, 16 GPUs a node: 64 GPUs on 4 nodes, 126 steps, 6 across: 8.4 + 120 x 3.4 + 6 x 14.
    assert float(ring_latency(interconnect("dgx-2"), "all_reduce", 64)) == pytest.approx(
        500.4 * US, rel=1e-12)


def test_the_overhead_follows_the_host_not_the_efficiency():
    line = interconnect("dgx-a100", efficiency="line-rate")
    assert float(ring_latency(line, "all_reduce", 64)) == pytest.approx(876.4 * US, rel=1e-12)
    # A single link has no nodes: every step on it, no overhead added.
    assert float(ring_latency(interconnect("nvlink3"), "all_reduce", 64)) == pytest.approx(
        (8.4 + 126 * 3.4) * US, rel=1e-12)


@pytest.mark.parametrize("efficiency", ["achieved", "line-rate", 0.7])
def test_the_caption_figure_is_the_ring_models_for_every_node(efficiency):
    # nodes.bus_bandwidth (captions) and collectives.ring_timing (the step) agree at stride 1.
    sizes = list(range(1, 65)) + [128, 1000, 1024]
    for name in NODES:
        for per_node in (None, 2, 4):
            ic = interconnect(name, per_node, efficiency)
            caption = bus_bandwidth(ic, sizes)
            ring = ring_timing(ic, "all_gather", sizes)[1]
            assert [float(c) for c in caption] == [float(r) for r in ring], (name, per_node)


def test_a_host_cpu_outside_nccls_table_is_refused_by_name():
    from zerolib.core.catalogue.links import get_link
    from zerolib.core.catalogue.nodes import Interconnect, Node
    link, port = get_link("nvlink4"), get_link("ib-ndr")
    with pytest.raises(ValueError, match="host_cpu must be one of intel, amd, other, got 'arm'"):
        Node("x", "x", 8, link, port, 8, True, "a source", host_cpu="arm")
    with pytest.raises(ValueError, match="host_cpu must be one of intel, amd, other, got 'arm'"):
        Interconnect("x", "x", link, port, 8, 8, host_cpu="arm")
