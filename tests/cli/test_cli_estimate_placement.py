"""``zerolib estimate --shard-group/--hpz/--offload-*``: per-tier bytes in JSON, table and CSV,
the stages a setting is offered at, and one-line errors for what DeepSpeed does not offer."""
import re

import pytest
from cli_support import estimate_json, run

GB = 10**9
LLAMA_2_7B = 6_738_415_616


def test_offload_optimizer_json_per_tier(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--offload-optimizer", "cpu",
                     "--device", "a100-80gb")
    # Optimizer offload is offered at stages 1-3: only those are shown.
    assert [row["stage"] for row in result["stages"]] == [1, 2, 3]
    assert result["placement"] == {"shard_group": None, "hpz_partition": 1,
                                   "offload_optimizer": "cpu", "offload_params": "none",
                                   "gpus_per_node": 8, "max_in_cpu": 10**9,
                                   "host_gradient_bytes": 4}
    stage2 = result["stages"][1]
    # The existing keys stay; they now count the GPU: 2 x 7e9 parameters only.
    assert {"parameters", "gradients", "optimizer", "total", "cluster_total", "fits"} <= set(stage2)
    assert stage2["total"] == 14 * GB and stage2["optimizer"] == 0
    # Host: (4 + 12) B x 7e9 / 64 per GPU, 8 GPUs per node.
    assert stage2["tiers"]["cpu"]["total"] == 1_750_000_000
    assert stage2["tiers"]["cpu"]["per_node"] == 14 * GB
    assert stage2["tiers"]["nvme"]["total"] == 0


def test_zero_infinity_setting_on_dgx2_nodes(capsys):
    result = estimate_json(capsys, "--params", "1T", "--gpus", "512", "--gpus-per-node", "16",
                     "--offload-optimizer", "nvme", "--offload-params", "nvme",
                     "--host-memory", "1.5TiB", "--device", "v100-32gb")
    (row,) = result["stages"]
    assert row["stage"] == 3 and row["total"] == 0
    # 1e12 / 512 = 1,953,125,000 elements per GPU; 1e9 of the 16-bit parameters in CPU memory.
    assert row["tiers"]["cpu"]["total"] == 2 * 10**9
    assert row["tiers"]["cpu"]["per_node"] == 32 * 10**9
    assert row["tiers"]["nvme"]["total"] == 2 * 953_125_000 + 16 * 1_953_125_000
    assert result["host_memory"] == 1536 * 2**30 and row["host_fits"] is True and row["fits"] is True


def test_shard_group_json_and_table(capsys):
    # Every stage in groups: the paper's convention (DeepSpeed shards in groups at stage 3 only).
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--shard-group", "8",
                           "--engine", "paper")
    assert [row["total"] for row in result["stages"]] == [112 * GB, 38_500_000_000,
                                                          26_250_000_000, 14 * GB]
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--shard-group", "8")
    assert [row["stage"] for row in result["stages"]] == [0, 3]      # DeepSpeed's MiCS
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--shard-group", "8")
    assert status == 0 and "shard group of 8" in out and "14.00" in out


def test_hpz_uses_the_node(capsys):
    result = estimate_json(capsys, "--params", "7B", "--gpus", "64", "--hpz")
    (row,) = result["stages"]
    assert result["placement"]["hpz_partition"] == 8
    assert row["tiers"]["gpu"]["hpz_secondary"] == 1_750_000_000       # 2 B x 7e9 / 8
    assert row["parameters"] == 218_750_000 + 1_750_000_000


def test_model_with_offload_and_host_memory(capsys):
    result = estimate_json(capsys, "--model", "llama-2-7b", "--gpus", "8", "--stage", "3",
                     "--offload-optimizer", "cpu", "--device", "h100-80gb", "--host-memory", "100GB")
    (row,) = result["stages"]
    assert row["total"] == 2 * LLAMA_2_7B // 8
    assert row["peak"] == row["total"] + sum(row["working_set"].values())
    # The node's CPU memory must hold 16 x P = 107.8 GB: more than 100 GB.
    assert row["tiers"]["cpu"]["per_node"] == 16 * LLAMA_2_7B
    assert row["host_fits"] is False and row["fits"] is False


def test_csv_gains_tier_columns(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "1B", "--gpus", "4", "--stage", "2",
                         "--offload-optimizer", "cpu", "--format", "csv")
    header, line = out.strip().splitlines()
    assert header == ("params,gpus,layout,stage,parameters,gradients,optimizer,total,cluster_total,"
                      "gpu,cpu,nvme,gpu_per_node,cpu_per_node,nvme_per_node,host_fits,fits,"
                      "fits_judges,leaves_out,working_set_needs")
    # GPU 2 B x 1e9; host 16 B x 1e9 / 4; one node of 4 GPUs. No device: nothing judged.
    assert line == ("1000000000,4,mixed-adam,2,2000000000,0,0,2000000000,8000000000,"
                    "2000000000,4000000000,0,8000000000,16000000000,0,,,,"
                    "activations logits_loss ddp_buckets reduce_bucket allgather_bucket "
                    "gathered_parameters reserve,--model NAME or --config FILE")


