"""Issue 24, item 7: a flag that would change nothing is refused in one line, naming it."""
from __future__ import annotations

import pytest
from cli_support import estimate_json, run

MODEL = ["estimate", "--model", "llama-2-7b", "--gpus", "8"]
PARAMS = ["estimate", "--params", "7B", "--gpus", "8"]
PLAN = ["plan", "--model", "llama-2-7b", "--gpus", "8", "--gpus-per-node", "8", "--device",
        "h100-80gb", "--seq", "4096", "--global-batch", "8"]


@pytest.mark.parametrize("argv, says", [
    (MODEL + ["--micro-batches", "4"], "--micro-batches needs --pipeline-parallel of 2 or more"),
    (MODEL + ["--pipeline-schedule", "1f1b"], "--pipeline-schedule needs --pipeline-parallel"),
    (MODEL + ["--pipeline-chunks", "1", "--micro-batches", "2"],
     "--pipeline-chunks, --micro-batches need --pipeline-parallel of 2 or more"),
    (MODEL + ["--sequence-parallel"], "--sequence-parallel needs --tensor-parallel of 2 or more"),
    (MODEL + ["--tensor-parallel", "1", "--sequence-parallel"], "--sequence-parallel needs"),
    (MODEL + ["--overlap-comm", "--stage", "3"], "--overlap-comm changes only ZeRO stage 1 or 2"),
    (MODEL + ["--ddp-bucket-view", "--stage", "1"], "--ddp-bucket-view changes only ZeRO stage 0"),
    (MODEL + ["--prefetch-bucket-size", "1e6", "--stage", "2"],
     "--prefetch-bucket-size changes only ZeRO stage 3"),
    (MODEL + ["--max-live-parameters", "1e6", "--stage", "0"],
     "--max-live-parameters changes only ZeRO stage 3"),
    (MODEL + ["--reduce-bucket-size", "1e6", "--stage", "0"],
     "--reduce-bucket-size changes only ZeRO stage 1, 2 or 3"),
    (PARAMS + ["--link", "dgx-h100", "--mfu", "0.5"], "--mfu needs --device"),
    (PARAMS + ["--link", "dgx-h100", "--tokens-per-gpu", "8192"], "--tokens-per-gpu needs --device"),
    (PARAMS + ["--shard-group", "4", "--host-memory", "1TB", "--stage", "1"],
     "--host-memory needs --offload-optimizer or --offload-params"),
    (PARAMS + ["--format", "json", "--unit", "GiB"], "--unit changes only the table; JSON is in bytes"),
    (PARAMS + ["--format", "csv", "--unit", "GB"], "--unit changes only the table; CSV is in bytes"),
    (PLAN + ["--offload", "none", "--host-link", "pcie5-x16"], "--host-link needs an offload"),
    (PLAN + ["--offload", "none", "--host-memory", "1TiB"], "--host-memory needs an offload"),
    (PLAN + ["--stages", "0", "--shard-groups", "whole"], "--shard-groups changes only ZeRO stages"),
    (PLAN + ["--format", "json", "--unit", "GiB"], "--unit changes only the table; JSON is in bytes"),
])
def test_flags_that_change_nothing_are_refused(capsys, argv, says):
    status, out, err = run(capsys, *argv)
    assert (status, out) == (2, "")
    assert err.startswith(f"zerolib {argv[0]}: error: {says}"), err
    assert len(err.splitlines()) == 1


def test_the_same_flags_where_they_do_something_are_accepted(capsys):
    result = estimate_json(capsys, *MODEL[1:], "--overlap-comm", "--stage", "1")
    # The second reduce bucket: 2 x 5e8 elements x 2 bytes.
    assert result["stages"][0]["working_set"]["reduce_bucket"] == 2 * 500_000_000 * 2
    estimate_json(capsys, *MODEL[1:], "--pipeline-parallel", "2", "--micro-batches", "4")
    estimate_json(capsys, *MODEL[1:], "--tensor-parallel", "2", "--sequence-parallel")
    status, out, err = run(capsys, *PARAMS, "--unit", "GiB")
    assert status == 0 and "[GiB]" in out
