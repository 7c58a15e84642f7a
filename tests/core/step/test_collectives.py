"""One ring collective (zerolib.core.step.collectives) and the interconnect it runs over
(zerolib.core.catalogue.links, zerolib.core.catalogue.nodes): bytes, bus bandwidth, latency, seconds.

Expected values are worked out by hand in the comments, from the ring algorithm, nccl-tests'
bus-bandwidth factors (doc/PERFORMANCE.md) and NCCL's latency constants (src/graph/tuning.cc).
"""
import math

import numpy as np
import pytest

from zerolib.core.catalogue.links import LINKS, get_link
from zerolib.core.catalogue.nodes import NODES, Interconnect, bus_bandwidth, interconnect, ring_latency
from zerolib.core.step.collectives import collective_seconds, ring_placement, ring_volume, to_bytes

GB = 10**9


def test_ring_placement_by_hand():
    # Ranks fill nodes of 8 in order. 16 consecutive GPUs: 8 on each of 2 nodes. 4 GPUs 4 apart
    # (the replicas of groups of 4): ranks 0, 4, 8, 12, 2 per node on 2 nodes. 8 GPUs 8 apart:
    # one per node, 8 nodes. 2 GPUs 2 apart: ranks 0 and 2, one node. 3 GPUs 16 apart: one per
    # node. Without nodes every ring is one "node".
    def place(size, stride, k):
        per_node, nodes = ring_placement(size, stride, k)
        return int(per_node), int(nodes)
    assert place(16, 1, 8) == (8, 2)
    assert place(4, 4, 8) == (2, 2)
    assert place(8, 8, 8) == (1, 8)
    assert place(2, 2, 8) == (2, 1)
    assert place(3, 16, 8) == (1, 3)
    assert place(64, 1, None) == (64, 1)
    per_node, nodes = ring_placement(np.array([16, 4]), np.array([1, 4]), 8)
    assert per_node.tolist() == [8, 2] and nodes.tolist() == [2, 2]


def test_ring_volume_by_hand():
    # 1000 elements on 4 GPUs in 16 bits: chunks of 250 elements (500 bytes).
    assert (int(ring_volume("all_reduce", 1000, 4, 16).handed),
            int(ring_volume("all_reduce", 1000, 4, 16).sent)) == (2000, 2 * 3 * 500)
    assert (int(ring_volume("reduce_scatter", 1000, 4, 16).handed),
            int(ring_volume("reduce_scatter", 1000, 4, 16).sent)) == (2000, 3 * 500)
    assert (int(ring_volume("all_gather", 1000, 4, 16).handed),
            int(ring_volume("all_gather", 1000, 4, 16).sent)) == (500, 3 * 500)


def test_padding_to_whole_chunks():
    # 1001 elements on 4 GPUs: chunks of ceil(1001/4) = 251, the buffer padded to 1004.
    rs = ring_volume("reduce_scatter", 1001, 4, 32)
    assert (int(rs.handed), int(rs.sent), int(rs.received)) == (4 * 1004, 4 * 753, 4 * 753)
    assert int(ring_volume("all_gather", 1001, 4, 32).handed) == 4 * 251


def test_sent_bytes_are_nccl_tests_bus_factor_times_size():
    # S = 8 x 10^6 bytes on n = 8: all-reduce 2(n-1)/n S = 14 x 10^6, the others 7 x 10^6.
    elements, n = 4 * 10**6, 8
    size = 2 * elements
    assert int(ring_volume("all_reduce", elements, n, 16).sent) == 2 * (n - 1) * size // n
    for kind in ("reduce_scatter", "all_gather"):
        assert int(ring_volume(kind, elements, n, 16).sent) == (n - 1) * size // n


def test_one_gpu_runs_no_collective():
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        volume = ring_volume(kind, 10**9, 1, 16)
        assert (int(volume.handed), int(volume.sent)) == (0, 0)


def test_sub_byte_widths_round_up():
    # 3 elements of 4 bits = 12 bits -> 2 whole bytes; 4 of them exactly 2.
    assert to_bytes(3, 4) == 2 and to_bytes(4, 4) == 2 and to_bytes(3, 16) == 6


def test_ring_volume_broadcasts():
    sent = ring_volume("all_gather", [100, 200], [[2], [4]], 8).sent
    # chunks: 100/2 = 50, 200/2 = 100 (x1 sent); 100/4 = 25, 200/4 = 50 (x3).
    assert sent.tolist() == [[50, 100], [75, 150]]


def test_bad_kinds_and_counts_are_named():
    with pytest.raises(ValueError, match="kind must be one of all_reduce"):
        ring_volume("all_to_all", 10, 2, 16)
    with pytest.raises(ValueError, match="elements"):
        ring_volume("all_gather", 0, 2, 16)
    with pytest.raises(ValueError, match="gpus"):
        ring_volume("all_gather", 10, 0, 16)


# --- links and nodes -----------------------------------------------------------------------------

