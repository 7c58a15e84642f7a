"""What real links deliver: the bus bandwidth NCCL reaches on each catalogue link, the
LinkEfficiency setting (achieved by default, line-rate, or a fraction), and the one ring model
using it for every collective.

Expected values are the published figures, quoted in the catalogue's ``achieved_source``:
- NVLink 4 (H100): 370 of 450 GB/s (S. Jeaugey, NVIDIA/nccl-tests issue #212);
- NVLink 3 (A100): 230 of 300 GB/s (S. Jeaugey, nccl-tests issue #149);
- InfiniBand: 12 GB/s per 100G port, 24 per 200G (nccl-tests issue #119), 48 per 400G NDR port
  (A. Laddy, nccl-tests issue #267);
- Infinity Fabric (MI300X): 48 of 64 GB/s per link (AMD ROCm blog on RCCL and xGMI, 2025);
- where nothing was published, NCCL's own model (src/graph/topo.h, topo.cc, NCCL 2.30.7): NVLink 2
  6 x 20 = 120 GB/s, NVLink 5 18 x 40.1 = 721.8 GB/s, PCIe 4.0 x16 16 x 120 / 80 = 24 GB/s,
  PCIe 5.0 x16 48 GB/s.
"""
import math

import numpy as np
import pytest

import zerolib as zl
from zerolib.core.catalogue.links import LINKS, LinkEfficiency, get_link, link_efficiency
from zerolib.core.catalogue.nodes import Interconnect, bus_bandwidth, interconnect
from zerolib.core.step.collectives import collective_seconds, ring_timing
from zerolib.core.step.time import send_seconds, step_time
from zerolib.core.step.traffic import flat_traffic

GB = 10**9
US = 1e-6


@pytest.mark.parametrize("name, line, achieved", [
    ("nvlink2", 150, 120), ("nvlink3", 300, 230), ("nvlink4", 450, 370), ("nvlink5", 900, 721.8),
    ("xgmi-mi300x", 64, 48), ("pcie4-x16", 31.5, 24), ("pcie5-x16", 63, 48),
    ("ib-edr", 12.5, 12), ("ib-hdr", 25, 24), ("ib-ndr", 50, 48),
    ("roce-100g", 12.5, 12), ("roce-200g", 25, 24), ("roce-400g", 50, 48)])
def test_each_link_has_its_published_or_modelled_bus_bandwidth(name, line, achieved):
    link = get_link(name)
    assert link.bandwidth == round(line * GB)
    assert link.achieved_bandwidth == round(achieved * GB)
    assert link.achieved_source            # every figure says where it comes from


def test_every_catalogue_link_reaches_less_than_its_line_rate_and_says_why():
    for link in LINKS.values():
        assert 0 < link.achieved_bandwidth < link.bandwidth
        source = link.achieved_source
        assert "nccl-tests issue" in source or "AMD ROCm blog" in source or "NCCL's own" in source
    # NVLink 4's figure is the one NCCL's maintainer gives: about 82 % of the line rate.
    assert get_link("nvlink4").achieved_bandwidth / get_link("nvlink4").bandwidth == 370 / 450


def test_the_setting_names_and_fractions():
    nvlink4 = get_link("nvlink4")
    assert LinkEfficiency().rate(nvlink4) == 370e9 and LinkEfficiency().name == "achieved"
    assert LinkEfficiency("line-rate").rate(nvlink4) == 450e9
    assert LinkEfficiency(" Line-Rate ").name == "line-rate"
    assert LinkEfficiency(0.5).rate(nvlink4) == 225e9 and LinkEfficiency(0.5).name == "0.5"
    assert LinkEfficiency(1).rate(nvlink4) == 450e9
    assert link_efficiency(None) == LinkEfficiency("achieved")
    assert link_efficiency(0.8) == LinkEfficiency(0.8)


@pytest.mark.parametrize("bad", [0, -0.1, 1.01, float("nan"), float("inf"), "fast", "80%"])
def test_a_bad_efficiency_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="link_efficiency must be achieved or ring or line-rate or a "
                                         "fraction above 0 and at most 1"):
        LinkEfficiency(bad)


@pytest.mark.parametrize("bad", [True, None, [0.5]])
def test_a_wrong_type_is_a_type_error(bad):
    with pytest.raises(TypeError, match="link_efficiency must be"):
        LinkEfficiency(bad)
    with pytest.raises(TypeError, match="efficiency must be a LinkEfficiency"):
        Interconnect("x", "x", get_link("nvlink4"), efficiency="achieved")


