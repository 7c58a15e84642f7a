"""``zerolib estimate --engine torchtitan`` and the trainer's memory flags: both peaks in JSON,
which one fits judges, and one line for a flag that cannot apply."""
import json

from cli_support import run

from zerolib.core.units import GiB

# torchtitan's December 2024 benchmark (data/measured_peaks.csv, tt24-t1-fsdp): 82.4 GiB reserved
TT24 = ("estimate", "--model", "llama-3-8b", "--gpus", "8", "--device", "h100-80gb", "--engine",
        "torchtitan", "--seq", "8192", "--micro-batch", "2", "--loss", "eager", "--stage", "3")


def test_torchtitan_rows_carry_both_peaks_and_judge_the_reserved_one(capsys):
    status, out, err = run(capsys, *TT24, "--format", "json")
    assert status == 0 and err == ""
    (row,) = json.loads(out)["stages"]
    reserve = row["working_set"]["reserve"]
    assert row["fits_judges"] == "peak_reserved"
    assert row["peak"] == row["max_memory_allocated"] + reserve
    assert row["peak_reserved"] == row["max_memory_reserved"] + reserve
    # within 10 % of what torchtitan logged
    assert abs(row["max_memory_reserved"] / (82.4 * GiB) - 1) < 0.10
    assert row["fits"] is (row["peak_reserved"] <= 80 * GiB)


def test_the_chapter_engines_judge_the_peak_as_before(capsys):
    status, out, _ = run(capsys, "estimate", "--model", "llama-2-7b", "--gpus", "8", "--format", "json")
    assert status == 0
    for row in json.loads(out)["stages"]:
        assert row["fits_judges"] == "peak"
        assert row["peak"] == row["total"] + sum(row["working_set"].values())
        assert row["peak_reserved"] > row["peak"]


def test_the_table_shows_both_peaks(capsys):
    status, out, _ = run(capsys, *TT24)
    assert status == 0 and "peak reserved [GB]" in out and "judged on the reserved peak" in out


def test_a_method_without_full_recomputation_is_one_line(capsys):
    status, _, err = run(capsys, "estimate", "--model", "llama-3-8b", "--gpus", "8",
                         "--recompute-layers", "2")
    assert status == 2 and len(err.strip().splitlines()) == 1 and "recompute" in err


def test_fp8_all_gather_needs_fp8_and_torchtitan(capsys):
    status, _, err = run(capsys, "estimate", "--model", "llama-3-8b", "--gpus", "8", "--engine",
                         "fsdp2", "--fp8", "--fp8-all-gather")
    assert status == 2 and "torchtitan" in err and len(err.strip().splitlines()) == 1
