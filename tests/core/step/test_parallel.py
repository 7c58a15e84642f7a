"""Step time with tensor, pipeline and data parallelism (zerolib.core.step.parallel). Expected
values are worked out by hand in the comments: A100 peak 312e12 FLOP/s, NVLink 3 300 GB/s per
direction, one 200 Gb/s HDR port (25 GB/s) per GPU; NCCL's latencies 8.4 us per collective,
3.4 us per NVLink step, 14.0 us per network step; PCIe 4.0 x16 31.5 GB/s, 5.0 x16 63 GB/s per
direction; a 100 Gb/s RoCE port 12.5 GB/s."""
import math
from dataclasses import fields

import numpy as np
import pytest

from zerolib.core.catalogue.nodes import bus_bandwidth, interconnect, ring_latency
from zerolib.core.memory.model_parallel import Pipeline, parameters_per_gpu
from zerolib.core.step.collectives import ring_timing
from zerolib.core.step.model_parallel_traffic import pipeline_traffic, tensor_parallel_traffic
from zerolib.core.step.offload_traffic import HostSettings
from zerolib.core.step.parallel import (
    PARTS,
    ParallelSettings,
    ParallelStepTime,
    bubble_fraction,
    cluster_interconnect,
    offload_seconds,
    parallel_step_time,
    shard_group_traffic,
)
from zerolib.core.step.time import send_seconds
from zerolib.core.step.traffic import SLOTS, flat_traffic, layer_units

P7 = 6_738_415_616        # Llama-2-7B parameters
S = 2 * 4096 * 4096       # b s h bytes of one 16-bit activation tensor at s = 4096, b = 1
# The FLOPs (zerolib.core.step.time): 6 per parameter a matrix multiplies, so Llama-2-7B's less
# its 32,000 x 4,096 input embedding (a lookup), and 3 x its causal attention core, per token
# and layer s x 32 heads x (128 + 128) forward: 2^30 over 32 layers at s = 4096.
M7 = P7 - 32_000 * 4096   # 6,607,343,616


def core7(seq_len, layers=32, heads=32):
    return layers * seq_len * heads * 256


def fwd_bwd(multiplied, core, tokens, rate):
    """(forward, backward) seconds: 2 M + A and 4 M + 2 A per token at ``rate`` FLOP/s."""
    return (2 * multiplied + core) * tokens / rate, (4 * multiplied + 2 * core) * tokens / rate


def step(**kwargs):
    # The hand-worked values below are the ZeRO paper's schedule and overlap rule.
    base = dict(seq_len=4096, micro_batch=1, tensor_parallel=1, pipeline_parallel=1,
                data_parallel=1, stage=0, micro_batches=1, mfu=0.5, engine="paper")
    base.update(kwargs)
    link = base.pop("link", "dgx-a100")
    per_node = base.pop("gpus_per_node", 8)
    # The ring arithmetic of these tests is at the links' line rates.
    ic = cluster_interconnect(link, per_node, efficiency="line-rate")
    return parallel_step_time("llama-2-7b", ic, "a100-80gb", **base)


def bandwidth(ic, size, stride):
    return float(ring_timing(ic, "all_reduce", size, stride)[1])


def latency(ic, kind, size, stride):
    return float(ring_timing(ic, kind, size, stride)[0])


def close(a, b, rel=1e-9):
    assert math.isclose(float(a), float(b), rel_tol=rel), (float(a), float(b))


# --- where the groups sit -----------------------------------------------------------------------

def test_a_data_parallel_ring_of_whole_nodes_is_the_node_model():
    ic = interconnect("dgx-h100", efficiency="line-rate")
    for d in (2, 8, 16, 64, 1024):
        assert bandwidth(ic, d, 1) == float(bus_bandwidth(ic, d))
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            assert latency(ic, kind, d, 1) == float(ring_latency(ic, kind, d))