def test_link_rates_are_per_direction():
    # NVLink 4: "900 GB/s bidirectional" = 450 each way; NDR: 400 Gb/s = 50 GB/s each way;
    # PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s each way.
    assert get_link("nvlink4").bandwidth == 450 * GB
    assert get_link("nvlink5").bandwidth == 900 * GB
    assert get_link("ib-ndr").bandwidth == 50 * GB
    assert get_link("roce-100g").bandwidth == 12_500_000_000
    assert get_link("pcie4-x16").bandwidth == 31_500_000_000
    assert abs(16e9 * 16 * 128 / 130 / 8 - get_link("pcie4-x16").bandwidth) < 0.01e9
    assert get_link("nvlink4").headline_is_bidirectional
    assert not get_link("ib-ndr").headline_is_bidirectional


def test_every_link_and_node_names_its_source():
    for entry in (*LINKS.values(), *NODES.values()):
        assert entry.source and entry.label and entry.name == entry.name.lower()


def test_bus_bandwidth_inside_and_across_nodes():
    dgx = interconnect("dgx-h100", efficiency="line-rate")
    # One node: NVLink 4, 450 GB/s. Eight nodes: each node's 8 rings leave it through 8 NDR
    # ports, 8 x 50 = 400 GB/s, below NVLink's 450.
    assert bus_bandwidth(dgx, [2, 8, 9, 64]).tolist() == [450 * GB, 450 * GB, 400 * GB, 400 * GB]
    # One 400G port per 8-GPU server: across servers 50 GB/s bounds the ring, but inside PCIe's
    # 31.5 GB/s is already slower.
    assert float(bus_bandwidth(interconnect("pcie-8x-l40s", efficiency="line-rate"), 16)) == 31.5 * GB
    # DGX-2: 8 EDR ports of 12.5 GB/s for 16 GPUs (not one per GPU): 100 GB/s < NVLink 2's 150.
    assert float(bus_bandwidth(interconnect("dgx-2", efficiency="line-rate"), 32)) == 100 * GB
    # A bare link joins every GPU alike.
    assert float(bus_bandwidth(interconnect("ib-ndr", efficiency="line-rate"), 1024)) == 50 * GB
    assert float(bus_bandwidth(interconnect("nvlink4", efficiency="line-rate"), 1024)) == 450 * GB


def test_gpus_per_node_moves_the_node_boundary():
    # 4 GPUs per DGX H100 (one port per GPU: 4 ports): 8 GPUs span two nodes, 4 x 50 = 200 GB/s.
    four = interconnect("dgx-h100", gpus_per_node=4, efficiency="line-rate")
    assert (four.gpus_per_node, four.nics) == (4, 4)
    assert float(bus_bandwidth(four, 8)) == 200 * GB
    # The L40S server keeps its single port whatever its GPU count.
    assert interconnect("pcie-8x-l40s", gpus_per_node=4, efficiency="line-rate").nics == 1


def test_ring_latency_follows_nccl():
    dgx = interconnect("dgx-h100", efficiency="line-rate")
    us = 1e-6
    # All-gather over 64 GPUs in 8 nodes: 63 steps, 7 across nodes:
    # 8.4 + 56 x 3.4 + 7 x 14.0 = 296.8 us.
    assert math.isclose(float(ring_latency(dgx, "all_gather", 64)), 296.8 * us)
    # All-reduce: 126 steps, 14 across: 8.4 + 112 x 3.4 + 14 x 14.0 = 585.2 us.
    assert math.isclose(float(ring_latency(dgx, "all_reduce", 64)), 585.2 * us)
    # Inside one node: 8.4 + 7 x 3.4 = 32.2 us; one GPU: none.
    assert math.isclose(float(ring_latency(dgx, "reduce_scatter", 8)), 32.2 * us)
    assert float(ring_latency(dgx, "all_reduce", 1)) == 0.0
    # Every step on the network for a bare network link: 8.4 + 3 x 14.0 = 50.4 us.
    assert math.isclose(float(ring_latency(interconnect("ib-ndr", efficiency="line-rate"), "all_gather", 4)), 50.4 * us)


def test_collective_seconds():
    dgx = interconnect("dgx-h100", efficiency="line-rate")
    # 40 GB sent per GPU at 400 GB/s is 0.1 s, plus one all-gather's 296.8 us of latency.
    seconds = collective_seconds("all_gather", 40 * GB, 1, 64, dgx)
    assert math.isclose(float(seconds), 0.1 + 296.8e-6)
    # Two calls, same bytes: one more latency.
    assert math.isclose(float(collective_seconds("all_gather", 40 * GB, 2, 64, dgx)),
                        0.1 + 2 * 296.8e-6)
    assert np.all(collective_seconds("all_reduce", [0, 0], [0, 0], [1, 1], dgx) == 0)


def test_bad_link_and_node_input_is_named():
    with pytest.raises(ValueError, match="link must be a node .*dgx-h100.* or a link .*nvlink4"):
        interconnect("nvlink9", efficiency="line-rate")
    with pytest.raises(ValueError, match="gpus_per_node needs a node"):
        interconnect("ib-ndr", gpus_per_node=8, efficiency="line-rate")
    with pytest.raises(ValueError, match="gpus_per_node"):
        interconnect("dgx-h100", gpus_per_node=0, efficiency="line-rate")
    with pytest.raises(ValueError, match="link must be one of"):
        get_link("infiniband")
    with pytest.raises(ValueError, match="kind"):
        ring_latency(interconnect("dgx-h100", efficiency="line-rate"), "broadcast", 4)
    with pytest.raises(ValueError, match="both"):
        Interconnect("x", "x", get_link("nvlink4"), None, 8, 1)
