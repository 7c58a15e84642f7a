"""Issue 24, item 8: at the command line an error that names an API argument also names the
flag the user typed; the API's own message is unchanged."""
from __future__ import annotations

import pytest
from cli_support import run

import zerolib as zl
from zerolib.cli._flags import name_flags


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama-2-7b", "--gpus", "8", "--tensor-parallel", "3"],
     "gpus (8) must be a multiple of tensor_parallel (3) (tensor_parallel is --tensor-parallel)"),
    (["--params", "7B", "--gpus", "8", "--hpz", "--stage", "1"],
     "hpz_partition > 1 (ZeRO++ hpZ) needs ZeRO stage 3, got stage 1 (hpz_partition is --hpz)"),
    (["--params", "7B", "--gpus", "8", "--offload-params", "cpu", "--stage", "2"],
     "offload_params='cpu' needs ZeRO stage 3 (only stage 3 partitions parameters), got stage 2 "
     "(offload_params is --offload-params)"),
    (["--params", "7B", "--gpus", "8", "--shard-group", "3", "--stage", "1"],
     "shard_group must divide gpus (a shard group of G GPUs inside N data-parallel GPUs, N / G "
     "replicas), got shard_group 3 with gpus 8 (shard_group is --shard-group)"),
    (["--model", "llama-2-7b", "--gpus", "8", "--pipeline-parallel", "2", "--stage", "3"],
     "ZeRO stages 2 and 3 do not run with pipeline parallelism (DeepSpeed's PipelineEngine refuses "
     "them; Megatron-LM's distributed optimizer is stage 1): got tensor_parallel 1, "
     "pipeline_parallel 2, stage 3 (tensor_parallel is --tensor-parallel; pipeline_parallel is "
     "--pipeline-parallel)"),
])
def test_estimate_errors_name_the_flags(capsys, argv, message):
    status, out, err = run(capsys, "estimate", *argv)
    assert (status, out) == (2, "")
    assert err == f"zerolib estimate: error: {message}\n"


def test_a_flag_already_named_is_not_repeated(capsys):
    status, _, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--gpus-per-node",
                         "3", "--offload-optimizer", "cpu")
    assert status == 2 and err == ("zerolib estimate: error: gpus (8) must fill whole nodes of "
                                   "gpus_per_node (3); set gpus_per_node (--gpus-per-node)\n")


def test_the_api_message_keeps_naming_the_argument():
    with pytest.raises(ValueError) as caught:
        zl.estimate(7 * 10**9, 8, stages=[1], hpz=True)
    assert "--hpz" not in str(caught.value) and "hpz" in str(caught.value)


def test_names_without_a_flag_and_plain_words_are_left_alone():
    flags = {"tensor_parallel": "--tensor-parallel", "gpus": "--gpus"}
    assert name_flags("gpus must be 8; data_parallel is 2", flags) == \
        "gpus must be 8; data_parallel is 2"
    assert name_flags("tensor_parallel x tensor_parallel", flags) == \
        "tensor_parallel x tensor_parallel (tensor_parallel is --tensor-parallel)"