def test_strided_groups_share_the_node_ports():
    ic = interconnect("dgx-h100", efficiency="line-rate")      # 8 GPUs, 8 ports of 400 Gb/s = 50 GB/s each, NVLink 450
    def bw(size, stride):
        return bandwidth(ic, size, stride)
    assert bw(4, 2) == 450e9           # t 2 x d 4 = 8 GPUs: one node, NVLink
    assert bw(8, 2) == 200e9           # 2 nodes, 4 of the group per node: 4 ports of 8
    assert bw(8, 8) == 50e9            # t = 8: one GPU of the group per node, its own port
    assert bw(64, 1) == 400e9          # t = 1: min(450, 8 x 50)
    # A PCIe server with one 400 Gb/s port for 8 GPUs: with t = 8 each data-parallel group gets
    # an eighth of the port, 50 / 8 = 6.25 GB/s; with t = 1 the ring runs at PCIe's 31.5.
    pcie = interconnect("pcie-8x-l40s", efficiency="line-rate")
    assert bandwidth(pcie, 2, 8) == 6.25e9
    assert bandwidth(pcie, 16, 1) == 31.5e9


def test_strided_ring_latency_counts_the_nodes_it_spans():
    # d = 8 with t = 8 on DGX H100: 8 nodes, every one of the 2 x 7 all-reduce steps crosses the
    # network: 8.4 + 14 x 14.0 = 204.4 us. With t = 2 (4 per node, 2 nodes): 2 x 1 steps across,
    # 12 on NVLink: 8.4 + 2 x 14.0 + 12 x 3.4 = 77.2 us.
    ic = interconnect("dgx-h100", efficiency="line-rate")
    close(latency(ic, "all_reduce", 8, 8), 204.4e-6)
    close(latency(ic, "all_reduce", 8, 2), 77.2e-6)


def test_a_message_between_nodes():
    # 1e9 bytes from a DGX A100 GPU to the next stage on another node: its own 25 GB/s port,
    # 0.04 s, plus 8.4 + 14.0 us; inside the node on NVLink: 1e9 / 300e9 + 8.4 + 3.4 us.
    ic = interconnect("dgx-a100", efficiency="line-rate")
    close(send_seconds(ic, 10**9, True), 0.04 + 22.4e-6)
    close(send_seconds(ic, 10**9, False), 1 / 300 + 11.8e-6)


def test_links_are_a_node_two_links_or_one():
    pair = cluster_interconnect("nvlink4,ib-ndr", 4, efficiency="line-rate")
    assert (pair.intra.name, pair.network.name, pair.gpus_per_node, pair.nics) == ("nvlink4", "ib-ndr", 4, 4)
    assert cluster_interconnect("nvlink5", efficiency="line-rate").gpus_per_node is None     # one NVLink domain
    assert cluster_interconnect("dgx-2", 8, efficiency="line-rate").gpus_per_node == 8
    with pytest.raises(ValueError, match="network link"):
        cluster_interconnect("nvlink4,pcie5-x16", 8, efficiency="line-rate")
    with pytest.raises(ValueError, match="links must be"):
        cluster_interconnect("nvlink4,", 8, efficiency="line-rate")


# --- the step, by hand ----------------------------------------------------------------------------

def test_one_gpu_is_its_compute():
    # 4 micro-batches of 4,096 tokens: 4 x (6 x 6,607,343,616 + 3 x 2^30) x 4096 /
    # (0.5 x 312e12) = 4.50195 s.
    assert core7(4096) == 2**30
    result = step(micro_batches=4)
    close(result.step_seconds, 4 * (6 * M7 + 3 * 2**30) * 4096 / 156e12)
    close(result.step_seconds, 4.501954262567, 1e-12)
    assert float(result.network_wait_fraction) == 0 and float(result.bubble_fraction) == 0


