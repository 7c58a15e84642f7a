"""``--engine`` on ``zerolib estimate`` and ``zerolib plan``, and ``--micro-batches`` as gradient
accumulation with ``--link``. Expected values by hand: 7B on 64 GPUs in 16-bit, one ring pass
sends 63 x ceil(7e9 / 64) x 2 = 13,781,250,000 bytes per GPU."""
import json

import pytest
from cli_support import estimate_json, run

PASS = 13_781_250_000


@pytest.mark.parametrize("engine, stage, m, passes", [
    (None, 1, 1, 3),            # DeepSpeed, the default: all-reduce + all-gather
    ("paper", 1, 1, 2),         # reduce-scatter + all-gather
    (None, 2, 4, 9),            # DeepSpeed stage 2 all-reduces every micro-batch: 2m + 1
    ("paper", 2, 4, 5),         # m reduce-scatters + one all-gather
    ("fsdp2", 2, 4, 8),         # a gather and a reduce-scatter every micro-batch: 2m
    # reduced once, at the last micro-batch: a reduce-scatter of its fp32 gradient buffer (bf16
    # forces it, arguments.py 1205-1216: two passes' bytes of 2) + the bf16 all-gather
    ("megatron", 1, 4, 3),
    (None, 3, 4, 12),           # 3m
])
def test_engine_and_micro_batches_set_the_bytes(capsys, engine, stage, m, passes):
    argv = ["--params", "7B", "--gpus", "64", "--link", "ib-hdr", "--stage", str(stage),
            "--micro-batches", str(m), *(["--engine", engine] if engine else [])]
    result = estimate_json(capsys, *argv)
    assert result["engine"] == (engine or "deepspeed") and result["micro_batches"] == m
    assert result["stages"][0]["communication"]["sent_bytes"] == passes * PASS
    assert result["overlap"]["name"] == (engine or "deepspeed")


def test_the_table_says_the_engine_and_overlap(capsys):
    status, out, _ = run(capsys, "estimate", "--params", "7B", "--gpus", "64", "--link", "ib-hdr",
                         "--device", "h100-80gb", "--micro-batches", "2")
    assert status == 0
    assert "engine deepspeed" in out.splitlines()[0]
    assert ("Engine deepspeed, 2 micro-batches per step; overlap rule deepspeed (backward "
            "collectives hidden at stages 3; post-step all-gather exposed; first gather "
            "exposed).") in out


@pytest.mark.parametrize("argv, message", [
    (["--engine", "colossal"], "invalid choice"),
    (["--engine", "fsdp2", "--stage", "1"], "engine fsdp2 offers ZeRO stages 0, 2, 3, got stage 1"),
    (["--link", "ib-hdr", "--micro-batches", "0"], "--micro-batches"),
])
def test_bad_engine_input_is_one_line(capsys, argv, message):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "64", *argv)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err and "Traceback" not in err


def test_plan_engine(capsys):
    base = ("plan", "--model", "llama-2-7b", "--gpus", "16", "--gpus-per-node", "8", "--device",
            "a100-80gb", "--seq", "2048", "--global-batch", "64", "--max-micro-batch", "1")
    status, out, _ = run(capsys, *base, "--engine", "megatron", "--format", "json")
    assert status == 0
    result = json.loads(out)
    assert result["settings"]["engine"] == "megatron"
    assert {row["stage"] for row in result["fits"]} <= {0, 1}
    status, out, _ = run(capsys, *base, "--engine", "fsdp2")
    assert status == 0 and "engine fsdp2 (overlap rule fsdp2)" in out


def test_fsdp2_shows_its_stages_beside_a_pipeline(capsys):
    # FSDP2 composes stages 0, 2 and 3 with a pipeline (torchtitan); DeepSpeed shows 0 and 1.
    argv = ["--model", "llama-2-70b", "--gpus", "64", "--tensor-parallel", "8",
            "--pipeline-parallel", "4", "--device", "h100-80gb"]
    assert [r["stage"] for r in estimate_json(capsys, *argv, "--engine", "fsdp2")["stages"]] == [0, 2, 3]
    assert [r["stage"] for r in estimate_json(capsys, *argv)["stages"]] == [0, 1]
