"""The CPU's optimizer step under optimizer offload, and NVMe at the drives' rate, by hand.

Hand-worked figures (issue 22, item 5):

- mixed-precision Adam streams 30 bytes per parameter through host memory per step: the fp32
  master parameter, momentum and variance read and written (2 x 12 B), the fp32 host gradient
  read (4 B), the 16-bit parameter written (2 B);
- a DGX A100's two EPYC 7742 have 8 DDR4-3200 channels each: 2 x 8 x 3,200e6 x 8 B = 409.6
  GB/s; a DGX H100's two Xeon 8480C 8 DDR5-4800 channels each: 614.4 GB/s;
- Llama-2-70B has 68,976,648,192 parameters: on one node of 8 GPUs each steps an
  8,622,081,024-element partition at 1/8 of the bandwidth, 30 x 68,976,648,192 / 409.6e9 =
  5.0520006 s a step (the issue's "at least about 5 s", 28 % of notebook 06's 18.11 s step).
"""
import math

import numpy as np
import pytest

import zerolib as zl
from zerolib.core.catalogue.hosts import HOSTS, get_host
from zerolib.core.catalogue.models import get_model
from zerolib.core.estimate import estimate
from zerolib.core.memory.placement import Placement
from zerolib.core.memory.working_set import WorkingSetSettings
from zerolib.core.step.offload_traffic import HostSettings, host_traffic
from zerolib.core.step.parallel import offload_seconds
from zerolib.core.step.tables import timeline_frame
from zerolib.core.step.time import ComputeSettings

LLAMA_2_70B = 68_976_648_192
P7 = 6_738_415_616
OPTIMIZER = Placement(offload_optimizer="cpu")
FULL = WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="full")
# the same, as a run's fields
FULL_RUN = dict(seq_len=4096, micro_batch=1, recompute="full")
OFFLOADED = dict(offload_optimizer="cpu")


def test_host_memory_bandwidths_from_their_channels():
    assert HOSTS["dgx-a100"].memory_bandwidth == 2 * 8 * 3_200 * 10**6 * 8 == 409_600_000_000
    assert HOSTS["dgx-h100"].memory_bandwidth == 2 * 8 * 4_800 * 10**6 * 8 == 614_400_000_000
    # Eight drives in RAID 0, each 6.4 GB/s read and 3.8 GB/s written.
    assert HOSTS["dgx-h100"].nvme_read == 51_200_000_000
    assert HOSTS["dgx-h100"].nvme_write == 30_400_000_000
    assert get_host(" DGX-H100 ") is HOSTS["dgx-h100"]
    assert all(host.source and host.drive.source for host in HOSTS.values())
    with pytest.raises(ValueError, match="host must be one of dgx-a100, dgx-h100, got 'dgx-9'"):
        get_host("dgx-9")


def test_adam_streams_30_bytes_per_parameter():
    # One GPU of 1e9 parameters, stage 2: the whole 1e9-element partition, alone on its host.
    host = host_traffic(1_000_000_000, 1, 2, placement=OPTIMIZER)
    assert int(host.cpu_step_elements) == 1_000_000_000
    assert int(host.cpu_step_bytes) == 30_000_000_000
    assert float(host.cpu_seconds()) == 30e9 / 409.6e9
    # Nothing steps on the CPU when only the parameters are offloaded (the GPU runs Adam).
    params_only = host_traffic(1_000_000_000, 8, 3, placement=Placement(offload_params="cpu"))
    assert int(params_only.cpu_step_bytes) == 0 and float(params_only.cpu_seconds()) == 0.0


def test_llama_2_70b_on_one_node_takes_at_least_5_seconds():
    for stage in (1, 2, 3):
        host = host_traffic(LLAMA_2_70B, 8, stage, placement=OPTIMIZER)
        assert int(host.cpu_step_elements) == 8_622_081_024
        assert int(host.cpu_step_bytes) == 30 * 8_622_081_024
        seconds = float(host.cpu_seconds())
        assert seconds == pytest.approx(30 * LLAMA_2_70B / 409.6e9, rel=1e-15)
        assert 5.05 < seconds < 5.06
    # The DGX H100's faster memory: 30 x 68,976,648,192 / 614.4e9 = 3.3680 s.
    h100 = host_traffic(LLAMA_2_70B, 8, 3, placement=OPTIMIZER).cpu_seconds(HostSettings("dgx-h100"))
    assert float(h100) == pytest.approx(30 * LLAMA_2_70B / 614.4e9, rel=1e-15)


