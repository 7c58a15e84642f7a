"""Traffic with a shard group, ZeRO++ and offload (zerolib.core.step.traffic, time, tables,
offload_traffic): expected values worked out by hand in the comments and the ZeRO++ blog's
table."""
from __future__ import annotations

import re

import numpy as np
import pytest

from zerolib.core.catalogue.nodes import interconnect, spanning_bandwidth, spanning_latency
from zerolib.core.estimate import estimate
from zerolib.core.memory.placement import Placement
from zerolib.core.step.offload_traffic import host_traffic
from zerolib.core.step.tables import group_traffic_table
from zerolib.core.step.time import step_time
from zerolib.core.step.traffic import GROUP_KINDS, GROUP_SLOTS, flat_traffic, traffic
from zerolib.crosscheck.conventions import zeropp

US = 1e-6


def by_name(result, what):
    return {name: int(value) for name, value in getattr(result, what).items()}


# --- a shard group, by hand -------------------------------------------------------------------

def test_stage_2_in_groups_of_8_by_hand():
    # 7e9 parameters on 64 GPUs in groups of 8 (8 replicas), 16-bit gradients and parameters.
    # A GPU's shard: 7e9 / 8 = 875,000,000 elements.
    result = traffic(7_000_000_000, 64, 2, shard_group=8, placement=Placement(gpus_per_node=8))
    handed, sent, cross = (by_name(result, w) for w in ("handed", "sent", "cross_node"))
    # Reduce-scatter in the group: hands 8 x 875e6 x 2 B, sends 7 chunks of 875e6 x 2 B.
    assert (handed["gradient_reduce_scatter"], sent["gradient_reduce_scatter"]) == (
        14_000_000_000, 12_250_000_000)
    # All-reduce of the 875e6-element shard across 8 replicas: 2 x 7 chunks of 109,375,000.
    assert (handed["replica_all_reduce"], sent["replica_all_reduce"]) == (
        1_750_000_000, 3_062_500_000)
    assert (handed["parameter_all_gather"], sent["parameter_all_gather"]) == (
        1_750_000_000, 12_250_000_000)
    # 27,562,500,000 B in all: what sharding over all 64 sends (2 x 63 x 109,375,000 x 2 B).
    assert int(result.total_sent) == 27_562_500_000 == 2 * 63 * 109_375_000 * 2
    # The groups are nodes: only the all-reduce leaves them, 8 rings per node at once.
    assert cross == {**dict.fromkeys(cross, 0), "replica_all_reduce": 8 * 3_062_500_000}


def test_stage_2_in_groups_of_8_times_by_hand():
    ic = interconnect("dgx-h100", efficiency="line-rate")
    times = step_time(traffic(7_000_000_000, 64, 2, shard_group=8), ic)
    # In the node: NVLink 4 at 450 GB/s, 8.4 + 7 x 3.4 = 32.2 us of latency.
    assert times.slot_seconds["gradient_reduce_scatter"] == pytest.approx(
        32.2 * US + 12.25e9 / 450e9, rel=1e-12)
    # Across 8 nodes: 8 NDR ports x 50 GB/s shared by the node's 8 rings = 50 GB/s each;
    # 2 x 7 steps, all of them across nodes: 8.4 + 14 x 14.0 = 204.4 us.
    assert times.slot_bandwidth["replica_all_reduce"] == 50e9
    assert times.slot_seconds["replica_all_reduce"] == pytest.approx(
        204.4 * US + 3.0625e9 / 50e9, rel=1e-12)


def test_replicas_inside_and_across_nodes_share_the_ports():
    ic = interconnect("dgx-h100", efficiency="line-rate")
    # Groups of 4 on 16 GPUs: 4 replicas, 2 per node; 4 rings leave each node at once:
    # min(450, 400 / 4) = 100 GB/s; 2 x 3 steps, 2 x (2 - 1) across: 8.4 + 4 x 3.4 + 2 x 14.
    result = traffic(1_000_000_000, 16, 3, shard_group=4)
    assert int(result.sharing["replica_all_reduce"]) == 4
    assert int(result.ring_nodes["replica_all_reduce"]) == 2
    assert float(spanning_bandwidth(ic, 2, 4)) == 100e9
    assert float(spanning_latency(ic, "all_reduce", 4, 2)) == pytest.approx(50.0 * US)
    # One ring per node is the full ring's rate (8 x 50 = 400 GB/s).
    assert float(spanning_bandwidth(ic, 2, 1)) == 400e9