def test_tensor_parallel_all_reduces_by_hand():
    # t = 2: one GPU holds 32 layers x (4 x 4096^2 / 2 + 3 x 4096 x 11008 / 2 + 2 x 4096) =
    # 32 x 101,195,776, plus half of the embedding and of the output layer (65,536,000 each)
    # and the final norm: 3,369,340,928 parameters, of which it multiplies all but its half of
    # the embedding, and 16 of the 32 heads (2^29 of core FLOPs per token): compute
    # (6 x 3,303,804,928 + 3 x 2^29) x 4096 / 156e12 = 0.562765 s.
    # Per micro-batch: 2 + 2 all-reduces of b s h = 33,554,432 bytes per layer (128), the
    # embedding's forward and the output layer's backward one (2 more), and 3 of 4 x 4096 bytes
    # for the loss. An all-reduce over 2 GPUs sends 2 x 1 x S/2 = S bytes at 300 GB/s after
    # 8.4 + 2 x 3.4 = 15.2 us: 130 x 127.048 us + 3 x 15.255 us = 16.562 ms.
    result = step(tensor_parallel=2)
    compute = (6 * (3_369_340_928 - 65_536_000) + 3 * 2**29) * 4096 / 156e12
    tensor = 130 * (15.2e-6 + S / 300e9) + 3 * (15.2e-6 + 16384 / 300e9)
    close(result.parts["compute"], compute)
    close(result.parts["tensor"], tensor)
    close(result.step_seconds, compute + tensor)
    close(result.step_seconds, 0.5793272721, 1e-9)


def test_tensor_parallel_rows_are_model_parallel_traffics():
    # The rows timed are those of model_parallel_traffic, whatever t, scaled by the micro-batch.
    for t in (2, 4, 8):
        rows = tensor_parallel_traffic("llama-2-7b", 4096, 1, t, Pipeline(1, micro_batches=1), 0)
        assert [(r.collective, r.calls, r.tensor_bytes) for r in rows] == [
            (r.collective, r.calls, r.tensor_bytes)
            for r in tensor_parallel_traffic("llama-2-7b", 4096, 1, 2, Pipeline(1, micro_batches=1), 0)]
    b3 = tensor_parallel_traffic("llama-2-7b", 4096, 3, 2, Pipeline(1, micro_batches=1), 0)
    assert [r.tensor_bytes for r in b3] == [3 * r.tensor_bytes for r in
                                            tensor_parallel_traffic("llama-2-7b", 4096, 1, 2)]


def test_the_pipeline_bubble_by_hand():
    # p = 2 inside one node, 1F1B, m = 4. The last stage holds 16 layers of 202,383,360, the
    # output layer (131,072,000) and the final norm: 3,369,209,856 parameters, all multiplied
    # (the first holds the embedding instead, which it looks up: it multiplies 131,076,096
    # fewer, so the last stage is the busier). Each micro-batch it sends one message of S bytes
    # on NVLink (8.4 + 3.4 us + S / 300e9 = 123.648 us): T_mb = (6 x 3,369,209,856 + 3 x 2^29)
    # x 4096 / 156e12 + 123.648 us = 0.573193 s (16 layers of core: 2^29 per token). Step =
    # (4 + 1) T_mb; the bubble is 1 T_mb, a fifth.
    result = step(pipeline_parallel=2, micro_batches=4)
    t_mb = (6 * 3_369_209_856 + 3 * 2**29) * 4096 / 156e12 + 11.8e-6 + S / 300e9
    close(result.micro_batch_seconds, t_mb)
    close(result.step_seconds, 5 * t_mb)
    close(result.bubble_fraction, 1 / 5)
    # Interleaved, 2 chunks per stage: 3 messages per micro-batch (2 chunk boundaries forward,
    # 1 backward on the first stage), bubble (p - 1)/v = half a micro-batch: step 4.5 T_mb.
    result = step(pipeline_parallel=2, micro_batches=4, chunks=2)
    t_mb = (6 * 3_369_209_856 + 3 * 2**29) * 4096 / 156e12 + 3 * (11.8e-6 + S / 300e9)
    close(result.step_seconds, 4.5 * t_mb)
    close(result.bubble_fraction, 0.5 / 4.5)
    close(bubble_fraction(2, 4, 2), 1 / 8)       # of the ideal time: (p - 1) / (v m)


