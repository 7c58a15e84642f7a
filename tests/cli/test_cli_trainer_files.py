"""``--megatron-args`` (a whole launch line) and ``--deepspeed ds_config.json`` on estimate and
plan: the file's settings stand in for the flags, a flag beside the file wins, and what cannot be
read is one line naming the file and the key (exit 2)."""
from __future__ import annotations

import json

from cli_support import estimate_json, run

LINE = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --max-position-embeddings 4096 "
        "--vocab-size 32000 --swiglu --normalization RMSNorm --position-embedding-type rope "
        "--disable-bias-linear --untie-embeddings-and-output-weights --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --sequence-parallel --micro-batch-size 1 "
        "--global-batch-size 64 --seq-length 4096 --bf16 --use-distributed-optimizer "
        "--recompute-activations")
DS = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
      "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto",
                            "offload_optimizer": {"device": "cpu", "pin_memory": True}}}


def _ds(tmp_path, config=DS):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    return str(path)


def _run_of(out: dict) -> dict:
    return out["run"] if "run" in out else out


def test_a_launch_line_is_estimated_as_the_run_it_describes(capsys, tmp_path):
    saved = tmp_path / "run.toml"
    estimate_json(capsys, "--megatron-args", LINE, "--gpus", "32", "--device", "h100-80gb",
                  "--save-run", str(saved))
    text = saved.read_text()
    for line in ('engine = "megatron"', "stages = [1]", 'recompute = "selective"', "dropout = true",
                 "tensor = 2", "pipeline = 2", "sequence = true", "seq_len = 4096",
                 "micro_batches = 8", "global_batch = 64"):
        assert line in text, line


def test_a_flag_beside_the_launch_line_wins(capsys, tmp_path):
    saved = tmp_path / "run.toml"
    estimate_json(capsys, "--megatron-args", LINE, "--gpus", "32", "--recompute", "full",
                  "--save-run", str(saved))
    assert 'recompute = "full"' in saved.read_text()


def test_a_launch_line_needs_the_gpus_and_refuses_what_is_not_modelled(capsys):
    status, out, err = run(capsys, "estimate", "--megatron-args", LINE)
    assert status == 2 and "--megatron-args needs --gpus" in err
    status, out, err = run(capsys, "estimate", "--megatron-args", LINE + " --fp8-format hybrid",
                           "--gpus", "32")
    assert status == 2 and out == "" and len(err.splitlines()) == 1
    assert "--fp8-format hybrid: Float8 training" in err and "not modelled yet" in err
    # the model alone is still read
    status, out, err = run(capsys, "models", "--megatron-args", LINE + " --fp8-format hybrid")
    assert status == 0 and err == ""


def test_a_deepspeed_config_is_estimated_as_the_run_it_describes(capsys, tmp_path):
    saved = tmp_path / "run.toml"
    estimate_json(capsys, "--model", "llama-2-7b", "--deepspeed", _ds(tmp_path), "--device", "a100-80gb",
                  "--save-run", str(saved))
    text = saved.read_text()
    # 64 / (2 x 4) = 8 GPUs (the default: not written); hidden 4096: reduce bucket 4096^2, prefetch int(0.9 x 4096^2)
    for line in ("micro_batches = 4", "stages = [3]", 'offload_optimizer = "cpu"',
                 "micro_batch = 2", "reduce_bucket_size = 16777216", "prefetch_bucket_size = 15099494"):
        assert line in text, line


def test_deepspeed_auto_batch_needs_its_flag(capsys, tmp_path):
    config = {**DS, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}
    status, out, err = run(capsys, "estimate", "--model", "llama-2-7b", "--deepspeed", _ds(tmp_path, config),
                           "--gpus", "8")
    assert status == 2 and len(err.splitlines()) == 1
    assert 'train_micro_batch_size_per_gpu is "auto": Hugging Face Trainer fills it at launch from ' \
           "per_device_train_batch_size (--micro-batch)" in err
    saved = tmp_path / "run.toml"
    estimate_json(capsys, "--model", "llama-2-7b", "--deepspeed", _ds(tmp_path, config), "--gpus", "8",
                  "--micro-batch", "3", "--save-run", str(saved))
    assert "micro_batch = 3" in saved.read_text()


def test_deepspeed_needs_a_model_and_refuses_two_trainers(capsys, tmp_path):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--deepspeed", _ds(tmp_path), "--gpus", "8")
    assert status == 2 and "reduce_bucket_size is \"auto\"" in err     # no hidden size to fill it from
    status, out, err = run(capsys, "estimate", "--megatron-args", LINE, "--deepspeed", _ds(tmp_path),
                           "--gpus", "32")
    assert status == 2 and "--megatron-args and --deepspeed describe two trainers" in err


def test_plan_keeps_the_files_settings_and_searches_the_rest(capsys, tmp_path):
    status, out, err = run(capsys, "plan", "--megatron-args", LINE, "--gpus", "32", "--device", "h100-80gb",
                           "--gpus-per-node", "8", "--format", "json")
    assert status == 0 and err == "", err
    plan = json.loads(out)
    rows = plan["fits"]
    assert rows and {row["stage"] for row in rows} == {1}
    assert {row["recompute"] for row in rows} == {"selective"}
    assert {row["tensor_parallel"] for row in rows} != {2} or len(rows) > 1   # t and p searched
    status, out, err = run(capsys, "plan", "--model", "llama-2-7b", "--deepspeed", _ds(tmp_path),
                           "--device", "a100-80gb", "--gpus-per-node", "8", "--seq", "4096",
                           "--host-memory", "1TiB", "--format", "json")
    assert status == 0 and err == "", err
    rows = json.loads(out)["fits"]
    assert rows and {row["stage"] for row in rows} == {3}
    assert {row["offload"] for row in rows} == {"optimizer"}


def test_a_launch_line_with_uneven_stages_is_carried(capsys):
    # 32 layers over 2 stages, 14 on the first: the last (a middle stage's rule at p = 2) 18
    out = estimate_json(capsys, "--megatron-args", LINE + " --decoder-first-pipeline-num-layers 14",
                        "--gpus", "32")
    assert out["working_set_settings"]["pipeline_layers"] == [14, 18]
    # By hand, the last stage against the first (t 2, d 8, ZeRO-1 at bf16 with Megatron-LM's fp32
    # gradient buffer: 2 + 4 + 12 / 8 = 7.5 bytes a parameter): 4 more layers of 101,189,632
    # parameters a GPU (4 x 4,096^2 + 3 x 4,096 x 11,008 + 2 x 4,096, halved by t) hold
    # 3.036 GB more, and its logits (6 bytes x 4,096 tokens x 16,000) 0.393 GB; 1F1B keeps 2
    # micro-batches of 14 layers on the first stage against 1 of 18 on the last, 10 more layer
    # copies of 4,096 x 4,096 x 34 / 2 bytes (Korthikanti's selective, SP): 2.852 GB. The last
    # stage is the busier by about 0.58 GB.
    assert {row["pipeline_stage"] for row in out["stages"]} == {1}
