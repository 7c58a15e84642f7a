"""Inputs are checked once, at the door: one move of a planner explorer control re-plans the
whole space, and the calls beneath the door (the planner, the memory room, the catalogues)
trust what plan_settings checked. Counted with sys.setprofile, as the issue counted them
(4,437 calls into zerolib, 1,836 of them checks and 124 model look-ups for one move before).

A check is a function of zerolib.core.inputs or one named check_* / _check_*; a look-up is a
call of get_model. A check is charged to the step room when a frame of zerolib.core.step is on
the stack: the planner hands parallel_step_time settings its own door checked, and the step's
traffic, rings and host copies are built from them without checking again."""
from __future__ import annotations

import sys
from collections import Counter

import pytest

from zerolib.chapter.explorers.planner import PlannerExplorer
from zerolib.core.units import GiB

CHECKS = 100        # per move, the target
LOOK_UPS = 5

# One move of every control the plan depends on, each to a value not seen before.
MOVES = (("gpus", 128), ("seq_len", 8192), ("model", "llama-2-13b"), ("global_batch", 512),
         ("mfu", 0.45), ("gpus_per_node", 4), ("links", "dgx-h100"), ("device", "h100-80gb"),
         ("host_memory", 2 * 1024 * GiB), ("host_link", "pcie5-x16"),
         ("shard_groups", "whole"), ("engine", "fsdp2"), ("context_parallel", 8), ("unit", "GiB"))
# A mixture of experts under Megatron-LM (which runs context parallelism): its expert-parallel
# degrees, and the context-parallel ones beside them (C = 1, 2, 4, 8 times every E dividing its
# 8 experts; each C once timed, not once checked).
MOE_MOVES = (("context_parallel", 8), ("expert_parallel", "none"), ("context_parallel", 4),
             ("expert_parallel", "all"))
ALL_MOVES = ([("dense", control) for control, _ in MOVES]
             + [("moe", f"{control}={value}") for control, value in MOE_MOVES])


def _is_check(frame) -> bool:
    name = frame.f_code.co_name
    return (frame.f_globals.get("__name__") == "zerolib.core.inputs"
            or name.startswith(("check_", "_check_")))


def _in_step(frame) -> bool:
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("zerolib.core.step"):
            return True
        frame = frame.f_back
    return False


def count_move(explorer, control: str, value) -> Counter:
    counts = Counter()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_globals.get("__name__", "").startswith("zerolib"):
            return
        counts["calls"] += 1
        if frame.f_code.co_name == "get_model":
            counts["look_ups"] += 1
        if _is_check(frame):
            counts["checks"] += 1
            counts["step_checks" if _in_step(frame) else "door_checks"] += 1

    sys.setprofile(profile)
    try:
        explorer.controls[control].value = value
    finally:
        sys.setprofile(None)
    assert explorer.status.value == "", explorer.status.value
    return counts


@pytest.fixture(scope="module")
def moves():
    explorer = PlannerExplorer()
    counts = {("dense", control): count_move(explorer, control, value) for control, value in MOVES}
    moe = PlannerExplorer(model="mixtral-8x7b", engine="megatron")   # it runs ring attention
    counts.update({("moe", f"{control}={value}"): count_move(moe, control, value)
                   for control, value in MOE_MOVES})
    return counts


@pytest.mark.parametrize("control", ALL_MOVES, ids="-".join)
def test_a_move_looks_the_model_up_at_most_five_times(moves, control):
    assert moves[control]["look_ups"] <= LOOK_UPS, moves[control]


@pytest.mark.parametrize("control", ALL_MOVES, ids="-".join)
def test_beneath_the_door_nothing_is_checked_again(moves, control):
    # Everything but the step room: the explorer, the planner's door, memory, catalogues.
    assert moves[control]["door_checks"] <= CHECKS, moves[control]


@pytest.mark.parametrize("control", ALL_MOVES, ids="-".join)
def test_a_move_checks_at_most_a_hundred_times_in_all(moves, control):
    # The whole path, the step room included (before: 297 to 1,769 checks in the step room alone).
    assert moves[control]["checks"] <= CHECKS, moves[control]