def test_the_parts_are_named_fields_present_whatever_the_setting():
    # One field per part of PARTS, in its order, never a slice of a tuple whose length a new
    # part would change; a part the setting does not use (context, expert) is there, 0. The
    # bubble is (p - 1) / v of T_mb, the busier stage's micro-batch time.
    result = step(pipeline_parallel=2, micro_batches=4)
    assert [f.name for f in fields(ParallelStepTime)] == [*PARTS, "micro_batch_seconds"]
    assert all(result.parts[name] is getattr(result, name) for name in PARTS)
    assert list(result.parts) == list(PARTS)
    assert float(result.context) == float(result.expert) == 0.0
    close(result.bubble, result.micro_batch_seconds)


def test_pipeline_messages_are_model_parallel_traffics():
    rows = pipeline_traffic("llama-2-7b", 4096, 1, 1, Pipeline(2, "interleaved", 2, micro_batches=2), 0)
    assert sum(r.calls for r in rows if r.collective == "send") == 2 * 3


def test_stage_0_gradient_all_reduce_exposed_by_hand():
    # d = 8 with one GPU per node (gpus_per_node 1): each GPU's 25 GB/s port. ceil(P / 8) =
    # 842,301,952; the all-reduce sends 2 x 7 x that x 2 bytes = 23,584,454,656 B: 0.943378 s
    # + 8.4 + 14 x 14.0 us = 0.943583 s, against one micro-batch's backward, (4 M + 2 x 2^30)
    # x 4096 / (0.4 x 312e12) = 0.937908 s: 0.005675 s exposed.
    result = step(data_parallel=8, gpus_per_node=1, mfu=0.4)
    forward, backward = fwd_bwd(M7, 2**30, 4096, 124.8e12)
    close(backward, 0.9379071380, 1e-9)
    close(result.parts["data_parallel"], 0.94358258624 - backward, 1e-8)
    close(result.step_seconds, forward + 0.94358258624, 1e-9)


def test_stage_1_waits_for_the_gather_after_the_step():
    # The reduce-scatter (0.471795 s) hides behind the backward; the all-gather of the updated
    # parameters, 7 x 842,301,952 x 2 B / 25e9 + 8.4 + 7 x 14.0 us = 0.471795 s, does not.
    result = step(data_parallel=8, gpus_per_node=1, mfu=0.4, stage=1)
    close(result.parts["data_parallel"], 7 * 842_301_952 * 2 / 25e9 + 106.4e-6)


def test_stage_3_gathers_every_micro_batch():
    # Stage 3 gathers and reduces per micro-batch (DeepSpeed communicates gradients on every
    # micro-step from stage 2 on): m micro-batches expose m times what one exposes.
    one = step(data_parallel=8, gpus_per_node=1, mfu=0.9, stage=3)
    four = step(data_parallel=8, gpus_per_node=1, mfu=0.9, stage=3, micro_batches=4)
    assert float(one.parts["data_parallel"]) > 0
    close(four.parts["data_parallel"], 4 * float(one.parts["data_parallel"]))


def test_parts_add_up_and_broadcast():
    result = step(tensor_parallel=np.array([1, 2, 4]), pipeline_parallel=np.array([[1], [2]]),
                  micro_batches=4, sequence_parallel=True)
    assert result.step_seconds.shape == (2, 3)
    total = sum(result.parts.values())
    assert np.allclose(total, result.step_seconds)
    shares = result.network_wait_fraction + result.bubble_fraction + result.parts["compute"] / total
    assert np.allclose(shares, 1)


