"""``--tokens N`` on ``zerolib estimate`` and ``zerolib plan``: the run's steps, wall-clock time
and GPU-hours with their assumptions, worked by hand; one-line errors."""
import csv
import io
import json

import pytest
from cli_support import estimate_json, run

# The step times below were worked out for the paper's schedule at the links' line rate.
ESTIMATE = ("--params", "7B", "--gpus", "64", "--link", "dgx-h100", "--device", "h100-80gb",
            "--engine", "paper", "--link-efficiency", "line-rate")
PLAN = ("plan", "--model", "llama-2-70b", "--gpus", "64", "--gpus-per-node", "8",
        "--device", "a100-80gb", "--seq", "4096", "--global-batch", "1024", "--engine", "paper",
        "--link-efficiency", "line-rate")
# 7B on 64 H100: 6 x 7e9 x 4,096 FLOPs at 0.4 x 989.5e12 FLOP/s, 0.434644 s of compute a step;
# stage 0's all-reduce and stage 3's gathers hide behind it, so that is the step.
STEP0 = 6 * 7e9 * 4096 / (0.4 * 989.5e12)
# 2e12 tokens at 4,096 x 64 = 262,144 per step: 7,629,394.53, so 7,629,395 steps.
STEPS = 7_629_395


@pytest.mark.parametrize("tokens", ["2e12", "2T", "2,000,000,000,000"])
def test_estimate_json_by_hand(capsys, tokens):
    result = estimate_json(capsys, *ESTIMATE, "--tokens", tokens)
    run_ = result["run"]
    assert {k: run_[k] for k in ("tokens", "tokens_per_step", "gpus", "steps", "engine", "mfu")} == {
        "tokens": 2 * 10**12, "tokens_per_step": 262_144, "gpus": 64, "steps": STEPS,
        "engine": "paper", "mfu": 0.4}
    assert run_["assumptions"][-1] == "no failures, restarts, evaluation or checkpointing"
    stage0, stage3 = result["stages"][0], result["stages"][3]
    assert stage0["run"]["seconds"] == pytest.approx(STEPS * STEP0, rel=1e-12)   # 3.316e6 s
    assert stage0["run"]["gpu_hours"] == pytest.approx(64 * STEPS * STEP0 / 3600, rel=1e-12)
    assert stage3["run"] == stage0["run"]
    # Stage 1 waits for its after-step gather: each stage's run is its own step x the steps.
    stage1 = result["stages"][1]
    assert stage1["run"]["seconds"] == pytest.approx(
        STEPS * stage1["communication"]["step_seconds"], rel=1e-12)
    assert stage1["run"]["seconds"] > stage0["run"]["seconds"]
    # Every key that was there stays as it was.
    without = estimate_json(capsys, *ESTIMATE)
    assert {k: v for k, v in result.items() if k not in ("run", "stages")} == {
        k: v for k, v in without.items() if k != "stages"}
    assert [{k: v for k, v in row.items() if k != "run"} for row in result["stages"]] == without["stages"]


def test_estimate_table_says_the_run_and_its_assumptions(capsys):
    status, out, err = run(capsys, "estimate", *ESTIMATE, "--tokens", "2T")
    assert status == 0 and err == ""
    assert "Run of 2,000,000,000,000 tokens: 7,629,395 steps of 262,144 tokens" in out
    # 7,629,395 x 0.434644 s = 3,316,069 s = 38.4 days; x 64 / 3,600 = 58,952 GPU-hours.
    assert "Plain data parallelism: 38.4 days, 58,952 GPU-hours" in out
    assert "engine paper" in out and "mfu 0.4" in out
    assert "no failures, restarts, evaluation or checkpointing" in out


def test_estimate_with_a_model_counts_tokens_per_gpu_times_gpus(capsys):
    result = estimate_json(capsys, "--model", "llama-2-7b", "--gpus", "8", "--seq", "2048",
                           "--micro-batch", "2", "--device", "h100-80gb", "--link", "dgx-h100",
                           "--tokens", "1B", "--stage", "3")
    # 2,048 x 2 tokens per GPU x 8 GPUs = 32,768 per step; 10^9 / 32,768 = 30,517.58: 30,518.
    assert result["run"]["tokens_per_step"] == 32_768 and result["run"]["steps"] == 30_518


