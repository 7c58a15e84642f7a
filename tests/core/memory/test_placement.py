"""Where the model state lives (zerolib.core.memory.placement): hpZ, offload tiers per GPU and per
node, what DeepSpeed offers, the will-it-fit layer's host judgement, and agreement with the
DeepSpeed estimator mirror where the two conventions coincide. Expected values by hand."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zerolib.core.estimate import estimate
from zerolib.core.memory.placement import (
    ITEMS,
    TIERS,
    Placement,
    place,
)
from zerolib.core.memory.working_set import WorkingSetSettings, peak, peaks, stage_rows
from zerolib.crosscheck.deepspeed_estimator import estimate_zero2, estimate_zero3

GB = 10**9
P7B = 7 * 10**9
M = 10**6  # the ZeRO-Offload paper's model size "M" in its Table 1, here 10**6 parameters


def tiers(params, gpus, stage, layout="mixed-adam", **placement):
    return place(params, gpus, stage, layout, Placement(**placement)).as_dict()


# --- the default placement is today's arithmetic ------------------------------------------------

def test_default_placement_is_everything_on_the_gpu():
    got = tiers(P7B, 64, 3)
    # 7B / 64 = 109,375,000 elements: 2 + 2 + 12 bytes each.
    assert got["gpu"] == {"parameters": 218_750_000, "hpz_secondary": 0, "gradients": 218_750_000,
                          "optimizer": 1_312_500_000, "total": 1_750_000_000,
                          "per_node": 8 * 1_750_000_000}
    assert got["cpu"]["total"] == got["nvme"]["total"] == 0


# --- ZeRO++ hpZ -------------------------------------------------------------------------------

def test_hpz_adds_a_16_bit_copy_sharded_within_the_node():
    got = tiers(P7B, 64, 3, hpz_partition=8)
    # Secondary copy: 7B / 8 = 875,000,000 elements x 2 bytes, on every GPU.
    assert got["gpu"]["hpz_secondary"] == 1_750_000_000
    assert got["gpu"]["total"] == 1_750_000_000 + 1_750_000_000
    # Over every GPU it costs what the primary shard costs: 2 / 64 bytes per parameter per GPU.
    assert tiers(P7B, 64, 3, hpz_partition=64)["gpu"]["hpz_secondary"] == 218_750_000


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_hpz_needs_stage_3(stage):
    with pytest.raises(ValueError, match="hpZ.*stage 3"):
        place(P7B, 64, stage, placement=Placement(hpz_partition=8))


def test_hpz_refuses_groups_it_cannot_form():
    with pytest.raises(ValueError, match="hpz_partition \\(3\\) must divide gpus"):
        place(P7B, 64, 3, placement=Placement(hpz_partition=3))
    with pytest.raises(ValueError, match="shard group to be every GPU"):
        place(P7B, 64, 3, placement=Placement(hpz_partition=8, shard_group=8))
    with pytest.raises(ValueError, match="offload_params"):
        Placement(hpz_partition=8, offload_params="cpu")


# --- offload: the ZeRO-Offload paper's Table 1, one GPU -------------------------------------

def test_zero_offload_paper_table_1_with_fp16_gradients_on_the_cpu():
    # Table 1 of Ren et al. (ATC 2021), M parameters on one GPU, baseline 16M bytes:
    # "update on cpu" (g16 stays): 4M, the 4x row; "g16 and update on cpu": 2M, the 8x row
    # (printed 4M; 16M / 8 = 2M). The paper keeps fp16 gradients on the CPU: 2 + 12 = 14M there.
    baseline = tiers(M, 1, 1)
    assert baseline["gpu"]["total"] == 16 * M
    update_on_cpu = tiers(M, 1, 1, offload_optimizer="cpu", host_gradient_bytes=2, gpus_per_node=1)
    assert update_on_cpu["gpu"]["total"] == 4 * M
    both_on_cpu = tiers(M, 1, 2, offload_optimizer="cpu", host_gradient_bytes=2, gpus_per_node=1)
    assert both_on_cpu["gpu"]["total"] == 2 * M and both_on_cpu["cpu"]["total"] == 14 * M


# --- offload: DeepSpeed's convention (fp32 gradients on the host) ------------------------------

def test_optimizer_offload_per_stage_by_hand():
    # 7B on 64 GPUs, 8 per node; a partition is 109,375,000 elements.
    stage1 = tiers(P7B, 64, 1, offload_optimizer="cpu")
    # Stage 1 keeps its whole 16-bit parameters and gradients on the GPU: 2 x 7e9 + 2 x 7e9.
    assert stage1["gpu"]["total"] == 28 * GB
    # The host: fp32 gradient partition (4 B) + optimizer partition (12 B) = 16 x 109,375,000.
    assert stage1["cpu"] == {"parameters": 0, "hpz_secondary": 0, "gradients": 437_500_000,
                             "optimizer": 1_312_500_000, "total": 1_750_000_000,
                             "per_node": 14 * GB}
    assert tiers(P7B, 64, 2, offload_optimizer="cpu")["gpu"]["total"] == 14 * GB
    stage3 = tiers(P7B, 64, 3, offload_optimizer="cpu")
    assert stage3["gpu"]["total"] == 218_750_000 and stage3["cpu"]["per_node"] == 14 * GB


def test_everything_offloaded_under_stage_3():
    got = tiers(P7B, 64, 3, offload_optimizer="cpu", offload_params="cpu")
    assert got["gpu"]["total"] == 0
    # 2 + 4 + 12 = 18 bytes per element of the partition, 8 GPUs per node.
    assert got["cpu"]["total"] == 18 * 109_375_000 and got["cpu"]["per_node"] == 8 * 18 * 109_375_000


def test_nvme_keeps_max_in_cpu_parameters_in_cpu_memory():
    # 1T parameters on 512 GPUs (16 per node, as on a DGX-2): a partition of 1,953,125,000.
    got = tiers(10**12, 512, 3, offload_optimizer="nvme", offload_params="nvme", gpus_per_node=16)
    # offload_param.max_in_cpu = 1e9 elements stay in pinned CPU memory, the rest on NVMe.
    assert got["cpu"]["parameters"] == 2 * 10**9
    assert got["nvme"]["parameters"] == 2 * 953_125_000
    assert got["nvme"]["gradients"] == 4 * 1_953_125_000
    assert got["nvme"]["optimizer"] == 12 * 1_953_125_000
    assert got["nvme"]["per_node"] == 16 * (2 * 953_125_000 + 16 * 1_953_125_000)
    # A small partition stays whole in CPU memory.
    small = tiers(P7B, 64, 3, offload_params="nvme")
    assert small["cpu"]["parameters"] == 218_750_000 and small["nvme"]["parameters"] == 0


def test_shard_group_and_offload_combine():
    # HSDP-style group of 8 inside 64: the partition is 7B / 8 = 875,000,000 elements.
    got = tiers(P7B, 64, 3, shard_group=8, offload_optimizer="cpu")
    assert got["gpu"]["total"] == 1_750_000_000 and got["cpu"]["total"] == 16 * 875_000_000


@pytest.mark.parametrize("stage, placement, says", [
    (0, {"offload_optimizer": "cpu"}, "ZeRO stage 1, 2 or 3"),
    (1, {"offload_optimizer": "nvme"}, "stage 3 \\(DeepSpeed's stages 1-2 have no NVMe path\\)"),
    (2, {"offload_optimizer": "nvme"}, "no NVMe path"),
    (2, {"offload_params": "cpu"}, "offload_params='cpu' needs ZeRO stage 3"),
    (1, {"offload_params": "nvme"}, "only stage 3 partitions parameters"),
])
def test_what_deepspeed_does_not_offer_is_refused(stage, placement, says):
    with pytest.raises(ValueError, match=says):
        place(P7B, 64, stage, placement=Placement(**placement))


@pytest.mark.parametrize("fields, error, says", [
    ({"offload_optimizer": "disk"}, ValueError, "offload_optimizer must be one of none, cpu, nvme"),
    ({"offload_params": None}, ValueError, "offload_params"),
    ({"shard_group": 0}, ValueError, "shard_group"),
    ({"shard_group": 2.0}, TypeError, "shard_group"),
    ({"gpus_per_node": True}, TypeError, "gpus_per_node"),
    ({"hpz_partition": 0}, ValueError, "hpz_partition"),
    ({"max_in_cpu": -1}, ValueError, "max_in_cpu"),
    ({"host_gradient_bytes": 3.3}, ValueError, "host_gradient_bytes"),
])
def test_bad_placements_are_named(fields, error, says):
    with pytest.raises(error, match=says):
        Placement(**fields)


def test_nodes_are_whole():
    assert tiers(P7B, 4, 3, offload_optimizer="cpu")["cpu"]["per_node"] == 4 * 16 * P7B // 4
    with pytest.raises(ValueError, match="gpus \\(12\\) must fill whole nodes"):
        place(P7B, 12, 3, placement=Placement(offload_optimizer="cpu"))
    assert place(P7B, 12, 3, placement=Placement(gpus_per_node=4)).gpus_on_node == 4
    with pytest.raises(ValueError, match="tier must be one of"):
        place(P7B, 8, 3).total("disk")


def test_items_and_tiers_are_all_present():
    got = place(P7B, 64, [1, 2, 3], placement=Placement(offload_optimizer="cpu")).as_dict(2)
    assert set(got) == set(TIERS) and all(set(got[t]) == {*ITEMS, "total", "per_node"} for t in TIERS)


# --- agreement with the DeepSpeed estimator mirror where the conventions coincide -------------
# The mirror counts, per node, the host bytes with additional_buffer_factor (1.0 here) and
# DeepSpeed's own GPU term; zerolib counts the same state per GPU. They coincide when the
# parameters divide evenly, the model is built under zero.Init (stage 3) or small enough that the
# fp32 copy each process builds does not dominate (stage 2: 4 B x GPUs per node <= 16 B), on one
# node for stage 2 (its formula does not divide the host bytes by the node count), and once the
# gathered layer (4 B x largest layer, zerolib's working set) is taken out of DeepSpeed's GPU term.

@given(per_gpu=st.integers(1, 10**9), gpus=st.sampled_from([1, 2, 4]))
def test_zero2_cpu_offload_matches_the_mirror(per_gpu, gpus):
    params = per_gpu * gpus
    mirror = estimate_zero2(params, gpus, 1, cpu_offload=True, additional_buffer_factor=1.0)
    got = place(params, gpus, 2, placement=Placement(offload_optimizer="cpu", gpus_per_node=gpus))
    assert int(got.gpu) == mirror.per_gpu               # 2 B fp16 parameters
    assert int(got.per_node("cpu")) == mirror.per_cpu   # 16 B: fp32 params, grads, Adam m, v


@given(per_gpu=st.integers(1, 10**9), per_node=st.sampled_from([1, 2, 4, 8, 16]),
       nodes=st.sampled_from([1, 2, 4, 8, 64]), offload_params=st.booleans())
def test_zero3_offload_matches_the_mirror(per_gpu, per_node, nodes, offload_params):
    gpus = per_node * nodes
    params = per_gpu * gpus
    largest = min(params, 12_345)
    mirror = estimate_zero3(params, largest, per_node, nodes, cpu_offload=True,
                            cpu_offload_params=offload_params, zero_init=True,
                            additional_buffer_factor=1.0)
    got = place(params, gpus, 3, placement=Placement(
        offload_optimizer="cpu", offload_params="cpu" if offload_params else "none",
        gpus_per_node=per_node))
    assert int(got.gpu) == mirror.per_gpu - mirror.largest_layer
    assert int(got.per_node("cpu")) == mirror.per_cpu   # 16 B, or 18 B with the parameters


def test_where_the_mirror_differs_it_is_by_its_named_terms():
    # 2,851M parameters on 8 GPUs, one node (DeepSpeed's memory.rst example), factor 1.5:
    # the buffer factor makes the mirror's host 1.5 x zerolib's; ZeRO-2 on 8 GPUs counts the fp32
    # model every process builds, 4 B x 8 GPUs = 32 B per parameter, instead of 16.
    params = 2_851_000_000
    zero2 = estimate_zero2(params, 8, 1, cpu_offload=True)
    ours = place(params, 8, 2, placement=Placement(offload_optimizer="cpu"))
    assert int(ours.per_node("cpu")) == 16 * params
    assert zero2.per_cpu == int(params * 32 * 1.5)
    zero3 = estimate_zero3(params, 32_000_000, 8, 1, cpu_offload=True, cpu_offload_params=True)
    both = place(params, 8, 3, placement=Placement(offload_optimizer="cpu", offload_params="cpu"))
    assert zero3.per_cpu == int(params * 18 * 1.0 * 1.5) == int(int(both.per_node("cpu")) * 1.5)


# --- the will-it-fit layer: the GPU against the device, the host against its memory -----------

LLAMA_P = 6_738_415_616   # llama-2-7b, a multiple of 8
SETTINGS = WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective")


def test_peak_persistent_is_the_gpu_tier():
    plain = peak("llama-2-7b", 8, 3, SETTINGS)
    default = peak("llama-2-7b", 8, 3, SETTINGS, placement=Placement())
    assert dict(default.persistent) == dict(plain.persistent) and default.total == plain.total
    offloaded = peak("llama-2-7b", 8, 3, SETTINGS, placement=Placement(offload_optimizer="cpu"))
    # On the GPU only the 16-bit parameter shard stays: 2 x P / 8.
    assert dict(offloaded.persistent) == {"parameters": 2 * LLAMA_P // 8, "gradients": 0,
                                          "optimizer": 0, "total": 2 * LLAMA_P // 8}
    assert dict(offloaded.working_set) == dict(plain.working_set)   # the working set stays
    assert offloaded.total == plain.total - 14 * LLAMA_P // 8
    assert offloaded.tiers["cpu"]["per_node"] == 8 * 16 * LLAMA_P // 8 == 107_814_649_856


def test_stage_rows_judge_the_host_against_its_memory():
    placement = Placement(offload_optimizer="cpu")
    # The node's CPU holds 16 x 6,738,415,616 = 107.8 GB.
    tight = stage_rows("llama-2-7b", 8, [3], SETTINGS, device="h100-80gb", placement=placement,
                       host_memory=100 * GB)[0]
    assert tight["host_fits"] is False and tight["fits"] is False
    roomy = stage_rows("llama-2-7b", 8, [3], SETTINGS, device="h100-80gb", placement=placement,
                       host_memory=128 * 2**30)[0]
    assert roomy["host_fits"] is True and roomy["fits"] is True
    assert roomy["tiers"]["cpu"]["total"] == 16 * LLAMA_P // 8
    # Without a device, fits stays None; host_fits is still judged.
    alone = stage_rows("llama-2-7b", 8, [3], SETTINGS, placement=placement, host_memory=GB)[0]
    assert alone["fits"] is None and alone["host_fits"] is False


def test_nodes_count_every_gpu_under_tensor_parallelism():
    # 16 GPUs, tensor parallel 2: 8 data-parallel workers, but 8 GPUs (4 replicas x 2) per node.
    settings = WorkingSetSettings(seq_len=4096, tensor_parallel=2)
    (result,) = peaks("llama-2-7b", 16, [3], settings, placement=Placement(offload_optimizer="cpu"))
    # A tensor-parallel rank's exact share: the matrices halved, the 65 norms of 4,096 (two per
    # layer and the final one) whole: (P - 266,240) / 2 + 266,240, sharded over 8 workers.
    share = ((LLAMA_P - 65 * 4096) // 2 + 65 * 4096) // 8
    assert result.tiers["cpu"]["total"] == 16 * share
    assert result.tiers["cpu"]["per_node"] == 8 * 16 * share


def test_estimate_json_gains_tiers_only_with_a_placement():
    plain = estimate(P7B, 64, device="a100-80gb").as_dict()
    assert "tiers" not in plain["stages"][3] and "placement" not in plain
    placed = estimate(P7B, 64, device="a100-80gb", stages=[2],
                      offload_optimizer="cpu", host_memory=10 * GB).as_dict()
    row = placed["stages"][0]
    assert row["total"] == 14 * GB and row["optimizer"] == 0 and row["cluster_total"] == 64 * 14 * GB
    assert row["tiers"]["cpu"]["per_node"] == 14 * GB and row["host_fits"] is False
    assert row["fits"] is False   # the GPU fits (14 GB); the node's 14 GB of host state does not
    assert placed["placement"]["gpus_per_node"] == 8 and placed["host_memory"] == 10 * GB
    with pytest.raises(ValueError, match="host_memory needs a placement"):
        estimate(P7B, 64, host_memory=GB)
    # a shard group of every data-parallel GPU places the state as plain ZeRO does, with tiers
    model = estimate("llama-2-7b", 8, seq_len=4096, micro_batch=1, recompute="selective",
                     shard_group=8, stages=[0]).as_dict()
    assert model["stages"][0]["tiers"]["gpu"]["total"] == 16 * LLAMA_P