def test_what_is_not_modelled_is_refused():
    with pytest.raises(ValueError, match="ZeRO stages 2 and 3 do not run with pipeline"):
        step(pipeline_parallel=2, stage=2, micro_batches=2)
    with pytest.raises(ValueError, match="tensor_parallel must divide gpus_per_node"):
        step(tensor_parallel=16)
    with pytest.raises(ValueError, match="recompute must be one of"):
        step(recompute="some")
    with pytest.raises(TypeError, match="sequence_parallel"):
        step(sequence_parallel=1)
    with pytest.raises(ValueError, match="offload must be one of none, optimizer, optimizer"):
        step(data_parallel=8, stage=1, offload=True)
    with pytest.raises(ValueError, match="offload_params='cpu' needs ZeRO stage 3"):
        step(data_parallel=8, stage=2, offload="optimizer+parameters")
    with pytest.raises(ValueError, match="offload_optimizer='cpu' needs ZeRO stage 1, 2 or 3"):
        step(data_parallel=8, stage=0, offload="optimizer")
    with pytest.raises(ValueError, match="host_link must be a PCIe link .pcie4-x16, pcie5-x16.,"):
        step(data_parallel=8, stage=1, offload="optimizer", host_link="nvlink4")
    with pytest.raises(ValueError, match="shard_group must divide gpus"):
        step(data_parallel=8, stage=1, shard_group=3)


def test_settings_are_checked_once_and_trusted_after():
    # Built once, the settings time the layout on any cluster; the keywords give the same step.
    settings = ParallelSettings(seq_len=4096, micro_batch=1, tensor_parallel=[1, 2], pipeline_parallel=1,
                                data_parallel=8, stage=[0, 3], micro_batches=2, mfu=0.5)
    assert settings.tensor_parallel.tolist() == [1, 2] and settings.recompute.tolist() == [0, 0]
    for link in ("dgx-a100", "dgx-h100"):
        ic = cluster_interconnect(link, 8, efficiency="line-rate")
        by_settings = parallel_step_time("llama-2-7b", ic, "a100-80gb", settings)
        by_keywords = parallel_step_time("llama-2-7b", ic, "a100-80gb", seq_len=4096, micro_batch=1,
                                         tensor_parallel=[1, 2], pipeline_parallel=1, data_parallel=8,
                                         stage=[0, 3], micro_batches=2, mfu=0.5)
        assert np.array_equal(by_settings.step_seconds, by_keywords.step_seconds)
    # The checks happen when the settings are built, with the keywords' messages.
    with pytest.raises(ValueError, match="ZeRO stages 2 and 3 do not run with pipeline"):
        ParallelSettings(seq_len=4096, micro_batch=1, tensor_parallel=1, pipeline_parallel=2,
                         data_parallel=1, stage=2, micro_batches=2)
    with pytest.raises(ValueError, match="recompute must be one of"):
        ParallelSettings(seq_len=4096, micro_batch=1, tensor_parallel=1, pipeline_parallel=1,
                         data_parallel=1, stage=0, micro_batches=1, recompute="some")
    with pytest.raises(TypeError, match="not both"):
        parallel_step_time("llama-2-7b", "dgx-a100", "a100-80gb", settings, gpus_per_node=8, mfu=0.4)
    with pytest.raises(TypeError, match="settings must be a ParallelSettings"):
        parallel_step_time("llama-2-7b", "dgx-a100", "a100-80gb", {"seq_len": 4096})


# --- shard groups: in the group on its ring, the replicas' all-reduce once per step --------------

def test_shard_group_traffic_is_group_traffics():
    # Llama-2-7B's 6,738,415,616 parameters over d = 64 in groups of 8, stage 3: inside the group
    # each pass sends 7 chunks of P / 8 = 842,301,952 elements, 2 bytes each; across the 8
    # replicas each GPU all-reduces its shard: 2 x 7 chunks of 842,301,952 / 8 = 105,287,744.
    traffic = shard_group_traffic(P7, 64, 3, shard_group=8)
    assert int(traffic.sent["forward_all_gather"]) == 7 * 842_301_952 * 2
    assert int(traffic.sent["gradient_reduce_scatter"]) == 7 * 842_301_952 * 2
    assert int(traffic.sent["replica_all_reduce"]) == 2 * 7 * 105_287_744 * 2
    assert int(traffic.sent["gradient_all_reduce"]) == 0
    # G = d: no replicas to all-reduce across.
    assert not shard_group_traffic(P7, 64, [0, 1, 2, 3]).sent["replica_all_reduce"].any()
    with pytest.raises(ValueError, match="shard_group must divide"):
        shard_group_traffic(P7, 64, 3, shard_group=6)
    with pytest.raises(ValueError, match="must divide one cluster"):
        shard_group_traffic(P7, [2**24, 3], 1)