def test_stage_3_per_layer_by_hand():
    # Layers of 5, 17, 1,000 and 3 elements on 4 GPUs in groups of 2 on nodes of 2.
    result = traffic([5, 17, 1000, 3], 4, 3, shard_group=2, placement=Placement(gpus_per_node=2))
    handed, sent, calls = (by_name(result, w) for w in ("handed", "sent", "calls"))
    # Chunks ceil(u / 2): 3 + 9 + 500 + 2 = 514 per pass; 2 bytes each.
    assert (handed["forward_all_gather"], sent["forward_all_gather"]) == (1_028, 1_028)
    assert (handed["gradient_reduce_scatter"], sent["gradient_reduce_scatter"]) == (2_056, 1_028)
    # Each layer's shard all-reduced over 2 replicas in chunks ceil(shard / 2):
    # 2 + 5 + 250 + 1 = 258; 2 x 1 x 258 x 2 B.
    assert (handed["replica_all_reduce"], sent["replica_all_reduce"]) == (1_028, 1_032)
    assert calls["forward_all_gather"] == calls["replica_all_reduce"] == 4
    # Replicas on 2 nodes, 2 rings per node: 2 x 1,032 B leave each node.
    assert int(result.total_cross_node) == 2_064


def test_one_gpu_groups_are_data_parallelism():
    # G = 1: no group collectives; the all-reduce over all 3 GPUs of the whole buffer:
    # 2 x 2 chunks of ceil(1000 / 3) = 334 elements.
    result = traffic(1000, 3, [1, 2], "fp32-adam", shard_group=1)
    assert result.by_kind("sent")["all_reduce"].tolist() == [2 * 2 * 334 * 4] * 2
    assert result.by_kind("sent")["reduce_scatter"].tolist() == [0, 0]
    assert result.by_kind("calls")["all_gather"].tolist() == [0, 0]


def test_sweep_equals_one_setting_at_a_time():
    groups = np.array([1, 2, 4, 8, 16, 32, 64])
    swept = traffic("llama-2-7b", 64, 3, shard_group=groups)
    for i, g in enumerate(groups):
        single = traffic("llama-2-7b", 64, 3, shard_group=int(g))
        for name in single.sent:
            assert int(swept.sent[name][i]) == int(single.sent[name])
            assert int(swept.cross_node[name][i]) == int(single.cross_node[name])


# --- ZeRO++ -----------------------------------------------------------------------------------

def test_qgz_and_qwz_by_hand():
    # 1,600 parameters (one flat buffer) on 16 GPUs in 2 nodes of 8.
    result = traffic(1600, 16, 3, placement=Placement(qgz=True, qwz=True, hpz_partition=8, gpus_per_node=8))
    handed, sent, cross = (by_name(result, w) for w in ("handed", "sent", "cross_node"))
    # qgZ in the node: the buffer in 8 chunks of 200, 4 bits each: hands 1,600 x 0.5 B,
    # sends 7 x 200 x 0.5 B.
    assert (handed["gradient_all_to_all_node"], sent["gradient_all_to_all_node"]) == (800, 700)
    # Across the 2 nodes: the 200 partial sums in 2 chunks of 100: hands 100 B, sends 50 B,
    # and all 8 GPUs of a node send theirs across: 400 B leave the node.
    assert (handed["gradient_all_to_all_nodes"], sent["gradient_all_to_all_nodes"]) == (100, 50)
    assert cross["gradient_all_to_all_nodes"] == 400 and cross["gradient_all_to_all_node"] == 0
    assert sent["gradient_reduce_scatter"] == 0       # replaced
    # qwZ: 8-bit weights; the forward gather over all 16: 15 chunks of 100 x 1 B, across nodes.
    assert sent["forward_all_gather"] == cross["forward_all_gather"] == 1_500
    # hpZ: the backward gather over the node's 8: 7 x 200 x 1 B, none of it across.
    assert (sent["backward_all_gather"], cross["backward_all_gather"]) == (1_400, 0)


