"""``zerolib plan`` takes the trainer as ``estimate`` does (--engine torchtitan, --recompute
op-selective, --fp8, --fp8-all-gather, --compile, --loss, --recompute-method ...) and shows both
peaks, saying which one fits judges; JSON and CSV keep every key they had and add the two."""
import csv
import io
import json

from cli_support import estimate_json, run

BASE = ("plan", "--model", "llama-2-7b", "--gpus", "16", "--gpus-per-node", "8",
        "--device", "h100-80gb", "--seq", "4096", "--global-batch", "64", "--max-micro-batch", "2")
# The CSV's columns before the trainer came to the planner (main at 92a663b), in order.
EARLIER_COLUMNS = [
    "rank", "tensor_parallel", "pipeline_parallel", "data_parallel", "sequence_parallel", "chunks",
    "schedule", "stage", "shard_group", "recompute", "micro_batch", "micro_batches", "offload",
    "peak_bytes", "headroom_bytes", "pipeline_stage", "host_bytes_per_node", "step_seconds",
    "compute_seconds", "tensor_seconds", "pipeline_seconds", "data_parallel_seconds",
    "bubble_seconds", "network_wait_fraction", "bubble_fraction", "fits", "family"]


def _plan_json(capsys, *argv):
    status, out, err = run(capsys, *BASE, *argv, "--format", "json")
    assert status == 0 and err == "", err
    return json.loads(out)


def test_torchtitan_plan_rows_are_what_estimate_says(capsys):
    answer = _plan_json(capsys, "--engine", "torchtitan", "--top", "3")
    assert answer["settings"]["engine"] == "torchtitan"
    assert answer["settings"]["fits_judges"] == "peak_reserved"
    assert answer["settings"]["layout"]["name"] == "fp32-adam"    # the engine's own
    for row in answer["fits"]:
        assert row["fits_judges"] == "peak_reserved"
        assert row["headroom_bytes"] == answer["settings"]["device"]["capacity"] - row["peak_reserved_bytes"]
        # the same configuration asked of estimate, flag by flag
        flags = ["--model", "llama-2-7b", "--gpus", "16", "--device", "h100-80gb", "--seq", "4096",
                 "--engine", "torchtitan", "--stage", str(row["stage"]),
                 "--micro-batch", str(row["micro_batch"]), "--recompute", row["recompute"]]
        if row["shard_group"] != 16:
            flags += ["--shard-group", str(row["shard_group"])]
        assert row["tensor_parallel"] == row["pipeline_parallel"] == 1
        (found,) = estimate_json(capsys, *flags)["stages"]
        assert (found["peak"], found["peak_reserved"], found["fits_judges"]) == (
            row["peak_bytes"], row["peak_reserved_bytes"], row["fits_judges"])


def test_trainer_memory_flags_reach_the_plan(capsys):
    plain = _plan_json(capsys, "--engine", "torchtitan")
    fp8 = _plan_json(capsys, "--engine", "torchtitan", "--fp8", "--fp8-all-gather", "--compile")
    memory = fp8["settings"]["trainer_memory"]
    assert memory["fp8"] and memory["fp8_all_gather"] and memory["compile"]
    assert plain["counts"]["configurations"] == fp8["counts"]["configurations"]
    # (where the optimizer step's moment is the peak, the saved tensors change nothing)
    assert sorted(r["peak_bytes"] for r in plain["fits"]) != sorted(r["peak_bytes"] for r in fp8["fits"])
    named = _plan_json(capsys, "--engine", "fsdp2", "--recompute", "op-selective", "--loss",
                       "chunked", "--top", "2")
    assert {row["recompute"] for row in named["fits"]} == {"op-selective"}
    assert named["settings"]["trainer_memory"]["loss"] == "chunked"
    block = _plan_json(capsys, "--engine", "megatron", "--recompute-method", "block",
                       "--recompute-layers", "2", "--recompute", "full", "--top", "1")
    assert block["settings"]["trainer_memory"]["recompute_method"] == "block"


def test_the_table_shows_both_peaks_and_says_which_fits_judges(capsys):
    status, out, _ = run(capsys, *BASE, "--engine", "torchtitan", "--top", "2", "--wide")
    assert status == 0
    assert "reserved [GB]" in out and "peak [GB]" in out
    assert "fits means the reserved peak per GPU is at most" in out
    status, out, _ = run(capsys, *BASE, "--engine", "fsdp2", "--top", "2", "--wide")
    assert "fits means the peak per GPU is at most" in out and "reserved [GB]" in out


def test_csv_keeps_its_columns_and_adds_both(capsys):
    status, out, err = run(capsys, *BASE, "--engine", "torchtitan", "--context-parallel", "1",
                           "--format", "csv", "--top", "2")
    assert status == 0 and err == ""
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0][:len(EARLIER_COLUMNS)] == EARLIER_COLUMNS
    assert rows[0][len(EARLIER_COLUMNS):] == ["peak_reserved_bytes", "fits_judges"]
    assert rows[1][-1] == "peak_reserved"


def test_a_memory_flag_the_engine_lacks_is_one_line(capsys):
    status, out, err = run(capsys, *BASE, "--engine", "fsdp2", "--fp8-all-gather", "--fp8")
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "torchtitan" in err


def test_a_run_files_trainer_memory_is_the_plans(capsys, tmp_path):
    # (the plan's run-file flags once left these out: a file's fp8 and compile were dropped)
    path = tmp_path / "run.toml"
    path.write_text('[model]\npreset = "llama-2-7b"\n\n[cluster]\ngpus = 16\ndevice = "h100-80gb"\n'
                    'gpus_per_node = 8\n\n[trainer]\nengine = "torchtitan"\nfp8 = true\n'
                    'compile = true\n\n[batch]\nseq_len = 4096\nglobal_batch = 64\n')
    saved = tmp_path / "best.toml"
    status, out, err = run(capsys, "plan", "--run", str(path), "--max-micro-batch", "1",
                           "--format", "json", "--save-run", str(saved))
    assert status == 0, err
    memory = json.loads(out)["settings"]["trainer_memory"]
    assert memory["fp8"] and memory["compile"]
    text = saved.read_text()
    assert 'engine = "torchtitan"' in text and "fp8 = true" in text and "compile = true" in text


def test_plan_carries_reshard_after_forward_and_refuses_it_off_fsdp2(capsys):
    answer = _plan_json(capsys, "--engine", "fsdp2", "--reshard-after-forward", "false", "--top", "3")
    assert answer["settings"]["trainer_memory"]["reshard_after_forward"] is False
    status, out, err = run(capsys, *BASE, "--engine", "megatron", "--reshard-after-forward", "false")
    assert status == 2 and err.count("\n") == 1 and "fsdp2 or torchtitan" in err
