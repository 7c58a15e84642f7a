"""The page's answers are the command line's: for a few settings, what ``zerolib app`` shows is
compared with ``zerolib estimate --format json`` (the model state of the exact count, and the
peak of the model), ``zerolib plan --format json`` and ``--format csv``, each run here as a user
would type it. The run's cost is worked out by hand from the plan's own step time."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_support import run

from zerolib.app.answers import answers, plan_csv, plan_html, run_html, state_html
from zerolib.app.settings import Settings, compact_config

DATA = Path(__file__).resolve().parents[1] / "data"
MISTRAL = DATA / "mistral-7b-v0.3.json"


def _json(capsys, *argv) -> dict:
    status, out, err = run(capsys, *argv, "--format", "json")
    assert status == 0 and err == "", err
    return json.loads(out)


def _model_flags(settings: Settings, path: Path | None) -> list[str]:
    return ["--config", str(path)] if path else ["--model", settings.model]


# (settings, the config file the CLI reads for an uploaded model or None, its parameter count as
# the model card / config states it: Llama-2-7B 6,738,415,616; Mistral-7B-v0.3 7,248,023,552)
CASES = {
    "preset on 64 H100": (Settings(), None, 6_738_415_616),
    "own config on 16 A100, other run": (
        Settings(config=compact_config(json.loads(MISTRAL.read_text())),
                 config_name="mistral-7b-v0.3", device="a100-80gb", gpus=16, seq_len=2048,
                 global_batch=512, micro_batch=2, layout="bf16-fp32-grads", tokens=10**11),
        MISTRAL, 7_248_023_552),
    "preset, links named": (Settings(model="llama-2-13b", gpus=32, links="dgx-a100",
                                     device="a100-80gb", tokens=3 * 10**11), None, None),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    settings, path, _ = CASES[request.param]
    return request.param, settings, path, answers(settings)


def _plan_flags(settings: Settings, path) -> list[str]:
    flags = ["plan", *_model_flags(settings, path), "--gpus", str(settings.gpus),
             "--gpus-per-node", str(settings.gpus_per_node), "--device", settings.device,
             "--seq", str(settings.seq_len), "--global-batch", str(settings.global_batch),
             "--layout", settings.layout]
    return flags + (["--links", settings.links] if settings.links else [])


def test_nothing_is_refused(case):
    assert case[3].errors == {}


def test_model_state_is_estimate_of_the_exact_count(case, capsys):
    name, settings, path, a = case
    expected_params = CASES[name][2]
    if expected_params is not None:
        assert a.state.params == expected_params
    cli = _json(capsys, "estimate", "--params", str(a.state.params), "--gpus", str(settings.gpus),
                "--device", settings.device, "--layout", settings.layout)
    # The page answers the peak beside it; the command says what a model-state answer leaves out.
    left_out = {key: cli.pop(key) for key in ("leaves_out", "working_set_needs")}
    assert left_out["working_set_needs"] == "--model NAME or --config FILE"
    assert json.loads(json.dumps(a.state.as_dict())) == cli
    html = state_html(a)
    assert html.count("does not fit") == sum(not row["fits"] for row in cli["stages"])


def test_peak_is_estimate_of_the_model(case, capsys):
    _, settings, path, a = case
    cli = _json(capsys, "estimate", *_model_flags(settings, path), "--gpus", str(settings.gpus),
                "--device", settings.device, "--layout", settings.layout,
                "--seq", str(settings.seq_len), "--micro-batch", str(settings.micro_batch))
    assert json.loads(json.dumps(a.peak.as_dict())) == cli


def test_plan_is_zerolib_plan(case, capsys):
    _, settings, path, a = case
    cli = _json(capsys, *_plan_flags(settings, path))
    assert a.plan.counts() == cli["counts"]
    page_rows = a.plan.fits.head(10).to_dict("records")
    for mine, theirs in zip(page_rows, cli["fits"][:10]):
        for key in ("rank", "tensor_parallel", "pipeline_parallel", "data_parallel", "stage",
                    "shard_group", "micro_batch", "peak_bytes", "step_seconds"):
            assert mine[key] == theirs[key], key
    html = plan_html(a)
    assert f"<b>{cli['counts']['fit']:,} fit</b>" in html
    assert f"{cli['counts']['configurations']:,} configurations" in html


def test_the_csv_download_is_zerolib_plan_csv(case, capsys):
    _, settings, path, a = case
    status, out, err = run(capsys, *_plan_flags(settings, path), "--format", "csv", "--top", "100")
    assert status == 0 and err == ""
    assert plan_csv(a.plan) == out.rstrip("\n")


def test_the_run_at_the_fastest_step_worked_by_hand(case, capsys):
    _, settings, path, a = case
    best = _json(capsys, *_plan_flags(settings, path))["fits"][0]
    tokens_per_step = settings.global_batch * settings.seq_len
    steps = -(-settings.tokens // tokens_per_step)          # whole steps: the last one partial
    assert a.run.steps == steps and a.run.tokens_per_step == tokens_per_step
    assert a.run.seconds == pytest.approx(steps * best["step_seconds"], rel=1e-12)
    assert a.run.gpu_hours == pytest.approx(settings.gpus * steps * best["step_seconds"] / 3600,
                                            rel=1e-12)
    assert f"{steps:,} steps" in run_html(a)


def test_default_run_by_hand():
    """2T tokens at 1,024 x 4,096 = 4,194,304 tokens per step: 476,837.16 steps, so 476,838."""
    a = answers(Settings())
    assert a.run.steps == 476_838
    assert math.isclose(a.run.gpu_hours, 64 * 476_838 * float(a.plan.fits.iloc[0]["step_seconds"]) / 3600)
