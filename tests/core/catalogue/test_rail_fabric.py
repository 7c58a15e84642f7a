"""The rail-optimised fabric: ``leaf_nodes`` nodes under one rail leaf switch and a spine
oversubscribed ``oversubscription``:1 (data/ring_at_scale.md).

Expected values worked by hand from the catalogue's cited rates (NVLink 4 370 GB/s achieved, an
NDR port 48 GB/s achieved, 50 at line rate; NVLink 3 230, an HDR port 24): a ring over more nodes
than one leaf holds leaves its nodes at 1/R of the ports' rate, min(intra, nics x port / R).
- DGX H100, leaf 32, R = 2: 32 nodes min(370, 384) = 370; 33 or 64 nodes min(370, 384 / 2 = 192)
  = 192 GB/s.  R = 1.5: 384 / 1.5 = 256.  At line rate, R = 2: min(450, 400 / 2) = 200.
- DGX A100, leaf 32, R = 2, 64 nodes: min(230, 192 / 2) = 96.
- A data-parallel ring with one GPU per node (stride 8) over 64 nodes: the node's 384 shared by its
  8 rings, 48, halved by the spine: 24 GB/s.
"""
import math

import numpy as np
import pytest

from zerolib.core.catalogue.nodes import (
    Interconnect,
    bus_bandwidth,
    interconnect,
    spanning_bandwidth,
    with_fabric,
)
from zerolib.core.run import Run
from zerolib.core.step.collectives import ring_timing

GB = 10**9


def h100(leaf=32, r=2.0, efficiency=None):
    return with_fabric(interconnect("dgx-h100", efficiency=efficiency), leaf, r)


@pytest.mark.parametrize("nodes, expected", [(1, 370), (32, 370), (33, 192), (64, 192), (128, 192)])
def test_a_ring_beyond_one_leaf_gets_half_the_ports_at_two_to_one(nodes, expected):
    assert float(bus_bandwidth(h100(), np.int64(8 * nodes))) == expected * GB


def test_other_ratios_links_and_efficiencies():
    assert float(bus_bandwidth(h100(r=1.5), np.int64(512))) == 256 * GB
    assert float(bus_bandwidth(h100(efficiency="line-rate"), np.int64(512))) == 200 * GB
    a100 = with_fabric(interconnect("dgx-a100"), 32, 2)
    assert float(bus_bandwidth(a100, np.int64(512))) == 96 * GB
    assert float(bus_bandwidth(a100, np.int64(256))) == 192 * GB


def test_the_defaults_change_nothing():
    plain = interconnect("dgx-h100")
    assert (plain.leaf_nodes, plain.oversubscription) == (None, 1.0)
    counts = np.array([8, 256, 264, 512, 1024, 16384], dtype=np.int64)
    expected = np.full(counts.shape, 370.0 * GB)
    np.testing.assert_array_equal(bus_bandwidth(plain, counts), expected)
    # non-blocking spine: the leaf size alone changes nothing; no leaf limit: R changes nothing
    np.testing.assert_array_equal(bus_bandwidth(h100(r=1), counts), expected)
    np.testing.assert_array_equal(bus_bandwidth(h100(leaf=None, r=4), counts), expected)
    assert with_fabric(plain, None, 1) is plain


def test_the_step_rings_and_concurrent_rings_see_the_spine():
    ic = h100()
    # the whole ring over 64 nodes; a data-parallel ring of one GPU per node over 64 and 32 nodes
    _, bandwidth = ring_timing(ic, "all_reduce", np.array([512, 64, 32]), np.array([1, 8, 8]))
    np.testing.assert_array_equal(bandwidth, np.array([192.0, 24.0, 48.0]) * GB)
    np.testing.assert_array_equal(spanning_bandwidth(ic, np.array([32, 64]), 8),
                                  np.array([48.0, 24.0]) * GB)


def test_the_answer_names_the_fabric():
    assert h100().as_dict()["leaf_nodes"] == 32 and h100().as_dict()["oversubscription"] == 2.0
    assert h100().fabric_words == "; 32 nodes per rail leaf, spine 2:1 beyond"
    assert interconnect("dgx-h100").fabric_words == ""
    # an interconnect given again with another efficiency keeps its fabric
    again = interconnect(h100(), efficiency="ring")
    assert (again.leaf_nodes, again.oversubscription) == (32, 2.0)


@pytest.mark.parametrize("leaf, r, error, name", [
    (0, 2, ValueError, "leaf_nodes"), (-3, 2, ValueError, "leaf_nodes"), (2.5, 2, ValueError, "leaf_nodes"),
    (32, 0.5, ValueError, "oversubscription"), (32, 65, ValueError, "oversubscription"),
    (32, math.nan, ValueError, "oversubscription"), (32, math.inf, ValueError, "oversubscription"),
    (32, "2", TypeError, "oversubscription"), (32, True, TypeError, "oversubscription")])
def test_bad_fields_are_refused_by_name(leaf, r, error, name):
    with pytest.raises(error, match=name):
        with_fabric(interconnect("dgx-h100"), leaf, r)
    with pytest.raises(error, match=name):
        Interconnect("x", "x", interconnect("dgx-h100").intra, interconnect("dgx-h100").network, 8, 8,
                     leaf_nodes=leaf, oversubscription=r)


@pytest.mark.parametrize("fields, error, message", [
    ({"leaf_nodes": 0}, ValueError, "cluster.leaf_nodes"),
    ({"oversubscription": 0.5}, ValueError, "cluster.oversubscription"),
    ({"oversubscription": "2"}, TypeError, "cluster.oversubscription")])
def test_a_run_checks_them_at_the_door(fields, error, message):
    with pytest.raises(error, match=message):
        Run.of("llama-2-7b", 64, link="dgx-h100", **fields)


def test_an_estimate_runs_on_the_fabric():
    from zerolib.core.estimate import estimate
    run = Run.of(7 * 10**9, 512, link="dgx-h100", leaf_nodes=32, oversubscription=2)
    answer = estimate(run).as_dict()["interconnect"]
    assert answer["bus_bandwidth"] == 192 * GB and answer["leaf_nodes"] == 32
    assert estimate(run.replace(gpus=256)).as_dict()["interconnect"]["bus_bandwidth"] == 370 * GB
    with pytest.raises(ValueError, match="oversubscription needs a link"):
        estimate(Run.of(7 * 10**9, 512, oversubscription=2))


def test_no_published_point_is_beyond_one_superpod_leaf():
    """data/ring_at_scale.md: every published point spans at most 32 nodes, so leaves of 32 behind
    any spine predict none of their shortfalls (the same 370, 192 and 96 GB/s)."""
    from zerolib.crosscheck.ring_at_scale import cluster_of, ring_at_scale
    rows = ring_at_scale().to_dict("records")
    assert max(int(row["nodes"]) for row in rows) == 32
    for row in rows:
        gpus = np.int64(int(row["nodes"]) * int(row["gpus_per_node"]))
        plain = cluster_of(row)
        assert float(bus_bandwidth(with_fabric(plain, 32, 4), gpus)) == float(bus_bandwidth(plain, gpus))
    assert sorted({float(bus_bandwidth(cluster_of(r), np.int64(int(r["nodes"]) * 8))) / GB
                   for r in rows}) == [96.0, 192.0, 370.0]
