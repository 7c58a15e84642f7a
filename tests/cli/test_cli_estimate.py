"""``zerolib estimate``: the JSON contract, the table, the CSV, and one-line errors."""
import csv
import io
import json
import subprocess
import sys

import pytest
from cli_support import estimate_json, run

from zerolib.cli import main


def test_json_contract_for_7b_on_64_gpus(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64",
                         "--device", "a100-80gb", "--format", "json")
    assert status == 0
    result = json.loads(out)
    assert result["params"] == 7_000_000_000 and result["gpus"] == 64
    assert result["layout"] == {"name": "mixed-adam", "parameters": 2, "gradients": 2, "optimizer": 12}
    assert result["device"] == {"name": "a100-80gb", "capacity": 85_899_345_920}
    # By hand: 7e9 x (2, 2, 12) bytes; partitioned categories divided by 64.
    assert result["stages"][0] == {"stage": 0, "parameters": 14 * 10**9, "gradients": 14 * 10**9,
                                   "optimizer": 84 * 10**9, "total": 112 * 10**9,
                                   "cluster_total": 7_168 * 10**9, "fits": False}
    assert result["stages"][1]["optimizer"] == 1_312_500_000 and result["stages"][1]["fits"] is True
    assert result["stages"][2]["gradients"] == 218_750_000
    assert result["stages"][3]["total"] == 1_750_000_000
    assert result["stages"][3]["cluster_total"] == 112 * 10**9


def test_without_device_fits_is_null(capsys):
    _, out, _ = run(capsys, "estimate", "--params", "1e9", "--gpus", "4", "--format", "json",
                    "--stage", "2")
    result = json.loads(out)
    assert result["device"] is None
    assert [s["stage"] for s in result["stages"]] == [2]
    assert result["stages"][0]["fits"] is None and result["stages"][0]["total"] == 5_500_000_000


def test_custom_bytes(capsys):
    _, out, _ = run(capsys, "estimate", "--params", "1B", "--gpus", "4", "--bytes", "2,4,12",
                    "--format", "json")
    result = json.loads(out)
    assert result["layout"] == {"name": "custom", "parameters": 2, "gradients": 4, "optimizer": 12}
    assert [s["total"] for s in result["stages"]] == [18 * 10**9, 9 * 10**9, 6 * 10**9, 4_500_000_000]


def test_table_names_its_unit(capsys):
    _, out, _ = run(capsys, "estimate", "--params", "1B", "--gpus", "4", "--unit", "GiB")
    assert "per GPU [GiB]" in out and "14.90" in out  # 16e9 / 2**30 = 14.90 GiB
    _, out, _ = run(capsys, "estimate", "--params", "1B", "--gpus", "4")
    assert "16.00" in out and "7.00" in out and "5.50" in out and "4.00" in out


def test_csv_in_bytes(capsys):
    _, out, _ = run(capsys, "estimate", "--params", "1B", "--gpus", "4", "--format", "csv",
                    "--device", "rtx4090-24gb")
    lines = out.strip().splitlines()
    # A bare count is model state only: the last three columns say what that leaves out.
    assert lines[0] == ("params,gpus,layout,stage,parameters,gradients,optimizer,total,cluster_total,fits,"
                        "fits_judges,leaves_out,working_set_needs")
    assert lines[1] == ("1000000000,4,mixed-adam,0,2000000000,2000000000,12000000000,16000000000,64000000000,True,"
                        "model state,activations logits_loss ddp_buckets reduce_bucket allgather_bucket "
                        "gathered_parameters reserve,--model NAME or --config FILE")