def test_zeropp_blog_table_is_reproduced():
    table = zeropp.comparison()
    assert table["agrees"].all() and len(table) == 8
    chapter = dict(zip(table["item"], table["chapter"]))
    # 64 GPUs in 4 nodes of 16: every ring gather or reduce-scatter moves 63/64 M out of each
    # node: 3 x 63/64 = 2.953125 M; ZeRO++: 0.5 x 63/64 + 0 + 0.25 x 3/4 = 0.6796875 M.
    assert chapter["ZeRO: total"] == 2.953125 and chapter["ZeRO++: total"] == 0.6796875
    assert zeropp.comparison(1024, 8, 7 * 2**30)["agrees"].all()


@pytest.mark.parametrize("kwargs, message", [
    ({"stage": 2, "qwz": True}, "qwz (ZeRO++ quantised weights) needs ZeRO stage 3"),
    ({"stage": 3, "qgz": True, "shard_group": 8}, "needs the shard group to be every GPU"),
    ({"stage": 3, "hpz_partition": 5}, "hpz_partition (5) must divide gpus"),
    ({"stage": 3, "shard_group": 4, "gpus_per_node": 6}, "must divide one another"),
    ({"stage": 3, "shard_group": 12, "gpus_per_node": 8}, "shard_group (12) and the GPUs per node (8)"),
])
def test_bad_settings_name_the_rule(kwargs, message):
    stage = kwargs.pop("stage")
    with pytest.raises(ValueError, match=re.escape(message)):
        traffic(1_000_000, 48, stage, placement=Placement(**kwargs))


# --- offload ----------------------------------------------------------------------------------

def test_zero_offload_moves_2m_down_and_2m_up():
    # ZeRO-Offload (Ren et al., Fig. 2): one GPU, M = 1e9 parameters, stage 2: 2M bytes of fp16
    # gradients down and 2M of fp16 parameters up per step.
    host = host_traffic(1_000_000_000, 1, 2, placement=Placement(offload_optimizer="cpu"))
    assert host.by_direction() == {"to_gpu": 2_000_000_000, "to_host": 2_000_000_000,
                                   "nvme_read": 0, "nvme_write": 0}
    seconds = host.seconds("pcie4-x16")
    assert float(seconds["backward"]) == pytest.approx(2e9 / 31.5e9)
    assert float(seconds["after_step"]) == pytest.approx(2e9 / 31.5e9)
    # On 8 GPUs each moves its partition: 125e6 x 2 B each way.
    eight = host_traffic(1_000_000_000, 8, 2, placement=Placement(offload_optimizer="cpu"))
    assert int(eight.by_direction()["to_host"]) == 250_000_000


def test_infinity_on_nvme_by_hand():
    # 16e9 parameters on 8 GPUs, stage 3, optimizer and parameters on NVMe: a 2e9-element
    # shard; 1e9 elements of parameters stay in CPU memory (max_in_cpu), 1e9 on NVMe.
    placement = Placement(offload_optimizer="nvme", offload_params="nvme")
    host = host_traffic(16_000_000_000, 8, 3, placement=placement)
    b = {name: int(value) for name, value in host.bytes.items()}
    assert b["parameters_up_forward"] == b["parameters_up_backward"] == 4_000_000_000
    assert b["parameters_from_nvme_forward"] == 2_000_000_000
    assert b["gradients_down"] == 4_000_000_000               # 2e9 x 2 B
    assert b["gradients_to_nvme"] == 8_000_000_000            # the fp32 host gradients
    assert b["optimizer_from_nvme"] == 24_000_000_000 + 8_000_000_000
    assert b["optimizer_to_nvme"] == 24_000_000_000 and b["parameters_to_nvme"] == 2_000_000_000
    # The CPU updates the parameters it holds: nothing comes up or goes down after the step.
    assert b["parameters_up_after_step"] == b["parameters_down_after_step"] == 0
    # An explicit NVMe link times the drives at its rate: here PCIe 4.0 x16 (31.5 GB/s).
    seconds = host.seconds("pcie4-x16", nvme_link="pcie4-x16")
    assert float(seconds["backward"]) == pytest.approx(4e9 / 31.5e9 + 10e9 / 31.5e9)
    assert float(seconds["after_step"]) == pytest.approx(58e9 / 31.5e9)
    # By default at each GPU's share of the host's drives (DGX A100: 8 drives of 6.4 GB/s read
    # and 3.8 GB/s write for 8 GPUs): the 2e9 B of parameters read and the 8e9 B of gradients
    # written in the backward; 32e9 B read and 24e9 + 2e9 B written after the step.
    seconds = host.seconds("pcie4-x16")
    assert float(seconds["backward"]) == pytest.approx(4e9 / 31.5e9 + 2e9 / 6.4e9 + 8e9 / 3.8e9)
    assert float(seconds["after_step"]) == pytest.approx(32e9 / 6.4e9 + 26e9 / 3.8e9)