def group_step(**kwargs):
    # Llama-2-7B at 512 tokens on d = 8 in nodes of 4 GPUs: NVLink 3 inside (300 GB/s), one
    # 100 Gb/s port per GPU (12.5 GB/s). Per micro-batch (2 M + 2^27) x 512 / (0.4 x 312e12)
    # = 0.0547647 s forward, 0.1095295 s backward (fwd_bwd; a causal core of 2^27 at 512).
    base = dict(seq_len=512, data_parallel=8, stage=2, micro_batches=2, mfu=0.4)
    base.update(kwargs)
    return step(link="nvlink3,roce-100g", gpus_per_node=4, **base)


def test_a_group_inside_a_node_and_its_replicas_across_by_hand():
    # G = 4: each group is one node. Its reduce-scatter sends 3 x 1,684,603,904 x 2 =
    # 10,107,623,424 B on NVLink: 0.0336921 s + 8.4 + 3 x 3.4 us = 0.0337107 s, hidden behind
    # each micro-batch's backward. The replicas' all-reduce (2 GPUs 4 apart, one per node, each on
    # its own port): 2 x 1 x 842,301,952 x 2 = 3,369,207,808 B / 12.5e9 = 0.2695366 s + 8.4 +
    # 2 x 14.0 us = 0.2695730 s, once, after the last micro-batch's reduce-scatter: 0.0337107 +
    # 0.2695730 - 0.1095295 = 0.1937542 s exposed; the all-gather after the step (as the
    # reduce-scatter) 0.0337107 s. Data parallelism: 0.2274649 s.
    _, backward = fwd_bwd(M7, core7(512), 512, 124.8e12)
    close(backward, 0.1095295, 1e-6)
    grouped = group_step(shard_group=4)
    close(grouped.parts["data_parallel"], 0.0337107 + 0.2695730 - backward + 0.0337107, 1e-6)
    close(grouped.parts["data_parallel"], 0.22746490421, 1e-9)
    # Once per step: four micro-batches expose exactly as much as two.
    assert float(group_step(shard_group=4, micro_batches=4).parts["data_parallel"]) == \
        float(grouped.parts["data_parallel"])
    # Stage 1 reduce-scatters once, at the last micro-batch, and the replicas' all-reduce joins
    # it there: the same 0.2274649 s.
    close(group_step(shard_group=4, stage=1).parts["data_parallel"], 0.22746490421, 1e-9)
    # The whole group over both nodes: a ring of 8 leaving each node through 4 ports (50 GB/s):
    # 7 x 842,301,952 x 2 = 11,792,227,328 B / 50e9 + 8.4 + 6 x 3.4 + 14.0 us = 0.2358873 s per
    # reduce-scatter, 0.1263578 s exposed per micro-batch, and the all-gather after the step:
    # 2 x 0.1263578 + 0.2358873 = 0.4886029 s, more than twice the grouped one.
    close(group_step().parts["data_parallel"], 2 * (0.2358873 - backward) + 0.2358873, 1e-6)


def test_a_strided_replica_ring_shares_the_ports():
    # t = 2, d = 8, G = 2 on DGX H100 nodes (8 GPUs, 8 ports of 50 GB/s, NVLink 4 450 GB/s): the
    # group (2 GPUs 2 apart) sits in a node; the replicas (4 GPUs 4 apart) span 2 nodes with 2 on
    # each, so the node's 4 such rings share its ports: 8 x 50 x 2 / 8 = 100 GB/s.
    assert bandwidth(interconnect("dgx-h100", efficiency="line-rate"), 4, 4) == 100e9
    # The group itself, inside the node, runs on NVLink.
    assert bandwidth(interconnect("dgx-h100", efficiency="line-rate"), 2, 2) == 450e9


