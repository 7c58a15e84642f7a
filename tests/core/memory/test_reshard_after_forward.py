"""FSDP2's reshard_after_forward as a trainer field (trainer.reshard_after_forward). None: the
engine's default, fully_shard's True (torch 2.13 _fully_shard.py: None resolves to True) for
fsdp2 and torchtitan's ``not pp_enabled`` (torchtitan/distributed/fsdp.py
get_fsdp_reshard_after_forward_policy). False keeps each GPU's parameters unsharded from the
forward to the backward.

Worked by hand for Llama-2-7B, P = 6,738,415,616 parameters, on 8 GPUs, ZeRO stage 3, no
pipeline: the unsharded bf16 parameters are 2 x P = 13,476,831,232 bytes. fsdp2 (the chapter's
count) holds DeepSpeed's live-parameter window by default, 2 x 1e9 = 2,000,000,000 bytes;
torchtitan the root's modules (embedding 32,000 x 4,096, final norm 4,096, output 32,000 x
4,096: 262,148,096) and one layer (4 x 4,096^2 + 3 x 4,096 x 11,008 + 2 x 4,096 =
202,383,360), 2 x 464,531,456 = 929,062,912 bytes. False adds 11,476,831,232 and
12,547,768,320 bytes."""
import pytest

import zerolib as zl
from zerolib.core.run import Run

P = 6_738_415_616


def _row(engine, **fields):
    run = Run.of("llama-2-7b", 8, engine=engine, stages=(3,), micro_batch=1, seq_len=4096, **fields)
    (row,) = zl.estimate(run).stages
    return row


@pytest.mark.parametrize("engine,default_bytes", [("fsdp2", 2 * 10**9), ("torchtitan", 929_062_912)])
def test_false_keeps_the_parameters_unsharded_to_the_backward(engine, default_bytes):
    default, kept = _row(engine), _row(engine, reshard_after_forward=False)
    assert default["working_set"]["gathered_parameters"] == default_bytes
    assert _row(engine, reshard_after_forward=True) == default          # True is the default
    assert kept["working_set"]["gathered_parameters"] == 2 * P
    assert kept["peak"] - default["peak"] == 2 * P - default_bytes


def test_under_a_pipeline_torchtitan_keeps_them_whatever_it_says():
    # the pipeline's stage sets reshard_after_backward False (torch/distributed/pipelining/stage.py)
    piped = dict(pipeline_parallel=2, micro_batches=4)
    assert _row("torchtitan", reshard_after_forward=True, **piped) == _row("torchtitan", **piped)


@pytest.mark.parametrize("fields,message", [
    ({"engine": "deepspeed", "reshard_after_forward": False},
     "trainer.reshard_after_forward is FSDP2's fully_shard setting: it needs the engine fsdp2 or "
     "torchtitan, got 'deepspeed'"),
    ({"engine": "fsdp2", "reshard_after_forward": "no"}, "trainer.reshard_after_forward"),
])
def test_checked_at_the_door(fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Run.of("llama-2-7b", 8, **fields)


def test_a_run_file_and_the_flag_carry_it(capsys, tmp_path):
    from zerolib.cli import main
    from zerolib.core.run_file import run_from_toml
    run = run_from_toml('[model]\npreset = "llama-2-7b"\n[cluster]\ngpus = 8\n[trainer]\n'
                        'engine = "fsdp2"\nreshard_after_forward = false\n')
    assert run.trainer.reshard_after_forward is False
    status = main(["estimate", "--model", "llama-2-7b", "--gpus", "8", "--engine", "megatron",
                   "--reshard-after-forward", "false"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "fsdp2 or torchtitan" in err