def test_a_measured_rate_counts_where_it_is_slower_than_the_roofline():
    host = host_traffic(LLAMA_2_70B, 8, 3, placement=OPTIMIZER)
    # 1e9 parameters per second for the node: 68.98 s, far above the 5.05 s roofline.
    slow = HostSettings("dgx-a100", cpu_adam_rate=1e9)
    assert float(host.cpu_seconds(slow)) == pytest.approx(LLAMA_2_70B / 1e9, rel=1e-15)
    assert float(host.cpu_roofline_seconds(slow)) == pytest.approx(5.0520006, rel=1e-7)
    # A rate beyond what the memory can feed does not beat the roofline.
    fast = HostSettings("dgx-a100", cpu_adam_rate=1e12)
    assert float(host.cpu_seconds(fast)) == pytest.approx(30 * LLAMA_2_70B / 409.6e9, rel=1e-15)
    assert slow.as_dict()["cpu_step_basis"] == "roofline and measured rate"
    assert HostSettings().as_dict()["cpu_step_basis"] == "roofline"


def cpu_step():
    return 30 * 8_622_081_024 * 8 / 409.6e9


def test_the_step_pays_the_cpu_step_after_the_backward():
    # Notebook 06's run: Llama-2-70B on one DGX A100 node, stage 3, full recomputation. The
    # compute is 8 FLOPs per multiplied parameter, 68,976,648,192 less the 32,000 x 8,192 input
    # embedding (a lookup): 68,714,504,192, plus 4 times the causal attention core (forward,
    # backward's two, the recomputed forward: 80 layers x 4,096 x 64 heads x (128 + 128) =
    # 5,368,709,120 FLOPs per token), x 4,096 tokens / (0.4 x 312e12) = 18.7468 s; all the
    # collectives and the gradient copy hide behind it; after the backward the CPU steps
    # (5.0520 s) and the 8,622,081,024 x 2 B partition comes up on PCIe 4.0 (0.5474 s): 24.3462 s.
    # The paper's overlap rule, under which the collectives hide as said above.
    (row,) = estimate("llama-2-70b", 8, **FULL_RUN, device="a100-80gb", stages=[3],
                      **OFFLOADED, link="dgx-a100", engine="paper").stages
    c = row["communication"]
    compute = (8 * (LLAMA_2_70B - 32_000 * 8192) + 4 * 80 * 4096 * 64 * 256) * 4096 / (0.4 * 312e12)
    assert compute + cpu_step() == pytest.approx(24.3462 - 0.5474, abs=1e-4)
    cpu = cpu_step()
    up = 17_244_162_048 / 31.5e9
    assert c["cpu_step_seconds"] == pytest.approx(cpu, rel=1e-12)
    assert c["step_seconds"] == pytest.approx(compute + cpu + up, rel=1e-12)
    assert c["host"]["cpu_step"] == {"elements": 8_622_081_024, "bytes": 258_662_430_720,
                                     "gpus_on_node": 8, "roofline_seconds": pytest.approx(cpu),
                                     "seconds": pytest.approx(cpu)}
    settings = c["host"]["host_settings"]
    assert settings["host"]["name"] == "dgx-a100" and settings["cpu_adam_rate"] is None
    assert settings["host"]["memory_bandwidth"] == 409_600_000_000
    # Without offload nothing steps on the CPU.
    (plain,) = estimate("llama-2-70b", 8, **FULL_RUN, device="a100-80gb", stages=[3],
                        link="dgx-a100", engine="paper").stages
    assert plain["communication"]["cpu_step_seconds"] == 0.0
    assert plain["communication"]["step_seconds"] == pytest.approx(compute, rel=1e-12)


