"""--deepspeed with bf16 and fp32 gradient accumulation at ZeRO stage 1: BF16_Optimizer's bytes
on the command line, worked by hand for Llama-2-7B (6,738,415,616 parameters) on 8 GPUs:
2 x P = 13,476,831,232 (bf16 parameters), 6 x P = 40,430,493,696 (bf16 gradients beside the
fp32 buffer), 12 x P / 8 = 10,107,623,424 (fp32 master and moments of the shard)."""
from __future__ import annotations

from cli_support import estimate_json

P = 6_738_415_616


def test_estimate_reads_bf16_optimizer_from_the_config(capsys):
    result = estimate_json(capsys, "--model", "llama-2-7b", "--deepspeed",
                           "tests/data/ds-config-bf16-zero1.json", "--gpus", "8")
    assert result["layout"] == {"name": "deepspeed-bf16-optimizer", "parameters": 2, "gradients": 6,
                                "optimizer": 12}
    (row,) = result["stages"]
    assert (row["stage"], row["parameters"], row["gradients"], row["optimizer"]) == (
        1, 2 * P, 6 * P, 12 * P // 8)
    assert row["working_set"]["reduce_bucket"] == 0


def test_plan_keeps_the_files_layout(capsys):
    from cli_support import run
    status, out, err = run(capsys, "plan", "--model", "llama-2-7b", "--deepspeed",
                           "tests/data/ds-config-bf16-zero1.json", "--gpus", "8", "--seq", "4096",
                           "--global-batch", "64", "--gpus-per-node", "8", "--device", "a100-80gb",
                           "--top", "1")
    assert status == 0, err
    assert "layout deepspeed-bf16-optimizer" in out