def test_estimate_csv_appends_the_run(capsys):
    status, out, _ = run(capsys, "estimate", *ESTIMATE, "--tokens", "2T", "--format", "csv")
    assert status == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    header = out.splitlines()[0].split(",")
    assert header[-5:-3] == ["run_seconds", "gpu_hours"]    # then what model state leaves out
    assert float(rows[0]["run_seconds"]) == pytest.approx(STEPS * STEP0, rel=1e-12)
    status, plain, _ = run(capsys, "estimate", *ESTIMATE, "--format", "csv")
    assert plain.splitlines()[0] == ",".join(header[:-5] + header[-3:])


@pytest.mark.parametrize("argv, message", [
    (("--params", "7B", "--gpus", "64", "--tokens", "2T"),
     "--tokens needs --link and --device (the run takes its steps x the step time, "
     "which needs both)"),
    (("--params", "7B", "--gpus", "64", "--link", "dgx-h100", "--tokens", "2T"),
     "--tokens needs --link and --device (the run takes its steps x the step time, "
     "which needs both)"),
    ((*ESTIMATE, "--tokens", "2.5"), "--tokens must be a whole number, got '2.5'"),
    ((*ESTIMATE, "--tokens", "0"), "--tokens must be a positive whole number, got '0'"),
    ((*ESTIMATE, "--tokens", "many"), "--tokens must be a token count like 2e12, 2T or "
                                      "2,000,000,000,000, got 'many'"),
])
def test_estimate_bad_tokens_is_one_line(capsys, argv, message):
    status, out, err = run(capsys, "estimate", *argv)
    assert status == 2 and out == ""
    assert err.strip().splitlines() == [f"zerolib estimate: error: {message}"]


def test_plan_json_by_hand(capsys):
    status, out, _ = run(capsys, *PLAN, "--tokens", "2T", "--format", "json")
    assert status == 0
    result = json.loads(out)
    # 1,024 sequences x 4,096 tokens = 4,194,304 per step; 2e12 / 4,194,304 = 476,837.16.
    assert {k: result["run"][k] for k in ("tokens_per_step", "steps", "gpus")} == {
        "tokens_per_step": 4_194_304, "steps": 476_838, "gpus": 64}
    for row in result["fits"][:50]:
        assert row["run_seconds"] == pytest.approx(476_838 * row["step_seconds"], rel=1e-12)
        assert row["gpu_hours"] == pytest.approx(64 * row["run_seconds"] / 3600, rel=1e-12)
    status, without, _ = run(capsys, *PLAN, "--format", "json")
    plain = json.loads(without)
    assert [{k: v for k, v in r.items() if k not in ("run_seconds", "gpu_hours")}
            for r in result["fits"]] == plain["fits"]


def test_plan_table_and_csv(capsys):
    # At line rate, the setting the step time below was worked out for.
    status, out, _ = run(capsys, *PLAN, "--tokens", "2T", "--top", "3")
    assert status == 0
    # The fastest: 228.147 s a step x 476,838 steps = 1.0879e8 s = 1,259.1 days on 64 GPUs,
    # 1,934,039 GPU-hours.
    assert ("Run of 2,000,000,000,000 tokens: 476,838 steps of 4,194,304 tokens (global batch "
            "x sequence) on 64 GPUs; the fastest that fits takes 1,259.1 days, 1,934,039 "
            "GPU-hours") in out
    assert "no failures, restarts, evaluation or checkpointing" in out
    status, text, _ = run(capsys, *PLAN, "--tokens", "2T", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert float(rows[0]["run_seconds"]) == pytest.approx(476_838 * float(rows[0]["step_seconds"]))


def test_plan_bad_tokens_is_one_line(capsys):
    status, out, err = run(capsys, *PLAN, "--tokens", "1e30")
    assert status == 2 and out == ""
    assert err.strip().splitlines() == [
        "zerolib plan: error: --tokens must be at most 1,000,000,000,000,000,000, got '1e30'"]