def test_the_host_follows_the_node_unless_named():
    # --link dgx-h100: the DGX H100's own CPUs; a link that is no catalogued node: DGX A100's.
    def cpu(**options):
        result = estimate(LLAMA_2_70B, 8, stages=[3], **OFFLOADED, **options)
        return result.stages[0]["communication"]["cpu_step_seconds"]

    assert cpu(link="dgx-h100") == pytest.approx(30 * LLAMA_2_70B / 614.4e9, rel=1e-12)
    assert cpu(link="ib-ndr") == pytest.approx(30 * LLAMA_2_70B / 409.6e9, rel=1e-12)
    assert cpu(link="dgx-a100", host="dgx-h100") == pytest.approx(30 * LLAMA_2_70B / 614.4e9,
                                                                  rel=1e-12)
    assert cpu(link="dgx-h100", cpu_adam_rate=2e9) == pytest.approx(LLAMA_2_70B / 2e9, rel=1e-12)
    # Nodes of 4 (--gpus-per-node 4): each GPU's partition gets a quarter of the host, not an
    # eighth: 30 x 8,622,081,024 x 4 / 409.6e9 = 2.526 s.
    assert cpu(link="dgx-a100", gpus_per_node=4) == pytest.approx(
        30 * 8_622_081_024 * 4 / 409.6e9, rel=1e-12)


def test_nvme_runs_at_each_gpus_share_of_the_drives():
    # 16e9 parameters on 8 GPUs, optimizer on NVMe (stage 3): after the step 24e9 + 8e9 B of
    # state and fp32 gradients are read and 24e9 B written per GPU. Eight PM1733 drives (6.4 GB/s
    # read, 3.8 GB/s write each) shared by 8 GPUs: 5 s + 6.3158 s, against 1.7778 s at PCIe speed.
    host = host_traffic(16_000_000_000, 8, 3, placement=Placement(offload_optimizer="nvme"))
    read, write = host.nvme_bandwidth("pcie4-x16")
    assert float(read) == 6.4e9 and float(write) == 3.8e9
    after = float(host.seconds("pcie4-x16")["after_step"])
    up = 4e9 / 31.5e9     # the updated 2e9-element partition, 16 bits, back to the GPU
    assert after == pytest.approx(up + 32e9 / 6.4e9 + 24e9 / 3.8e9, rel=1e-12)
    assert float(host.seconds("pcie4-x16", "pcie4-x16")["after_step"]) == pytest.approx(
        up + 56e9 / 31.5e9, rel=1e-12)
    # One GPU alone on the host would get all 51.2 GB/s of reads, but its PCIe 4.0 link caps it.
    one = host_traffic(2_000_000_000, 1, 3, placement=Placement(offload_optimizer="nvme"))
    assert [float(x) for x in one.nvme_bandwidth("pcie4-x16")] == [31.5e9, 30.4e9]
    assert [float(x) for x in one.nvme_bandwidth("pcie5-x16")] == [51.2e9, 30.4e9]


def test_the_planners_host_seconds_hold_the_cpu_step():
    # Llama-2-7B, stage 3 over 8: 842,301,952-element partitions, 30 B each, at 1/8 of the
    # named host's bandwidth; after the step the updated 16-bit partition comes up too.
    up = 1_684_603_904 / 31.5e9
    for name, bandwidth in (("dgx-a100", 409.6e9), ("dgx-h100", 614.4e9)):
        seconds = offload_seconds(P7, 8, 3, "optimizer", host=HostSettings(name))
        assert float(seconds["after_step"]) == pytest.approx(
            up + 30 * 842_301_952 * 8 / bandwidth, rel=1e-15)
    # Four GPUs per node share the host four ways.
    four = offload_seconds(P7, 8, 3, "optimizer", gpus_per_node=4)
    assert float(four["after_step"]) == pytest.approx(up + 30 * 842_301_952 * 4 / 409.6e9,
                                                      rel=1e-15)
    assert float(offload_seconds(P7, 8, 3, "none")["after_step"]) == 0.0


