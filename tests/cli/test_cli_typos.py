"""A mistyped option or command is answered with the nearest one, in one line (exit 2), before
anything it caused: ``--parmas 7B`` used to be answered "one of the arguments --params --model
--config --megatron-args is required", ``--micro-bach`` with no suggestion at all."""
from __future__ import annotations

import pytest
from cli_support import run


@pytest.mark.parametrize("argv, says", [
    (("estimate", "--parmas", "7B", "--gpus", "8"),
     "zerolib estimate: error: unrecognized argument --parmas: did you mean --params?"),
    (("estimate", "--model", "llama-2-7b", "--gpus", "8", "--micro-bach", "2"),
     "zerolib estimate: error: unrecognized argument --micro-bach: did you mean --micro-batch?"),
    (("estimate", "--params", "7B", "--gpsu=8"),
     "zerolib estimate: error: unrecognized argument --gpsu: did you mean --gpus?"),
    (("plan", "--modle", "llama-2-7b", "--gpus", "8"),
     "zerolib plan: error: unrecognized argument --modle: did you mean --model?"),
    (("estimat", "--params", "7B"),
     "zerolib: error: 'estimat' is not a command: did you mean estimate?"),
])
def test_a_typo_is_answered_with_the_nearest_flag(capsys, argv, says):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(says), err
    assert "--help lists" in err


def test_a_word_near_nothing_is_named_without_a_guess(capsys):
    status, _, err = run(capsys, "estimate", "--params", "7B", "--gpus", "8", "--frobnicate")
    assert status == 2 and err == ("zerolib estimate: error: unrecognized argument --frobnicate "
                                   "(zerolib estimate --help lists its options)\n")


@pytest.mark.parametrize("argv", [
    ("estimate", "--param", "7B", "--gpus", "8"),               # an abbreviation argparse takes
    ("estimate", "--params", "7B", "--gpus", "8", "--unit=GiB"),
    ("models", "--megatron-args", "--num-layers 2 --hidden-size 64 --num-attention-heads 4 "
                                  "--max-position-embeddings 128 --vocab-size 1000"),   # a value
])
def test_options_abbreviations_and_values_are_not_typos(capsys, argv):
    status, _, err = run(capsys, *argv)
    assert status == 0, err
