"""One step's memory, moment by moment, held to the terms worked out by hand.

Llama-2-7B (P = 6,738,415,616, 32 layers) on 8 GPUs, mixed-precision Adam: ceil(P / 8) =
842,301,952 elements per GPU's partition. Stage 1 keeps 2P + 2P + 12 x 842,301,952 =
26,953,662,464 + 10,107,623,424 = 37,061,285,888 bytes of model state; stage 3 keeps
16 x 842,301,952 = 13,476,831,232. The reserve is 2 GiB = 2,147,483,648 bytes; DeepSpeed's
reduce bucket 5 x 10^8 bf16 elements = 10^9 bytes; stage 3's gathered parameters 10^9 bf16
elements = 2 x 10^9 bytes.
"""
from __future__ import annotations

import pytest

import zerolib as zl
from zerolib.core.memory.step_memory import moments, step_memory_frame

SETTINGS = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective", flash_attention=True)
RESERVE = 2 * 2**30


@pytest.fixture(scope="module")
def frame():
    return step_memory_frame("llama-2-7b", 8, [0, 1, 2, 3], SETTINGS)


def totals(frame, stage):
    return frame[frame["stage"] == stage].groupby("moment")["bytes"].sum()


def test_the_moments_of_a_step():
    steps = moments(3)
    assert steps == [("forward", 1), ("forward", 2), ("forward", 3), ("loss", 0),
                     ("backward", 3), ("backward", 2), ("backward", 1), ("optimizer step", 0)]
    assert len(moments(32)) == 2 * 32 + 2


def test_the_optimizer_step_holds_the_state_and_the_buffers_that_stay(frame):
    # Stage 1: model state and reserve only (its reduce bucket lives in the backward).
    assert totals(frame, 1).iloc[-1] == 37_061_285_888 + RESERVE
    # Stage 3: model state, reserve and the reduce bucket DeepSpeed keeps.
    assert totals(frame, 3).iloc[-1] == 13_476_831_232 + RESERVE + 10**9


def test_the_activations_grow_a_layer_at_a_time_and_drain_back(frame):
    activations = frame[(frame["stage"] == 3) & (frame["component"] == "activations")]["bytes"].tolist()
    whole = activations[32]                        # at the loss: every layer's saved tensors
    assert whole == zl.peak("llama-2-7b", 8, 3, SETTINGS).working_set["activations"]
    assert activations[0] == whole // 32 and activations[31] == whole
    assert activations[33:65] == activations[31::-1]          # the backward mirrors the forward
    assert activations[-1] == 0


def test_the_highest_moment_is_the_peak_the_chapter_reports(frame):
    for stage in range(4):
        peak = zl.peak("llama-2-7b", 8, stage, SETTINGS)
        top = totals(frame, stage)
        assert top.max() == peak.total == frame.attrs["peaks"][stage]
        # as the backward begins: the loss's moment or the last layer's backward
        assert top.idxmax() in (32, 33)
    # Stage 3 by hand: state, reserve, bucket, gathered parameters, activations and logits.
    working = zl.peak("llama-2-7b", 8, 3, SETTINGS).working_set
    assert totals(frame, 3).max() == (13_476_831_232 + RESERVE + 10**9 + 2 * 10**9
                                      + working["activations"] + working["logits_loss"])


def test_a_staged_all_gather_waits_for_the_optimizer_step():
    staged = zl.WorkingSetSettings(seq_len=4096, micro_batch=1, recompute="selective", allgather_in_place=False)
    frame = step_memory_frame("llama-2-7b", 8, [1], staged)
    bucket = zl.peak("llama-2-7b", 8, 1, staged).working_set["allgather_bucket"]
    assert bucket == 10**9                                        # 5 x 10^8 bf16 elements
    top = totals(frame, 1)
    assert top.max() == frame.attrs["peaks"][1] - bucket          # the sum overstates by the bucket
    assert top.iloc[-1] == 37_061_285_888 + RESERVE + bucket


def test_an_engine_with_moments_of_its_own_is_named():
    with pytest.raises(ValueError, match="torchtitan"):
        step_memory_frame("llama-2-7b", 8, [3], zl.WorkingSetSettings(engine="torchtitan"))