@pytest.mark.parametrize("argv, says", [
    (["--params=-7B", "--gpus", "8"], "positive"),
    (["--params", "-7B", "--gpus", "8"], "--params"),
    (["--params", "0", "--gpus", "8"], "positive"),
    (["--params", "nan", "--gpus", "8"], "--params"),
    (["--params", "inf", "--gpus", "8"], "--params"),
    (["--params", "seven", "--gpus", "8"], "--params"),
    (["--params", "7B", "--gpus", "0"], "--gpus must be a positive whole number"),
    (["--params", "7B", "--gpus", "-2"], "--gpus must be a positive whole number"),
    (["--params", "7B", "--gpus", "1-0"], "--gpus"),
    (["--params", "7B", "--gpus", "99999999999"], "--gpus must be at most 16,777,216"),
    (["--params", "7B", "--gpus", "2.5"], "--gpus"),
    (["--params", "7B", "--gpus", "True"], "--gpus"),
    (["--params", "7B", "--gpus", "8", "--stage", "4"], "--stage must be 0, 1, 2 or 3"),
    (["--params", "7B", "--gpus", "8", "--stage", "-1"], "--stage must be 0, 1, 2 or 3"),
    (["--params", "7B", "--gpus", "8", "--layout", "adam-4bit"], "invalid choice"),
    (["--params", "7B", "--gpus", "8", "--device", "a100-90gb"], "invalid choice"),
    (["--params", "7B", "--gpus", "8", "--bytes", "2,2"], "--bytes"),
    (["--params", "7B", "--gpus", "8", "--bytes", "2,x,12"], "--bytes"),
    (["--params", "7B", "--gpus", "8", "--bytes", "2,-2,12"], "non-negative"),
    (["--params", "7B", "--gpus", "8", "--bytes", "2,nan,12"], "non-negative"),
    (["--params", "7B", "--gpus", "8", "--bytes", "inf,2,12"], "--bytes parameters width"),
    (["--params", "7B", "--gpus", "8", "--bytes", "2,2,100"], "at most 64 bytes"),
    (["--params", "7B", "--gpus", "8", "--unit", "MB"], "invalid choice"),
    (["--gpus", "8"], "required"),
])
def test_bad_input_is_one_line_and_status_2(capsys, argv, says):
    with pytest.raises(SystemExit) as exit_info:
        status = main(["estimate", *argv])
        raise SystemExit(status)
    _, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err


def test_python_dash_m_and_help():
    for argv in (["--help"], ["estimate", "--help"]):
        done = subprocess.run([sys.executable, "-m", "zerolib", *argv], capture_output=True, text=True)
        assert done.returncode == 0 and "usage: zerolib" in done.stdout
    done = subprocess.run([sys.executable, "-m", "zerolib", "estimate", "--params", "-1", "--gpus", "2"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_model_state_answer_says_what_it_leaves_out_in_every_format(capsys):
    """The newcomer's question "will 13B fit on 8 A100s?" asked with a bare count: ZeRO-1's
    model state, 2 + 2 + 12/8 = 5.5 bytes x 13e9 = 71.5 GB, fits 85.9 GB; with the model's
    working set (--model llama-2-13b) ZeRO-1's peak does not. The bare answer names the terms
    it left out (those of the --model answer's working set) and the flags that add them."""
    argv = ("--params", "13B", "--gpus", "8", "--device", "a100-80gb")
    bare = estimate_json(capsys, *argv)
    model = estimate_json(capsys, "--model", "llama-2-13b", "--gpus", "8", "--device", "a100-80gb")
    assert bare["stages"][1]["total"] == 71_500_000_000 and bare["stages"][1]["fits"] is True
    assert model["stages"][1]["fits"] is False and model["fits_judges"] == "peak"
    assert bare["fits_judges"] == "model state"
    assert bare["leaves_out"] == list(model["stages"][1]["working_set"])
    assert bare["working_set_needs"] == "--model NAME or --config FILE"
    assert "leaves_out" not in model and "working_set_needs" not in model
    _, table, _ = run(capsys, "estimate", *argv)
    assert ("Model state only: 'model state fits' leaves out the working set (activations, "
            "logits+loss, DDP buckets, reduce bucket, all-gather bucket, gathered params, reserve), "
            "which comes on top and sets the peak per GPU; zerolib estimate --model NAME or "
            "--config FILE") in table
    _, table, _ = run(capsys, "estimate", "--params", "13B", "--gpus", "8")    # no device
    assert "Model state only: the working set (activations," in table and "--config FILE" in table
    _, text, _ = run(capsys, "estimate", *argv, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [row["fits"] for row in rows] == ["False", "True", "True", "True"]
    assert {row["fits_judges"] for row in rows} == {"model state"}
    assert {row["leaves_out"] for row in rows} == {" ".join(bare["leaves_out"])}
    assert {row["working_set_needs"] for row in rows} == {"--model NAME or --config FILE"}
    _, table, _ = run(capsys, "estimate", "--model", "llama-2-13b", "--gpus", "8", "--device", "a100-80gb")
    assert "Model state only" not in table
