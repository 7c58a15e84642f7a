"""plan_settings refuses context-parallel degrees above 1 for an engine that runs no ring
attention, naming the argument, the engine and the engines that run it."""
from __future__ import annotations

import pytest

from zerolib.core.plan_settings import plan_settings
from zerolib.core.step.engines import get_engine

ARGS = ("llama-2-7b", 16, 8, "h100-80gb", 8192, 16)
REFUSED = ("context_parallel must be (1,) for engine {}: it runs no ring-attention context "
           "parallelism (the engines that do: fsdp2, megatron, torchtitan)")


@pytest.mark.parametrize("engine", ["deepspeed", "paper"])
def test_engines_without_it_refuse_degrees_above_1(engine):
    with pytest.raises(ValueError) as error:
        plan_settings(*ARGS, context_parallel=(1, 2), engine=engine)
    assert str(error.value) == REFUSED.format(engine)
    # The default engine is DeepSpeed's.
    with pytest.raises(ValueError, match="for engine deepspeed"):
        plan_settings(*ARGS, context_parallel=(2,))


def test_deepspeed_under_other_flags_refuses_too():
    with pytest.raises(ValueError, match="for engine deepspeed"):
        plan_settings(*ARGS, context_parallel=(1, 4),
                      engine=get_engine("deepspeed").with_flags(overlap_comm=True))


@pytest.mark.parametrize("engine", ["deepspeed", "paper", "fsdp2", "megatron"])
def test_one_alone_is_every_engines(engine):
    assert plan_settings(*ARGS, context_parallel=(1,), engine=engine).context_parallel == (1,)


@pytest.mark.parametrize("engine", ["fsdp2", "megatron"])
def test_engines_with_it_take_the_degrees(engine):
    assert plan_settings(*ARGS, context_parallel=(1, 2, 4), engine=engine).context_parallel == (1, 2, 4)


def test_the_degrees_are_checked_before_the_engine():
    # A degree that cannot split the sequence is the degree's error, whatever the engine.
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel"):
        plan_settings(*ARGS, context_parallel=(3,))
