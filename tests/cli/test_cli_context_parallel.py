"""``estimate --context-parallel``, ``plan --context-parallel`` under an engine without ring
attention, and ZeRO-R's ``--partition-activations`` /
``--cpu-checkpointing``: said in the JSON with what was assumed, carried to the working set, and
refused in one line where they would change nothing or cannot run."""
from __future__ import annotations

import csv
import io

import pytest
from cli_support import estimate_json, run

LLAMA = ("--model", "llama-2-70b", "--tensor-parallel", "8", "--seq", "32768", "--stage", "1")


def test_context_parallel_is_stated_and_divides_the_activations(capsys):
    one = estimate_json(capsys, *LLAMA, "--gpus", "64")
    four = estimate_json(capsys, *LLAMA, "--gpus", "64", "--context-parallel", "4")
    assert one["working_set_settings"]["context_parallel"] == 1 and "context_parallel" not in one
    cp = four["context_parallel"]
    # 64 GPUs = t 8 x C 4 x d 2; ZeRO over d x C = 8, as over the d = 8 of t = 8 without CP.
    assert (cp["degree"], cp["tokens_per_sequence_per_gpu"], cp["data_parallel"], cp["zero_group"]) == (
        4, 8192, 2, 8)
    assert cp["ring"] == {"gpus": 4, "stride": 8}
    # One K,V block: 8,192 tokens x one key/value head of 128 per rank x 2 (K, V) x 2 bytes.
    assert cp["kv_block_bytes"] == 4 * 2**20
    assert cp["ring_sends_per_step"] == 3 * 3 * 80
    assert any("tp-cp-ep-dp-pp" in line for line in cp["assumed"])
    a, b = one["stages"][0], four["stages"][0]
    assert b["working_set"]["activations"] * 4 == a["working_set"]["activations"]
    assert b["optimizer"] == a["optimizer"]          # the same ZeRO group of 8


def test_the_table_says_it(capsys):
    status, out, err = run(capsys, "estimate", *LLAMA, "--gpus", "64", "--context-parallel", "4")
    assert status == 0 and err == ""
    assert "context parallel 4 (8,192 tokens of each sequence per GPU, ZeRO over 8 GPUs)" in out


def test_partitioned_checkpoints_are_stated(capsys):
    common = ("--model", "llama-2-70b", "--tensor-parallel", "8", "--seq", "4096", "--gpus", "8",
              "--stage", "1", "--recompute", "full")
    plain = estimate_json(capsys, *common)
    pa = estimate_json(capsys, *common, "--partition-activations")
    cpu = estimate_json(capsys, *common, "--partition-activations", "--cpu-checkpointing")
    checkpoint = 2 * 4096 * 8192          # s h x 2 bytes
    assert pa["zero_r"]["checkpoint_bytes_per_layer"] == {"gpu": checkpoint // 8, "host": 0,
                                                          "gathered": checkpoint}
    assert pa["zero_r"]["all_gather_bytes_per_step"] == 80 * checkpoint
    assert cpu["zero_r"]["host_copy_bytes_per_step"] == {"to_host": 80 * checkpoint // 8,
                                                         "from_host": 80 * checkpoint // 8}
    drop = (plain["stages"][0]["working_set"]["activations"]
            - pa["stages"][0]["working_set"]["activations"])
    assert drop == 80 * (checkpoint - checkpoint // 8)
    assert "zero_r" not in plain


@pytest.mark.parametrize("argv, message", [
    (("--context-parallel", "3"), "seq_len (32768) must be a multiple of 2 x context_parallel"),
    (("--context-parallel", "4", "--no-flash"), "--context-parallel above 1 needs flash attention"),
    (("--context-parallel", "0"), "--context-parallel"),
    (("--partition-activations",), "--partition-activations needs --recompute full"),
    (("--cpu-checkpointing", "--recompute", "selective"), "--cpu-checkpointing needs --recompute full"),
    (("--partition-activations", "--recompute", "full", "--sequence-parallel"),
     "--partition-activations needs --tensor-parallel of 2 or more without --sequence-parallel"),
])
def test_refused_in_one_line(capsys, argv, message):
    status, out, err = run(capsys, "estimate", *LLAMA, "--gpus", "64", *argv)
    assert status == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_gpus_must_hold_whole_groups(capsys):
    status, out, err = run(capsys, "estimate", *LLAMA, "--gpus", "48", "--context-parallel", "4")
    assert status == 2
    assert "multiple of tensor_parallel x context_parallel x pipeline_parallel (8 x 4 x 1 = 32)" in err


def test_flags_need_a_model(capsys):
    status, out, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--context-parallel", "2")
    assert status == 2 and "--context-parallel needs --model" in err


PLAN = ("plan", "--model", "llama-2-7b", "--gpus", "16", "--gpus-per-node", "8", "--device",
        "h100-80gb", "--seq", "8192", "--global-batch", "16", "--max-micro-batch", "1",
        "--chunks", "1", "--offload", "none", "--flash")


@pytest.mark.parametrize("engine", [(), ("--engine", "deepspeed"), ("--engine", "paper")])
def test_plan_refuses_context_parallel_under_an_engine_without_it(capsys, engine):
    status, out, err = run(capsys, *PLAN, "--context-parallel", "1,2", *engine)
    assert status == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    name = engine[1] if engine else "deepspeed"    # DeepSpeed is the default engine
    assert (f"context_parallel must be (1,) for engine {name}: it runs no ring-attention context "
            f"parallelism (the engines that do: fsdp2, megatron, torchtitan)") in err


@pytest.mark.parametrize("engine", ["fsdp2", "megatron"])
def test_plan_searches_it_under_an_engine_with_it(capsys, engine):
    status, out, err = run(capsys, *PLAN, "--context-parallel", "1,2", "--engine", engine,
                           "--format", "csv")
    assert status == 0 and err == ""
    assert {row["context_parallel"] for row in csv.DictReader(io.StringIO(out))} == {"1", "2"}