def test_table_shows_host_columns(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--offload-optimizer",
                         "cpu", "--host-memory", "10GB")
    assert status == 0
    assert "CPU/GPU [GB]" in out and "CPU/node [GB]" in out and "host fits" in out
    assert "NVMe" not in out.split("\n\n")[1]   # no NVMe column when nothing is there
    assert "host memory 10.00 GB per node" in out


@pytest.mark.parametrize("argv, says", [
    (["--offload-params", "cpu", "--stage", "2"], "offload_params='cpu' needs ZeRO stage 3"),
    (["--offload-optimizer", "nvme", "--stage", "1"], "no NVMe path"),
    (["--offload-optimizer", "cpu", "--stage", "0"], "ZeRO stage 1, 2 or 3"),
    (["--shard-group", "3"], "shard_group must divide gpus"),
    (["--shard-group", "0"], "--shard-group must be a positive whole number"),
    (["--shard-group", "eight"], "--shard-group"),
    (["--hpz", "--stage", "2"], "hpZ.*stage 3"),
    (["--hpz", "--shard-group", "8"], "shard group to be every GPU"),
    (["--hpz", "--offload-params", "cpu"], "offload_params"),
    (["--offload-optimizer", "disk"], "invalid choice"),
    (["--gpus-per-node", "12", "--offload-optimizer", "cpu"], "must fill whole nodes"),
    (["--host-memory", "lots", "--offload-optimizer", "cpu"], "--host-memory must be a size"),
    (["--host-memory", "-1GB", "--offload-optimizer", "cpu"], "--host-memory"),
])
def test_bad_combinations_are_one_line_and_exit_2(capsys, argv, says):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "64", *argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(says, err), err


def test_table_says_what_the_host_columns_hold_with_parameters_on_nvme(capsys):
    """The README's ZeRO-Infinity example printed "CPU/GPU 2.00 GB" unexplained: it is the
    10**9 elements of each GPU's 16-bit parameter shard DeepSpeed keeps in pinned CPU memory
    (offload_param.max_in_cpu), 2 bytes each; the rest of the shard (1e12 / 512 - 1e9 =
    953,125,000 elements) goes to NVMe with the gradients and optimizer state."""
    status, out, _ = run(capsys, "estimate", "--params", "1T", "--gpus", "512", "--gpus-per-node",
                         "16", "--offload-optimizer", "nvme", "--offload-params", "nvme")
    header = " ".join(out.split("\n\n")[0].split())
    assert status == 0
    assert ("Host columns: CPU/GPU holds 2.00 GB of the 16-bit parameters (with parameters on "
            "NVMe DeepSpeed keeps up to offload_param.max_in_cpu = 1,000,000,000 elements of each "
            "GPU's shard in pinned CPU memory); NVMe/GPU holds the rest of the 16-bit parameters, "
            "fp32 gradients and optimizer state; /node is that times the 16 GPUs of a node.") in header


def test_table_says_what_the_host_columns_hold_with_the_optimizer_on_the_cpu(capsys):
    """The README's offload example: Llama-2-70B (68,976,648,192 parameters) on one node of 8
    GPUs puts (4 + 12) B per parameter in CPU memory, 1,103.63 GB per node: more than 1 TiB
    (1,099.51 GB), within 2 TiB; only stage 3 also fits on the GPU."""
    argv = ("estimate", "--model", "llama-2-70b", "--gpus", "8", "--recompute", "full",
            "--offload-optimizer", "cpu", "--device", "a100-80gb", "--host-memory")
    for memory, host_fits, fits in (("1TiB", ["no"] * 3, ["no"] * 3),
                                    ("2TiB", ["yes"] * 3, ["no", "no", "yes"])):
        status, out, _ = run(capsys, *argv, memory)
        header, table = out.split("\n\n")
        assert status == 0
        assert ("Host columns: CPU/GPU holds fp32 gradients and optimizer state; /node is that "
                "times the 8 GPUs of a node; host fits compares CPU/node with --host-memory.") in header
        rows = [line.split() for line in table.splitlines()[2:]]
        assert [row[-3] for row in rows] == ["1,103.63"] * 3
        assert [row[-2] for row in rows] == host_fits and [row[-1] for row in rows] == fits


def test_no_host_note_without_offload(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--shard-group", "8")
    assert status == 0 and "Host columns" not in out
