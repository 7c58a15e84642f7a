"""The whole run, not only a step: how long training on N tokens takes, and its GPU-hours.

A run of ``tokens`` tokens at ``tokens_per_step`` tokens per step (the global batch x the
sequence length; ``estimate``: tokens per GPU x GPUs) takes

    steps = ceil(tokens / tokens_per_step),  seconds = steps x step seconds,
    GPU-hours = GPUs x seconds / 3,600,

with every step as long as the step model's (:mod:`zerolib.core.step.time`,
:mod:`zerolib.core.step.parallel`): its engine's collectives, its overlap rules and its
utilisation ``mfu`` hold for the whole run. Left out (:data:`RUN_LEFT_OUT`): failures and the
restarts after them, evaluation, checkpointing, warm-up and changes of batch size or sequence
length during the run, and the time before the first step. A published run's GPU-hours include
some of these, so the figure here is a lower bound of such a run at the same utilisation
(``tests/core/step/test_run_cost.py`` holds it against Llama 3 405B's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from zerolib.core.defaults import ENGINE_NAMES, MAX_RUN_TOKENS
from zerolib.core.inputs import check_gpus, check_single, echo
from zerolib.core.intmath import ceil_div
from zerolib.core.parse import parse_whole

SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86400
RUN_LEFT_OUT = "no failures, restarts, evaluation or checkpointing"
ENGINES = ENGINE_NAMES
TOKENS_EXAMPLE = "a token count like 2e12, 2T or 2,000,000,000,000"


@dataclass(frozen=True)
class RunCost:
    """A training run of ``tokens`` tokens: its ``steps``, wall-clock ``seconds`` and
    ``gpu_hours`` (floats, or float64 arrays broadcast like the step seconds given)."""

    tokens: int
    tokens_per_step: int
    gpus: int
    steps: int
    seconds: float | np.ndarray
    gpu_hours: float | np.ndarray

    @property
    def days(self) -> float | np.ndarray:
        return self.seconds / SECONDS_PER_DAY

    def as_dict(self) -> dict:
        """JSON-ready: the run's ``tokens``, ``tokens_per_step``, ``gpus``, ``steps``,
        ``seconds`` and ``gpu_hours`` (a list where they are arrays)."""
        def plain(value):
            return value.tolist() if isinstance(value, np.ndarray) else value
        return {"tokens": self.tokens, "tokens_per_step": self.tokens_per_step,
                "gpus": self.gpus, "steps": self.steps, "seconds": plain(self.seconds),
                "gpu_hours": plain(self.gpu_hours)}


def check_tokens(value, name: str = "tokens") -> int:
    """A run's token count, from a number or text (``2e12``, ``2T``, ``2,000,000,000,000``):
    1 to :data:`MAX_RUN_TOKENS`."""
    return parse_whole(value, name, maximum=MAX_RUN_TOKENS, example=TOKENS_EXAMPLE)


def _step_seconds(value) -> np.ndarray:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"step_seconds must be a positive number of seconds, got {echo(value)}")
    try:
        seconds = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"step_seconds must be a positive number of seconds, got "
                        f"{echo(value)}") from None
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
        raise ValueError(f"step_seconds must be positive and finite, got {echo(value)}")
    return seconds


def run_cost(tokens, tokens_per_step, step_seconds, gpus) -> RunCost:
    """The run of ``tokens`` tokens at ``tokens_per_step`` per step, each step taking
    ``step_seconds`` (a number or an array of them, one per configuration) on ``gpus`` GPUs:
    steps, wall-clock seconds and GPU-hours (see the module doc)."""
    tokens = check_tokens(tokens)
    per_step = parse_whole(tokens_per_step, "tokens_per_step", maximum=MAX_RUN_TOKENS)
    gpus = check_single(gpus, check_gpus, "gpus")
    seconds = _step_seconds(step_seconds)
    steps = ceil_div(tokens, per_step)
    wall = steps * seconds
    hours = gpus * wall / SECONDS_PER_HOUR
    if seconds.ndim == 0:
        wall, hours = float(wall), float(hours)
    if not np.all(np.isfinite(hours)):
        raise ValueError("the run's GPU-hours overflow a float: fewer tokens or shorter steps")
    return RunCost(tokens, per_step, gpus, steps, wall, hours)


def run_assumptions(mfu: float, engine: str = "paper") -> tuple[str, ...]:
    """What a run's time assumes, in words: the step model's engine and its overlap rules, the
    utilisation, and what is left out. ``engine`` names the step's convention (one of
    :data:`ENGINES`; "paper" is the ZeRO paper's schedule, the step model's own)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {echo(engine)}")
    if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not math.isfinite(mfu):
        raise TypeError(f"mfu must be a number above 0 and at most 1, got {echo(mfu)}")
    return (f"every step as the step model times it: engine {engine}, its collectives "
            f"overlapping compute as zerolib.core.step.time states (stages 1-2's after-step "
            f"all-gather overlaps nothing)",
            f"compute at mfu {mfu:g} of the device's peak on the FLOPs executed",
            RUN_LEFT_OUT)


def duration_text(seconds: float) -> str:
    """Seconds in words a reader plans with: ``'3.2 days'``, ``'5.0 hours'``, ``'40 s'``."""
    if seconds >= 2 * SECONDS_PER_DAY:
        return f"{seconds / SECONDS_PER_DAY:,.1f} days"
    if seconds >= 2 * SECONDS_PER_HOUR:
        return f"{seconds / SECONDS_PER_HOUR:,.1f} hours"
    if seconds >= 120:
        return f"{seconds / 60:,.1f} minutes"
    return f"{seconds:,.1f} s"
