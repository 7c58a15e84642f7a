"""``zerolib estimate --link``: the ``communication`` object per stage, table and CSV columns,
the existing JSON keys unchanged, and one-line errors. Expected values worked out by hand."""
import csv
import io
import math

import pytest
from cli_support import estimate_json, run

EXISTING_KEYS = {"params", "gpus", "layout", "device", "stages"}
LEFT_OUT = {"leaves_out", "working_set_needs"}    # a bare count's answer is model state only
STAGE_KEYS = {"stage", "parameters", "gradients", "optimizer", "total", "cluster_total", "fits"}


def test_without_link_the_json_is_as_before(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64")
    assert set(result) == EXISTING_KEYS | {"engine"} | LEFT_OUT   # engine: whose stages the rows are
    assert result["engine"] == "deepspeed"
    assert all(set(row) == STAGE_KEYS for row in result["stages"])


def test_link_adds_communication_and_keeps_every_key(capsys):
    # The ZeRO paper's schedule (tests/core/step/test_engines.py holds DeepSpeed's).
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--device", "h100-80gb",
                     "--link", "dgx-h100", "--link-efficiency", "line-rate", "--engine", "paper")
    assert set(result) == EXISTING_KEYS | LEFT_OUT | {"interconnect", "compute_settings", "fits_judges",
                                                      "engine", "micro_batches", "overlap"}
    assert all(set(row) == STAGE_KEYS | {"communication"} for row in result["stages"])
    # ceil(7e9 / 64) = 109,375,000 elements per chunk, 2 bytes: one ring pass sends
    # 63 x 109,375,000 x 2 = 13,781,250,000 bytes per GPU.
    passes = {0: 2, 1: 2, 2: 2, 3: 3}
    for row in result["stages"]:
        c = row["communication"]
        assert c["sent_bytes"] == c["received_bytes"] == passes[row["stage"]] * 13_781_250_000
        assert c["sent_bytes"] == sum(k["sent_bytes"] for k in c["collectives"].values())
    stage0 = result["stages"][0]["communication"]["collectives"]
    assert stage0["all_reduce"] == {
        "calls": 1, "handed_bytes": 14 * 10**9, "sent_bytes": 27_562_500_000,
        "received_bytes": 27_562_500_000,
        # 27.5625 GB at 400 GB/s plus 8.4 + 112 x 3.4 + 14 x 14.0 = 585.2 us of ring latency
        "seconds": pytest.approx(27_562_500_000 / 400e9 + 585.2e-6, rel=1e-12)}
    assert stage0["all_gather"]["calls"] == 0
    stage3 = result["stages"][3]["communication"]["collectives"]
    assert stage3["all_gather"]["calls"] == 2 and stage3["reduce_scatter"]["calls"] == 1
    assert result["interconnect"]["bus_bandwidth"] == 400 * 10**9
    # A bare count has no attention core: nothing for a recomputation to repeat of it.
    assert result["compute_settings"] == {"tokens_per_gpu": 4096, "mfu": 0.4, "recompute": "none",
                                          "full_recompute": False, "flops_per_param_token": 6,
                                          "idle_parameters": 0, "attention_flops_per_token": 0,
                                          "recomputed_attention_flops_per_token": 0,
                                          "attention_step_flops_per_token": 0}
    # 6 x 7e9 x 4096 FLOPs / (0.4 x 989.5e12 FLOP/s) = 0.43464 s of compute per step.
    compute = result["stages"][0]["communication"]["compute_seconds"]
    assert math.isclose(compute, 6 * 7e9 * 4096 / (0.4 * 989.5e12))


def test_model_takes_tokens_and_recomputation_from_the_working_set(capsys):
    result = estimate_json(capsys, "--model", "llama-2-7b", "--gpus", "8", "--seq", "2048",
                     "--micro-batch", "4", "--recompute", "full", "--device", "h100-80gb",
                     "--link", "dgx-h100", "--link-efficiency", "line-rate", "--mfu", "50%")
    # The causal attention core per token (flash attention, the default): 32 layers x 2,048 x
    # 32 heads x (128 + 128) = 2^29; the 32,000 x 4,096 input embedding is looked up.
    assert result["compute_settings"] == {"tokens_per_gpu": 8192, "mfu": 0.5, "recompute": "full",
                                          "full_recompute": True, "flops_per_param_token": 8,
                                          "idle_parameters": 131_072_000,
                                          "attention_flops_per_token": 2**29,
                                          "recomputed_attention_flops_per_token": 2**29,
                                          "attention_step_flops_per_token": 2**31}
    # (8 x 6,607,343,616 + 4 x 2^29) x 8192 / (0.5 x 989.5e12) = 55,006,232,576 x 8192 /
    # 4.9475e14 = 0.91079 s (0.87523 s for the 8 per multiplied parameter and token, 0.03556 s
    # for the core: forward, backward's two products, recomputed forward).
    compute = result["stages"][0]["communication"]["compute_seconds"]
    assert (8 * 6_607_343_616 + 4 * 2**29) == 55_006_232_576
    assert math.isclose(compute, 55_006_232_576 * 8192 / 4.9475e14, rel_tol=1e-12)
    assert math.isclose(compute, 0.91079, rel_tol=1e-5)
    # One node: every GPU on NVLink 4, 450 GB/s; stage 3 gathers 35 layers per pass.
    assert result["interconnect"]["bus_bandwidth"] == 450 * 10**9
    assert result["stages"][3]["communication"]["collectives"]["all_gather"]["calls"] == 70


