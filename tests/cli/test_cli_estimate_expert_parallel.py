"""``zerolib estimate --expert-parallel``: the JSON names what it assumed; bad input is one line.

Mixtral-8x7B on 8 GPUs, E = 8, ZeRO-1: dense 1,605,636,096 parameters x (2 + 2) bytes whole +
12 bytes over 8 = 8,830,998,528 B; one expert per layer, 32 x 176,160,768 parameters, x 16 bytes
(EDP = 8 / 8 = 1) = 90,194,313,216 B; 99,025,311,744 B in all (see
tests/core/memory/test_expert_parallel_state.py for the count).
"""
from __future__ import annotations

import json

import pytest
from cli_support import run

from zerolib.core.estimate import estimate


def test_json_names_the_groups_and_the_traffic(capsys):
    code, out, err = run(capsys, "estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--stage", "1",
                         "--expert-parallel", "8", "--format", "json")
    assert (code, err) == (0, "")
    row = json.loads(out)["stages"][0]
    assert row["total"] == 99_025_311_744
    assert row["expert_parallel"]["expert_data_parallel"] == 1
    assert row["expert_parallel"]["dense_bytes"]["total"] == 8_830_998_528
    assert row["expert_traffic"]["all_to_all_calls"] == 4 * 32
    assert row["expert_traffic"]["routing"] == "uniform"


def test_peak_moves_by_the_model_state_difference():
    plain = estimate("mixtral-8x7b", 8, stages=(1,)).as_dict()["stages"][0]
    spread = estimate("mixtral-8x7b", 8, stages=(1,), expert_parallel=8).as_dict()["stages"][0]
    assert spread["working_set"] == plain["working_set"]
    assert spread["peak"] - plain["peak"] == spread["total"] - plain["total"] < 0


def test_table_says_what_was_assumed(capsys):
    code, out, _ = run(capsys, "estimate", "--model", "mixtral-8x7b", "--gpus", "16", "--stage", "1",
                       "--expert-parallel", "8")
    assert code == 0
    assert ("the dense part is sharded over d = 16, the routed experts over the "
            "expert-data-parallel group of 2") in out


@pytest.mark.parametrize("argv, words", [
    (("--model", "mixtral-8x7b", "--expert-parallel", "3"), "expert_parallel must divide the routed experts"),
    (("--params", "7B", "--expert-parallel", "2"), "--expert-parallel and --expert-tensor-parallel need --model"),
    (("--model", "llama-2-7b", "--expert-parallel", "2"), "need a mixture of experts"),
    (("--model", "mixtral-8x7b", "--expert-parallel", "2", "--link", "dgx-h100"),
     "a link with model parallelism (tensor, pipeline, context or expert) needs a device"),
    (("--model", "mixtral-8x7b", "--expert-parallel", "2", "--shard-group", "2"),
     "expert_parallel is not modelled with a placement here"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, words):
    code, out, err = run(capsys, "estimate", "--gpus", "8", *argv)
    assert code == 2 and out == ""
    assert words in err and len(err.strip().splitlines()) == 1


def test_capacity_factor_pads_the_all_to_alls(capsys):
    # 4,096 tokens, top-2, 8 experts, c = 1.5: ceil(1.5 x 2 x 4096 / 8) = 1,536 rows per expert,
    # 12,288 rows of 4096 x 2 B handed to each all-to-all; 3 of 4 ranks' shares leave the GPU
    code, out, _ = run(capsys, "estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--stage", "1",
                       "--expert-parallel", "4", "--capacity-factor", "1.5", "--format", "json")
    assert code == 0
    traffic = json.loads(out)["stages"][0]["expert_traffic"]
    assert traffic["routing"] == "capacity-padded" and traffic["capacity_factor"] == 1.5
    assert traffic["handed_bytes_per_all_to_all"] == 12_288 * 4096 * 2
    assert traffic["sent_bytes_per_all_to_all"] == 3 * 12_288 * 4096 * 2 // 4
