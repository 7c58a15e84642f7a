"""`zerolib plan --partition-activations` and `--cpu-checkpointing`."""
import json

from cli_support import run

ARGS = ("plan", "--model", "llama-2-7b", "--gpus", "16", "--gpus-per-node", "8", "--device",
        "a100-40gb", "--seq", "2048", "--global-batch", "64", "--max-micro-batch", "1",
        "--recompute", "full", "--offload", "none", "--sequence-parallel", "off")


def test_on_shows_the_column_and_every_row_with_t_above_one_uses_it(capsys):
    code, out, _ = run(capsys, *ARGS, "--partition-activations", "on", "--format", "json")
    assert code == 0
    result = json.loads(out)
    assert result["settings"]["zero_r"] == ["partition"]
    rows = result["fits"]
    assert rows and all(r["partition_activations"] == (r["tensor_parallel"] > 1) for r in rows)
    assert not any(r["cpu_checkpointing"] for r in rows)
    _, table, _ = run(capsys, *ARGS, "--partition-activations", "on", "--top", "200")
    assert " ZeRO-R " in table and " P_a " in table


def test_off_has_no_column_and_cpu_adds_p_a_cpu(capsys):
    _, out, _ = run(capsys, *ARGS, "--partition-activations", "off", "--format", "json")
    result = json.loads(out)
    assert "zero_r" not in result["settings"] and "partition_activations" not in result["fits"][0]
    _, out, _ = run(capsys, *ARGS, "--cpu-checkpointing", "--format", "json")
    result = json.loads(out)
    assert result["settings"]["zero_r"] == ["none", "partition", "partition+cpu"]
    assert any(r["cpu_checkpointing"] and r["partition_activations"] for r in result["fits"])


def test_refusals_are_one_line(capsys):
    code, _, err = run(capsys, *ARGS, "--partition-activations", "off", "--cpu-checkpointing")
    assert code == 2 and err.count("\n") == 1 and "--cpu-checkpointing needs" in err
    code, _, err = run(capsys, *ARGS, "--engine", "megatron", "--partition-activations", "on")
    assert code == 2 and err.count("\n") == 1 and "engine megatron" in err