def test_the_ring_runs_at_the_achieved_rate_by_default():
    ic = interconnect("dgx-h100")
    assert ic.efficiency.name == "achieved"
    # Inside a node: NVLink 4 at 370 GB/s. Across nodes: 8 NDR ports of 48 GB/s = 384 GB/s, so
    # NVLink's 370 binds. Nodes of 4 (4 ports): 4 x 48 = 192 GB/s. (An all-reduce inside the
    # node runs on NVLS instead: test_nvls below.)
    assert [float(b) for b in ring_timing(ic, "reduce_scatter", [8, 64])[1]] == [370e9, 370e9]
    assert float(ring_timing(ic, "all_reduce", 64)[1]) == 370e9
    assert float(ring_timing(interconnect("dgx-h100", 4), "all_gather", 8)[1]) == 192e9
    # At line rate, the earlier model: 450 inside, min(450, 8 x 50) = 400 across.
    line = interconnect("dgx-h100", efficiency="line-rate")
    assert [float(b) for b in ring_timing(line, "all_reduce", [8, 64])[1]] == [450e9, 400e9]
    # Half the line rate of every link: 225 inside, min(225, 8 x 25) = 200 across.
    half = interconnect("dgx-h100", efficiency=0.5)
    assert [float(b) for b in ring_timing(half, "reduce_scatter", [8, 64])[1]] == [225e9, 200e9]
    # A ring whose ranks are 8 apart (one GPU per node): the node's ports shared 8 ways, 48 GB/s.
    assert float(ring_timing(ic, "all_gather", 8, 8)[1]) == 48e9
    # The caption's figure is the same ring's.
    assert float(bus_bandwidth(ic, 64)) == 370e9 and float(bus_bandwidth(half, 64)) == 200e9


def test_a_single_link_and_the_dgx_a100():
    assert float(bus_bandwidth(interconnect("ib-ndr"), 1024)) == 48e9
    assert float(bus_bandwidth(interconnect("nvlink5"), 72)) == 721.8e9
    # DGX A100: NVLink 3 at 230 GB/s; 8 HDR ports of 24 GB/s = 192 GB/s across.
    assert [float(b) for b in bus_bandwidth(interconnect("dgx-a100"), [8, 16])] == [230e9, 192e9]


def test_every_collective_and_the_pipeline_message_use_it():
    ic = interconnect("dgx-h100", efficiency="ring")    # NVLS off: the ring's 370 GB/s
    # One all-reduce over 8 GPUs sending 37 GB: 8.4 + 14 x 3.4 = 56 us, plus 37e9 / 370e9 = 0.1 s.
    assert math.isclose(float(collective_seconds("all_reduce", 37e9, 1, 8, ic)), 0.1 + 56 * US)
    # A pipeline message of 37 MB inside a node: 8.4 + 3.4 us + 37e6 / 370e9 = 111.8 us;
    # across nodes each GPU's share of the ports, 384 / 8 = 48 GB/s: 8.4 + 14 us + 37e6 / 48e9.
    inside, across = send_seconds(ic, 37e6, [False, True])
    assert math.isclose(float(inside), 111.8 * US)
    assert math.isclose(float(across), 22.4 * US + 37e6 / 48e9)
    # The step's slots: stage 0 of 1e9 16-bit parameters on 8 GPUs, one all-reduce of
    # 2 x 7 x 125,000,000 x 2 B = 3.5 GB at 370 GB/s plus 56 us.
    times = step_time(flat_traffic(10**9, 8, 0), ic)
    assert math.isclose(float(times.slot_seconds["gradient_all_reduce"]), 3.5e9 / 370e9 + 56 * US)
    assert float(times.slot_bandwidth["gradient_all_reduce"]) == 370e9


def test_the_tensor_parallel_rings_of_the_planner_use_it():
    # t = 8 inside a DGX A100: its all-reduces run at 230 GB/s by default and 300 at line rate.
    from zerolib.core.step.parallel import cluster_interconnect
    for efficiency, rate in ((None, 230e9), ("line-rate", 300e9)):
        ic = cluster_interconnect("dgx-a100", 8, efficiency)
        assert float(ring_timing(ic, "all_reduce", 8)[1]) == rate
    pair = cluster_interconnect("nvlink4,ib-ndr", 4, 0.9)
    assert pair.efficiency.name == "0.9" and pair.network_rate == 4 * 45e9