def test_offload_adds_its_exposed_copies_to_the_step():
    # The paper's overlap rule (the backward hides the gradient copy).
    result = estimate(7_000_000_000, 8, device="h100-80gb", stages=[2],
                      link="dgx-h100", link_efficiency="line-rate", offload_optimizer="cpu",
                      engine="paper")
    c = result.stages[0]["communication"]
    # Compute 6 x 7e9 x 4096 / (0.4 x 989.5e12): the backward 4/6 of it hides the gradient copy.
    compute = 6 * 7e9 * 4096 / (0.4 * 989.5e12)
    # After the step: the all-gather in the node (32.2 us + 12.25e9 / 450e9) and the 875e6
    # updated 16-bit parameters back up the PCIe 4.0 link (1.75e9 / 31.5e9) wait in full.
    after = 32.2 * US + 12.25e9 / 450e9 + 1.75e9 / 31.5e9
    # And the CPU's Adam step on the DGX H100's host: each GPU's 875e6-element partition
    # streams 30 B per element (12 B of state read and written, a 4 B gradient read, a 2 B
    # parameter written) at 1/8 of 2 x 8 x 4800e6 x 8 B/s = 614.4 GB/s.
    cpu = 875e6 * 30 / (614.4e9 / 8)
    assert c["cpu_step_seconds"] == pytest.approx(cpu, rel=1e-12)
    assert c["step_seconds"] == pytest.approx(compute + after + cpu, rel=1e-12)
    assert c["host"]["to_host_bytes"] == c["host"]["to_gpu_bytes"] == 1_750_000_000
    assert c["host_seconds"] == pytest.approx(2 * 1.75e9 / 31.5e9)


# --- the sweep table --------------------------------------------------------------------------

def test_group_traffic_table_keeps_groups_that_fit_nodes():
    table = group_traffic_table("llama-2-7b", 24, "dgx-h100", "h100-80gb", stages=[3])
    # Divisors of 24 that sit inside a node of 8 or span whole nodes: 3, 6 and 12 straddle.
    assert table["shard_group"].tolist() == [1, 2, 4, 8, 24]
    row = table[table["shard_group"] == 8].iloc[0]
    assert row["inside_node_bytes"] + row["across_nodes_bytes"] == row["sent_bytes"]
    with pytest.raises(ValueError, match="shard_groups"):
        group_traffic_table("llama-2-7b", 24, "dgx-h100", "h100-80gb", shard_groups=[3])


def test_the_sweep_path_equals_the_slot_sums():
    # Flat whole-byte sweeps take a few-operation path; it must agree with the slots.
    rng = np.random.default_rng(1)
    gpus = 8 * 2 ** rng.integers(0, 8, 2000)
    groups = np.minimum(2 ** rng.integers(0, 11, 2000), gpus)
    stages = rng.integers(0, 4, 2000)
    params = rng.integers(1, 10**13, 2000)
    for layout in ("mixed-adam", "fp32-adam"):
        result = traffic(int(params[0]), gpus, stages, layout, groups, Placement(gpus_per_node=8))
        swept = flat_traffic(params, gpus, stages, layout, groups, Placement(gpus_per_node=8))
        assert swept._plain_flat and result._plain_flat
        for one in (result, swept):
            fast = one.by_kind("sent")
            for kind in GROUP_KINDS:
                slots = sum(one.sent[s.name] for s in GROUP_SLOTS if s.kind == kind)
                assert np.array_equal(fast[kind], slots), kind
            assert np.array_equal(one.total_cross_node, sum(one.cross_node.values()))