def _whole_group_reference(ic, params, d, t, zero, m, backward, forward):
    """The data-parallel seconds with every collective over all d GPUs t apart, as before shard
    groups had their own traffic: communication.flat_traffic's bytes on one ring."""
    traffic = flat_traffic(params, d, zero)
    units = len(layer_units("llama-2-7b"))
    slots = {}
    for slot in SLOTS:
        sent, calls = traffic.sent[slot.name], traffic.calls[slot.name]
        calls = np.where((zero == 3) & (calls > 0), units, calls)
        lat, bw = ring_timing(ic, slot.kind, d, t)
        slots[slot.name] = np.where(sent > 0, calls * lat + sent / bw, 0.0)
    in_backward = slots["backward_all_gather"] + np.where(zero >= 2, slots["gradient_reduce_scatter"], 0.0)
    per_mb = np.maximum(slots["forward_all_gather"] - forward, 0.0) + np.maximum(in_backward - backward, 0.0)
    once = np.where(zero <= 1, slots["gradient_all_reduce"]
                    + np.where(zero == 1, slots["gradient_reduce_scatter"], 0.0), 0.0)
    return m * per_mb + np.maximum(once - backward, 0.0) + slots["parameter_all_gather"]


def test_a_group_of_every_data_parallel_gpu_times_exactly_as_the_whole_group():
    ic = cluster_interconnect("dgx-h100", 8, efficiency="line-rate")
    d, t, zero = np.meshgrid([1, 2, 4, 8, 16, 64], [1, 2, 8], [0, 1, 2, 3], indexing="ij")
    d, t, zero = d.ravel(), t.ravel(), zero.ravel()
    for m, seq in ((1, 4096), (3, 256)):
        result = parallel_step_time("llama-2-7b", ic, "a100-80gb", seq_len=seq, micro_batch=1,
                                    tensor_parallel=t, pipeline_parallel=1, data_parallel=d,
                                    stage=zero, micro_batches=m, shard_group=d, mfu=0.5,
                                    engine="paper")
        params = parameters_per_gpu("llama-2-7b", t, 1)
        # The compute these d GPUs hide the collectives behind, by the FLOP rule: each GPU
        # multiplies its parameters less its 1/t of the embedding (a lookup) and runs the causal
        # core of its 32 / t heads, at 0.5 x 312e12 FLOP/s.
        multiplied = (params - 32_000 * 4096 // t).astype(np.float64)
        core = (32 * seq * (32 // t) * 256).astype(np.float64)
        forward = (2 * multiplied + core) * seq / (312 * 10**12 * 0.5)
        backward = (4 * multiplied + 2 * core) * seq / (312 * 10**12 * 0.5)
        want = _whole_group_reference(ic, params, d, t, zero, m, backward, forward)
        assert np.array_equal(result.parts["data_parallel"], want)       # exactly, not close


# --- offload: host copies on PCIe -----------------------------------------------------------------

def test_offload_seconds_by_hand():
    # Llama-2-7B on 8 GPUs, stage 3: the GPU's shard is 842,301,952 elements, 1,684,603,904 bytes
    # in 16 bits: 0.0534795 s on PCIe 4.0 x16. The optimizer alone: gradients down during the
    # backward, the updated parameters up after the step. With the parameters: up before the
    # forward, up before the backward while the gradients go down (full duplex: one transfer's
    # time), nothing after the step (the CPU updates them in place).
    # After the step, the CPU's Adam step on the default host (DGX A100, 409.6 GB/s shared by
    # 8 GPUs): 842,301,952 elements x 30 B = 25,269,058,560 B at 51.2 GB/s, 0.4935363 s.
    one = 1_684_603_904 / 31.5e9
    cpu = 25_269_058_560 / 51.2e9
    optimizer = offload_seconds(P7, 8, 3, "optimizer")
    assert [float(optimizer[p]) for p in ("forward", "backward")] == [0.0, one]
    assert float(optimizer["after_step"]) == pytest.approx(one + cpu, rel=1e-15)
    both = offload_seconds(P7, 8, 3, "optimizer+parameters", host=HostSettings(host_link="pcie5-x16"))
    assert [float(both[p]) for p in ("forward", "backward")] == [
        1_684_603_904 / 63e9, 1_684_603_904 / 63e9]
    assert float(both["after_step"]) == pytest.approx(cpu, rel=1e-15)
    # A group of 4: the shard doubles.
    assert float(offload_seconds(P7, 8, 2, "optimizer", shard_group=4)["backward"]) == 2 * one
    assert float(offload_seconds(P7, 8, 2, "none")["backward"]) == 0.0


def test_optimizer_offload_copies_each_micro_batch_under_stage_2_by_hand():
    # Llama-2-7B at 256 tokens, d = 8 on one NVLink 3 domain (no nodes), stage 2, 2 micro-batches.
    # Per micro-batch (fwd_bwd, a causal core of 2^26 at 256) 0.0272447 s forward, 0.0544894 s
    # backward. Its reduce-scatter: 11,792,227,328 B / 300e9 + 8.4 + 7 x 3.4 us = 0.0393396 s;
    # then the gradient partition down, 0.0534795 s: 0.0383297 s exposed per micro-batch. After
    # the step the updated parameters come up (0.0534795 s) and are all-gathered (0.0393396 s):
    # 0.0928191 s. 2 x 0.0383297 + 0.0928191 = 0.1694785 s; and once, between the last backward
    # and the copy up, the CPU's Adam step: 842,301,952 x 30 B at 409.6e9 / 8 B/s (the default
    # host, DGX A100), 0.4935363 s: 0.6630148 s.
    forward, backward = fwd_bwd(M7, core7(256), 256, 124.8e12)
    close(backward, 0.0544894, 1e-6)
    scatter = 11_792_227_328 / 300e9 + 8.4e-6 + 7 * 3.4e-6
    copy = 1_684_603_904 / 31.5e9
    result = step(link="nvlink3", seq_len=256, data_parallel=8, stage=2, micro_batches=2, mfu=0.4,
                  offload="optimizer")
    close(result.parts["data_parallel"],
          2 * (scatter + copy - backward) + copy + scatter + 25_269_058_560 / 51.2e9, 1e-9)
    assert not np.isnan(float(result.step_seconds))


def test_parameter_offload_fetches_before_each_pass_by_hand():
    # The same under stage 3 with the parameters on the host too: 35 layer units (embedding, 32
    # blocks, final norm, output layer) gathered one call each, 35 x 32.2 us + 0.0393074 s =
    # 0.0404344 s per pass. Forward: gather + fetch (0.0534795 s) - 0.0272447 s = 0.0666692 s;
    # backward: gather + reduce-scatter + one transfer's time (fetch up, gradients down) -
    # 0.0544894 s = 0.0798589 s; after the step only the CPU's Adam step (0.4935363 s, as
    # above). 2 x 0.1465281 + 0.4935363 = 0.7865925 s.
    forward, backward = fwd_bwd(M7, core7(256), 256, 124.8e12)
    gather = 35 * 32.2e-6 + 11_792_227_328 / 300e9
    fetch = 1_684_603_904 / 31.5e9
    cpu = 25_269_058_560 / 51.2e9
    result = step(link="nvlink3", seq_len=256, data_parallel=8, stage=3, micro_batches=2, mfu=0.4,
                  offload="optimizer+parameters")
    close(result.parts["data_parallel"],
          2 * (gather + fetch - forward + 2 * gather + fetch - backward) + cpu, 1e-9)
    # PCIe 5.0 halves the fetches: forward 0.0404344 + 0.0267397 - 0.0272447, backward
    # 2 x 0.0404344 + 0.0267397 - 0.0544894.
    faster = step(link="nvlink3", seq_len=256, data_parallel=8, stage=3, micro_batches=2, mfu=0.4,
                  offload="optimizer+parameters", host_link="pcie5-x16")
    close(faster.parts["data_parallel"],
          2 * (gather + fetch / 2 - forward + 2 * gather + fetch / 2 - backward) + cpu, 1e-9)
