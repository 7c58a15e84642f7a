"""``zerolib estimate --model ...``: the working set and the peak in JSON, table and CSV."""
import json
import subprocess
import sys

import pytest
from cli_support import run

from zerolib.cli import main
from zerolib.core.units import GiB

LLAMA_2_7B = 6_738_415_616


def test_issue_example_json(capsys):
    status, out, err = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8", "--seq", "4096",
                           "--micro-batch", "1", "--recompute", "selective", "--device", "h100-80gb",
                           "--format", "json")
    assert status == 0 and err == ""
    result = json.loads(out)
    assert result["params"] == LLAMA_2_7B and result["gpus"] == 8 and result["model"] == "llama-2-7b"
    assert result["working_set_settings"]["seq_len"] == 4096
    capacity = 80 * GiB
    for row in result["stages"]:
        ws = row["working_set"]
        assert set(ws) == {"activations", "logits_loss", "ddp_buckets", "reduce_bucket",
                           "allgather_bucket", "gathered_parameters", "reserve"}
        assert row["peak"] == row["total"] + sum(ws.values())
        assert row["fits"] is (row["peak"] <= capacity)
    stage0, stage3 = result["stages"][0], result["stages"][3]
    # Persistent state as the core computes it: 16 bytes per parameter at stage 0.
    assert stage0["total"] == 16 * LLAMA_2_7B
    # By hand: Llama-2-7B, 4096 tokens, selective + flash, no dropout: per layer 16sbh + 8sbf
    # (f = 11008) bytes; plus one recomputed log-sum-exp, final norm and projection inputs.
    s, h, f = 4096, 4096, 11008
    layers = 32 * (16 * s * h + 8 * s * f)
    assert stage3["working_set"]["activations"] == layers + 4 * 32 * s + 4 * s * h
    assert stage3["working_set"]["logits_loss"] == 6 * s * 32000
    assert stage0["working_set"]["ddp_buckets"] == 2 * LLAMA_2_7B
    assert stage3["working_set"]["gathered_parameters"] == 2 * 10**9
    # Stage 0 does not fit an 80 GiB H100 even before the working set; stage 3 does.
    assert stage0["fits"] is False and stage3["fits"] is True


def test_fits_is_judged_on_the_peak_not_the_state(capsys):
    # Llama-2-7B at stage 3 on 8 GPUs: 13.5 GB of state fits a 24 GiB card, but 32k tokens of
    # activations without recomputation do not.
    _, out, _ = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8", "--stage", "3",
                    "--device", "rtx4090-24gb", "--format", "json")
    _, out_long, _ = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8", "--stage", "3",
                         "--seq", "32768", "--device", "rtx4090-24gb", "--format", "json")
    _, plain, _ = run(capsys, "estimate", "--params", str(LLAMA_2_7B), "--gpus", "8", "--stage", "3",
                      "--device", "rtx4090-24gb", "--format", "json")
    assert json.loads(plain)["stages"][0]["fits"] is True
    assert json.loads(out_long)["stages"][0]["fits"] is False
    assert json.loads(out)["stages"][0]["total"] == json.loads(plain)["stages"][0]["total"]


def test_flags_change_the_terms(capsys):
    def stage(*flags, number="1"):
        _, out, _ = run(capsys, "estimate", "--model", "llama-3-8b", "--gpus", "8", "--stage", number,
                        "--seq", "8192", "--format", "json", *flags)
        return json.loads(out)["stages"][0]

    base = stage()
    assert stage("--micro-batch", "2")["working_set"]["activations"] == 2 * base["working_set"]["activations"]
    assert stage("--no-flash")["working_set"]["activations"] > base["working_set"]["activations"]
    assert stage("--recompute", "full")["working_set"]["activations"] < base["working_set"]["activations"]
    assert stage("--reserve", "0")["working_set"]["reserve"] == 0
    assert stage("--reserve", "1.5GB")["working_set"]["reserve"] == 1_500_000_000
    assert stage("--overlap-comm")["working_set"]["reduce_bucket"] == 2 * 10**9
    assert stage("--reduce-bucket-size", "2e8")["working_set"]["reduce_bucket"] == 4 * 10**8
    assert stage("--ddp-bucket-view", number="0")["working_set"]["ddp_buckets"] == 0
    assert stage("--max-live-parameters", "0", number="3")["working_set"]["gathered_parameters"] == \
        2 * (128_256 * 4_096 + 50_000_000)
    tp = stage("--tensor-parallel", "8", "--sequence-parallel")
    assert tp["working_set"]["activations"] == base["working_set"]["activations"] // 8
    # One tensor-parallel rank's exact share, by hand: per layer q, o 4096 x 4096, k, v 4096 x
    # 1024, gate/up/down 3 x 4096 x 14336 = 218,103,808 / 8 = 27,262,976, plus two whole RMSNorms
    # (8,192): x 32 = 872,677,376; embedding and output 128,256 x 4096 / 8 = 65,667,072 each;
    # final norm 4,096: 1,004,015,616 parameters at 2 bytes.
    assert tp["parameters"] == 2 * 1_004_015_616
    assert tp["pipeline_stage"] == 0


def test_table_and_csv_gain_columns(capsys):
    _, table, _ = run(capsys, "estimate", "--model", "mistral-7b-v0.1", "--gpus", "16",
                      "--device", "a100-80gb", "--unit", "GiB")
    assert "peak [GiB]" in table and "activations [GiB]" in table and "Working set:" in table
    _, csv_text, _ = run(capsys, "estimate", "--model", "mistral-7b-v0.1", "--gpus", "16", "--format", "csv")
    header, *rows = csv_text.splitlines()
    assert header.endswith("reserve,peak,fits") and len(rows) == 4
    # Without --model nothing changes: no working-set columns.
    _, plain, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "16", "--format", "csv")
    assert "peak" not in plain.splitlines()[0]


@pytest.mark.parametrize("argv, fragment", [
    (["--params", "7B", "--gpus", "8", "--seq", "4096"], "--seq needs --model"),
    (["--model", "llama-9b", "--gpus", "8"], "llama-2-7b"),                  # lists the presets
    (["--model", "gpt2", "--gpus", "8", "--seq", "0"], "--seq"),
    (["--model", "gpt2", "--gpus", "8", "--seq", "many"], "--seq"),
    (["--model", "gpt2", "--gpus", "8", "--micro-batch", "-3"], "--micro-batch"),
    (["--model", "gpt2", "--gpus", "8", "--micro-batch", "0.5"], "--micro-batch"),
    (["--model", "gpt2", "--gpus", "8", "--seq", "4096"], "at most 1024"),
    (["--model", "gpt2", "--gpus", "8", "--reserve", "lots"], "--reserve"),
    (["--model", "gpt2", "--gpus", "6", "--tensor-parallel", "4"], "multiple of tensor_parallel"),
    (["--model", "gpt2", "--params", "7B", "--gpus", "8"], "not allowed"),
    (["--model", "gpt2", "--gpus", "8", "--recompute", "some"], "--recompute"),
    (["--gpus", "8"], "--params"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, fragment):
    try:
        status = main(["estimate", *argv])
    except SystemExit as stop:          # argparse usage errors exit from inside main
        status = stop.code
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0]


def test_a_real_process_prints_no_traceback():
    done = subprocess.run([sys.executable, "-m", "zerolib", "estimate", "--model", "gpt2", "--gpus", "8",
                           "--seq", "4096"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == ("zerolib estimate: error: seq_len must be at most 1024 for gpt2 "
                                   "(learned position embeddings), got 4096")