def test_without_a_device_times_stop_at_the_network(capsys):
    result = estimate_json(capsys, "--params", "1B", "--gpus", "4", "--link", "ib-ndr",
                     "--link-efficiency", "line-rate", "--stage", "0", "--engine", "paper")
    c = result["stages"][0]["communication"]
    # 2 x 3 x 250,000,000 x 2 bytes = 3 GB at 50 GB/s + 8.4 + 6 x 14.0 = 92.4 us.
    assert math.isclose(c["communication_seconds"], 3e9 / 50e9 + 92.4e-6)
    assert c["compute_seconds"] is None and c["step_seconds"] is None
    assert c["network_wait_fraction"] is None


def test_gpus_per_node(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "8", "--link", "dgx-h100",
                     "--link-efficiency", "line-rate", "--gpus-per-node", "4")
    # Two nodes of 4 GPUs with 4 NDR ports each: 4 x 50 = 200 GB/s across them.
    assert result["interconnect"]["gpus_per_node"] == 4
    assert result["interconnect"]["nics_per_node"] == 4
    assert result["interconnect"]["bus_bandwidth"] == 200 * 10**9


def test_table_and_csv_columns(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--device",
                         "h100-80gb", "--link", "ib-ndr", "--link-efficiency", "line-rate")
    assert status == 0
    assert "sent/GPU [GB]" in out and "network wait" in out and "bus bandwidth 50.0 GB/s" in out
    # Stage 3 sends 3 x 13.78 = 41.34 GB per GPU.
    assert "41.34" in out
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--link",
                         "ib-ndr", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0]["all_reduce_sent_bytes"] == "27562500000"
    assert rows[3]["all_gather_calls"] == "2" and rows[3]["sent_bytes"] == "41343750000"
    assert rows[3]["step_seconds"] == ""      # no device, no compute time
    header = out.splitlines()[0].split(",")
    assert header[:10] == ["params", "gpus", "layout", "stage", "parameters", "gradients",
                           "optimizer", "total", "cluster_total", "fits"]


@pytest.mark.parametrize("argv, flag", [
    (["--link", "nvlink9"], "--link"),
    (["--link", "ib-ndr", "--gpus-per-node", "8"], "--gpus-per-node"),
    (["--link", "dgx-h100", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["--link", "dgx-h100", "--tokens-per-gpu", "1.5"], "--tokens-per-gpu"),
    (["--link", "dgx-h100", "--mfu", "0"], "--mfu"),
    (["--link", "dgx-h100", "--mfu", "120%"], "--mfu"),
    (["--link", "dgx-h100", "--mfu", "forty"], "--mfu"),
    (["--mfu", "0.4"], "--mfu"),
    (["--tokens-per-gpu", "4096"], "--tokens-per-gpu"),
])
def test_bad_input_is_one_line(capsys, argv, flag):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "64", *argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err


def test_tensor_parallel_with_a_link_is_timed_as_the_plan_times_it(capsys):
    # refused once ("not modelled"); the planner's step model times it, and needs the device
    status, _, err = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8",
                         "--tensor-parallel", "2", "--link", "dgx-h100")
    assert status == 2 and "a link with model parallelism (tensor, pipeline, context or expert) needs a device" in err
    status, out, err = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8",
                           "--tensor-parallel", "2", "--link", "dgx-h100", "--device", "h100-80gb")
    assert status == 0 and err == ""
    assert "Step timed as zerolib plan times it (t = 2): on dgx-h100" in out
    assert "the tensor-parallel collectives are not overlapped" in out and "tensor [s]" in out


def test_nvls_and_link_efficiency_ring(capsys):
    # 7e9 parameters on one DGX H100 (8 GPUs), stage 0: one all-reduce of the 2-byte gradients,
    # 2 x 7 x 875,000,000 x 2 = 24.5 GB sent per GPU. By default it runs on NVLink SHARP at
    # 480 GB/s (NVIDIA/nccl issue #1455); --link-efficiency ring keeps the ring's 370 GB/s.
    # Latency either way: 8.4 + 14 x 3.4 = 56 us.
    seconds = {}
    for extra in ((), ("--link-efficiency", "ring")):
        result = estimate_json(capsys, "--params", "7B", "--gpus", "8", "--device", "h100-80gb",
                               "--link", "dgx-h100", "--engine", "paper", "--stage", "0", *extra)
        (row,) = result["stages"]
        reduce = row["communication"]["collectives"]["all_reduce"]
        assert reduce["sent_bytes"] == 24_500_000_000
        seconds[extra] = reduce["seconds"]
    assert math.isclose(seconds[()], 24.5e9 / 480e9 + 56e-6)
    assert math.isclose(seconds[("--link-efficiency", "ring")], 24.5e9 / 370e9 + 56e-6)
    status, _, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--link", "dgx-h100",
                         "--link-efficiency", "fast")
    assert status == 2 and "achieved or ring or line-rate" in err