def test_the_timeline_names_the_cpu_step():
    # The estimate's compute: the run's full recomputation, its attention core included.
    compute = ComputeSettings.for_run(get_model("llama-2-70b"), FULL, 0.4)
    frame = timeline_frame("llama-2-70b", 8, "dgx-a100", "a100-80gb", compute, stages=[2],
                           placement=OPTIMIZER)
    blocks = frame.set_index("block")
    step = blocks.loc["cpu_optimizer_step"]
    backward_end = blocks.loc["backward", "end_seconds"]
    assert step["lane"] == "host" and step["label"] == "the CPU's optimizer step"
    assert step["start_seconds"] == backward_end
    assert step["end_seconds"] - step["start_seconds"] == pytest.approx(5.0520006, rel=1e-7)
    # The updated partition comes up after it, then the stage-2 all-gather spreads it.
    assert blocks.loc["host_after_step", "start_seconds"] == step["end_seconds"]
    assert (blocks.loc["parameter_all_gather", "start_seconds"]
            == blocks.loc["host_after_step", "end_seconds"])
    # The timeline draws the paper's schedule: the estimate beside it, too.
    (row,) = estimate("llama-2-70b", 8, **FULL_RUN, device="a100-80gb", stages=[2],
                      **OFFLOADED, link="dgx-a100", engine="paper").stages
    assert frame.attrs["step_seconds"][2] == pytest.approx(row["communication"]["step_seconds"],
                                                           rel=1e-12)
    # Without offload the timeline is as before: no host block.
    plain = timeline_frame("llama-2-70b", 8, "dgx-a100", "a100-80gb", stages=[2])
    assert not plain["block"].str.startswith(("host", "cpu")).any()


@pytest.mark.parametrize("rate, error", [
    (0, ValueError), (-1.0, ValueError), (math.nan, ValueError), (math.inf, ValueError),
    (1e16, ValueError), (True, TypeError), ("2e9", TypeError), (np.float64(-2), ValueError)])
def test_bad_rates_are_refused_naming_the_setting(rate, error):
    with pytest.raises(error, match="cpu_adam_rate must be a number of parameters per second"):
        HostSettings(cpu_adam_rate=rate)


def test_host_settings_need_a_link_and_a_known_host():
    with pytest.raises(ValueError, match="host needs a link"):
        estimate(7e9, 8, stages=[3], **OFFLOADED, host="dgx-h100")
    with pytest.raises(ValueError, match="cpu_adam_rate needs a link"):
        estimate(7e9, 8, stages=[3], **OFFLOADED, cpu_adam_rate=2e9)
    with pytest.raises(ValueError, match="host must be one of dgx-a100, dgx-h100"):
        estimate(7e9, 8, stages=[3], **OFFLOADED, link="dgx-a100", host="epyc")
    with pytest.raises(TypeError, match="host must be a HostSettings"):
        offload_seconds(P7, 8, 3, "optimizer", host="dgx-h100")


def test_the_planner_times_the_named_host():
    def offloaded(**options):
        valid = zl.plan("llama-2-7b", 8, 8, "h100-80gb", 4096, 64, max_micro_batch=1,
                        host_memory=2**41, stages=(3,), recompute=("full",), **options).valid
        row = valid[(valid["tensor_parallel"] == 1) & (valid["pipeline_parallel"] == 1)
                    & (valid["shard_group"] == 8) & (valid["offload"] == "optimizer")]
        (step,) = row["step_seconds"].tolist()
        return step

    # H100s come in DGX H100 nodes: their host by default. Naming the DGX A100's host adds the
    # difference of the two rooflines for the 842,301,952-element partition, once per step.
    partition = 30 * 842_301_952 * 8
    assert offloaded(host="dgx-a100") - offloaded() == pytest.approx(
        partition / 409.6e9 - partition / 614.4e9, rel=1e-9)
    # A measured 1e9 parameters per second for the node: 6,738,415,616 / 1e9 s instead.
    assert offloaded(cpu_adam_rate=1e9) - offloaded() == pytest.approx(
        P7 / 1e9 - partition / 614.4e9, rel=1e-9)
    with pytest.raises(ValueError, match=r"cluster\.cpu_adam_rate must be a whole number from 1"):
        zl.plan("llama-2-7b", 8, 8, "h100-80gb", 4096, 64, cpu_adam_rate=-1)
    with pytest.raises(ValueError, match="host must be one of dgx-a100, dgx-h100"):
        zl.plan("llama-2-7b", 8, 8, "h100-80gb", 4096, 64, host="dgx-b200")
