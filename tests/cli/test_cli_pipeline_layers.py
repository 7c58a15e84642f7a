"""``--pipeline-layers FIRST,LAST`` on estimate and plan: uneven pipeline stages as Megatron-LM's
``--decoder-first/last-pipeline-num-layers`` give them, refused in one line where they do not
split the layers. Hand counts: tests/core/memory/test_uneven_pipeline_stages.py (Llama 3.1
405B at t 8 over 16 stages as 7, 8 x 14, 7: 3,187,933,184 parameters on a middle stage's GPU)."""
import json

from cli_support import run

ESTIMATE = ("estimate", "--model", "llama-3.1-405b", "--gpus", "1024", "--tensor-parallel", "8",
            "--pipeline-parallel", "16", "--device", "h100-80gb", "--engine", "megatron",
            "--stage", "1")
PLAN = ("plan", "--model", "llama-3.1-405b", "--gpus", "1024", "--gpus-per-node", "8",
        "--device", "h100-80gb", "--seq", "8192", "--global-batch", "256", "--engine", "megatron",
        "--recompute", "full", "--max-micro-batch", "1", "--context-parallel", "1")


def test_estimate_takes_the_split_and_names_the_busiest_stage(capsys):
    status, out, _ = run(capsys, *ESTIMATE, "--pipeline-layers", "7,7", "--format", "json")
    assert status == 0
    (row,) = json.loads(out)["stages"]
    # 8 layers of 398,491,648 parameters on a middle stage, 2 bytes each
    assert (row["pipeline_stage"], row["parameters"]) == (1, 2 * 3_187_933_184)
    status, out, _ = run(capsys, *ESTIMATE, "--pipeline-layers", "7,7")
    assert "first and last stages 7 and 7 layers; most loaded: stage 1" in out


def test_estimate_refuses_a_split_in_one_line(capsys):
    status, _, err = run(capsys, *ESTIMATE, "--pipeline-layers", "8,8")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "--pipeline-layers 8,8 does not split llama-3.1-405b's 126 layers over 16 stages" in err
    for bad in ("7", "7,x", "0,7", "7,7,7"):
        status, _, err = run(capsys, *ESTIMATE, "--pipeline-layers", bad)
        assert status == 2 and "--pipeline-layers" in err and len(err.strip().splitlines()) == 1


def test_plan_searches_the_named_split_where_it_divides(capsys):
    status, out, _ = run(capsys, *PLAN, "--pipeline-layers", "7,7", "--format", "json")
    assert status == 0
    rows = json.loads(out)["fits"]
    # (126 - 14) / (p - 2) whole for p = 4 (56 a middle stage) and p = 16 (8) among the plan's p
    assert {(r["pipeline_parallel"], r["first_layers"]) for r in rows if r["first_layers"]} <= {
        (4, 7), (16, 7)}
    status, out, _ = run(capsys, *PLAN, "--pipeline-layers", "even", "--format", "json")
    assert "first_layers" not in json.loads(out)["fits"][0]


def test_plan_shows_the_split_by_default(capsys):
    status, out, _ = run(capsys, *PLAN, "--top", "2", "--wide")
    assert status == 0 and "stages FIRST,LAST" in out
    # the fastest fitting at bf16 with Megatron-LM's fp32 gradients: p 8 of (126 + 2) / 8 = 16
    # layers, one fewer on the first and last stage: 15, 16 x 6, 15
    assert " 15,15 " in out


def test_plan_of_a_launch_line_searches_its_split(capsys):
    line = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --max-position-embeddings "
            "4096 --vocab-size 32000 --swiglu --normalization RMSNorm --position-embedding-type rope "
            "--disable-bias-linear --untie-embeddings-and-output-weights --pipeline-model-parallel-size 4 "
            "--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6 "
            "--micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16")
    status, out, _ = run(capsys, "plan", "--megatron-args", line, "--gpus", "16", "--gpus-per-node", "8",
                         "--device", "h100-80gb", "--format", "json")
    assert status == 0
    rows = json.loads(out)["fits"]
    # (32 - 12) / (p - 2) whole at p = 3, 4, 6, 7, 12 and 22; of them only 4 divides 16
    assert {(r["pipeline_parallel"], r["first_layers"], r["last_layers"]) for r in rows
            if r["first_layers"]} == {(4, 6, 6)}
