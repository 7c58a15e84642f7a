"""``zerolib estimate --expert-tensor-parallel`` with ``--link`` (timed) and ``zerolib plan``'s ETP
column (a mixture of experts only); bad input is one line and exit 2.

Mixtral-8x7B (hidden 4,096, top-2, 32 layers) on 16 GPUs, t = 1, E = 2, ETP = 2, one micro-batch
of 4,096 tokens: R = 8,192 rows of 4,096 x 2 B per all-to-all; per MoE layer 2 all-gathers and 2
reduce-scatters over the 2 ETP ranks, each sending 1 x 8,192 rows = 67,108,864 B: 128 calls,
8,589,934,592 B per step.
"""
from __future__ import annotations

import json

import pytest
from cli_support import run

ESTIMATE = ("estimate", "--model", "mixtral-8x7b", "--gpus", "16", "--stage", "1", "--device",
            "h100-80gb", "--link", "dgx-h100", "--expert-parallel", "2")
PLAN = ("plan", "--gpus", "16", "--gpus-per-node", "8", "--device", "h100-80gb", "--seq", "4096",
        "--global-batch", "16", "--stages", "1", "--recompute", "full", "--max-micro-batch", "1")


def test_estimate_times_etp_with_a_link(capsys):
    code, out, err = run(capsys, *ESTIMATE, "--expert-tensor-parallel", "2", "--format", "json")
    assert (code, err) == (0, "")
    row = json.loads(out)["stages"][0]
    assert row["expert_traffic"]["etp_calls"] == 128
    assert row["expert_traffic"]["etp_sent_bytes_per_step"] == 8_589_934_592
    assert row["expert_parallel"]["expert_data_parallel"] == 4
    assert row["parallel_step"]["expert_tensor_parallel"] == 2


def test_estimate_table_says_what_etp_sends(capsys):
    code, out, err = run(capsys, *ESTIMATE, "--expert-tensor-parallel", "2")
    assert (code, err) == (0, "")
    assert ("128 all-gathers and reduce-scatters over the 2 expert-tensor-parallel ranks send "
            "8,589,934,592") in out
    assert "(E = 2, ETP = 2)" in out


@pytest.mark.parametrize("args, message", [
    (("--expert-tensor-parallel", "3"), "expert_tensor_parallel must divide ffn_hidden"),
    (("--expert-tensor-parallel", "32"), "expert_tensor_parallel x expert_parallel must divide "
                                         "tensor_parallel x data_parallel"),
])
def test_estimate_refusals_one_line(capsys, args, message):
    code, out, err = run(capsys, *ESTIMATE, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_plan_shows_etp_for_a_mixture_of_experts_only(capsys):
    code, out, err = run(capsys, *PLAN, "--model", "mixtral-8x7b", "--engine", "megatron",
                         "--expert-parallel", "2", "--expert-tensor-parallel", "1,2",
                         "--context-parallel", "1")
    assert (code, err) == (0, "")
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert header.split()[:6] == ["rank", "t", "SP", "E", "ETP", "p"]
    code, out, err = run(capsys, *PLAN, "--model", "llama-2-7b", "--engine", "megatron")
    assert (code, err) == (0, "")
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert "ETP" not in header.split()


def test_plan_refuses_etp_where_the_engine_keeps_t(capsys):
    code, out, err = run(capsys, *PLAN, "--model", "mixtral-8x7b", "--engine", "deepspeed",
                         "--expert-tensor-parallel", "1")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "expert_tensor_parallel is searched under engine megatron only" in err