def test_the_api_takes_and_reports_the_efficiency():
    result = zl.estimate(7e9, 64, device="h100-80gb", link="dgx-h100")
    assert result.as_dict()["interconnect"]["link_efficiency"] == "achieved"
    assert result.as_dict()["interconnect"]["bus_bandwidth"] == 370 * GB
    line = zl.estimate(7e9, 64, link="dgx-h100", link_efficiency="line-rate").as_dict()
    assert line["interconnect"]["link_efficiency"] == "line-rate"
    assert line["interconnect"]["bus_bandwidth"] == 400 * GB
    # 0.8 of the line rate: min(0.8 x 450, 8 x 0.8 x 50) = min(360, 320) = 320 GB/s.
    fraction = zl.estimate(7e9, 64, link="dgx-h100", link_efficiency=0.8).as_dict()
    assert fraction["interconnect"]["bus_bandwidth"] == 320 * GB
    with pytest.raises(ValueError, match="link_efficiency needs a link"):
        zl.estimate(7e9, 64, link_efficiency=0.8)
    with pytest.raises(ValueError, match="link_efficiency must be"):
        zl.estimate(7e9, 64, link="dgx-h100", link_efficiency=2)
    # An Interconnect passed in keeps its own efficiency unless one is given.
    ic = interconnect("dgx-h100", efficiency="line-rate")
    assert interconnect(ic) is ic and interconnect(ic, efficiency=0.5).efficiency.name == "0.5"


def test_the_plan_says_which_efficiency_it_assumed():
    settings = zl.plan("llama-2-7b", 16, 8, "h100-80gb", 4096, 16, link_efficiency="line-rate",
                       stages=(0,), recompute=("none",), chunks=(1,),
                       max_micro_batch=1).settings
    assert settings.as_dict()["links"]["link_efficiency"] == "line-rate"
    assert np.isclose(settings.interconnect.intra_rate, 450e9)


def test_the_fall_at_small_messages_is_the_latency_term():
    # NCCL's own model (tuning.cc): time = latency + bytes / bus bandwidth. An all-gather of
    # S = 8 MiB over the 8 GPUs of a DGX H100 sends 7/8 x S = 7,340,032 B per GPU: 32.2 us
    # (8.4 + 7 x 3.4) + 7,340,032 / 370e9 s = 52.038 us, a bus bandwidth of 141.05 GB/s; at
    # S = 8 GiB the latency is lost in 20.35 ms and the bus bandwidth is 369.41 GB/s.
    ic = interconnect("dgx-h100")
    for size, busbw in ((8 * 2**20, 141.05e9), (8 * 2**30, 369.41e9)):
        sent = 7 * size / 8
        seconds = float(collective_seconds("all_gather", sent, 1, 8, ic))
        assert sent / seconds == pytest.approx(busbw, rel=1e-4)


def test_nvls_runs_an_all_reduce_inside_an_h100_node():
    # NVIDIA/nccl issue #1455, 8 x H100 SXM at 2-4 GiB: NVLS bus bandwidth 420, 440, 460 and
    # 480 GB/s on 5, 6, 7 and 8 GPUs; 4 GPUs and fewer stay on the ring (370).
    ic = interconnect("dgx-h100")
    rates = ring_timing(ic, "all_reduce", [2, 4, 5, 6, 7, 8])[1]
    assert [float(r) for r in rates] == [370e9, 370e9, 420e9, 440e9, 460e9, 480e9]
    # Only the all-reduce: a reduce-scatter or all-gather of 8 GPUs stays on the ring.
    assert float(ring_timing(ic, "all_gather", 8)[1]) == 370e9
    # Across nodes it is the ring's (16 GPUs on 2 nodes: min(370, 8 x 48 = 384) = 370).
    assert float(ring_timing(ic, "all_reduce", 16)[1]) == 370e9
    # A ring of 8 whose ranks are 2 apart holds 4 GPUs per node: two nodes, the ring's.
    assert float(ring_timing(ic, "all_reduce", 8, 2)[1]) == min(370e9, 4 * 48e9)
    # One all-reduce over 8 GPUs sending 48 GB: 56 us of latency (the ring's, kept) plus
    # 48e9 / 480e9 = 0.1 s.
    assert math.isclose(float(collective_seconds("all_reduce", 48e9, 1, 8, ic)), 0.1 + 56 * US)
    # Stage 0 of 1e9 16-bit parameters on 8 GPUs: 3.5 GB at 480 GB/s, plus 56 us.
    times = step_time(flat_traffic(10**9, 8, 0), ic)
    assert math.isclose(float(times.slot_seconds["gradient_all_reduce"]), 3.5e9 / 480e9 + 56 * US)
    # "ring" turns it off (NCCL_NVLS_ENABLE=0); line rate and fractions model no NVLS either.
    for setting in ("ring", "line-rate", 0.9):
        other = interconnect("dgx-h100", efficiency=setting)
        assert float(ring_timing(other, "all_reduce", 8)[1]) == other.intra_rate
    assert LinkEfficiency("ring").rate(get_link("nvlink4")) == 370e9
    # A100 (NVLink 3) has no NVLS.
    assert float(ring_timing(interconnect("dgx-a100"), "all_reduce", 8)[1]) == 230e9
