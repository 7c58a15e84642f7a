"""``--tokens N`` of ``zerolib estimate`` and ``zerolib plan``: the step time turned into the whole
run's wall-clock time and GPU-hours (:mod:`zerolib.core.step.run_cost`), with what it assumes.

Kept apart so that ``estimate.py`` and ``plan.py`` only gain a few calls.
"""
from __future__ import annotations

from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.step.run_cost import (
    TOKENS_EXAMPLE,
    check_tokens,
    duration_text,
    run_assumptions,
    run_cost,
)

HELP = (f"the whole run: {TOKENS_EXAMPLE} tokens to train on; adds the run's steps, wall-clock "
        "time and GPU-hours, and what they assume")


def add_argument(parser, help_text: str = HELP) -> None:
    parser.add_argument("--tokens", metavar="N", help=help_text)


def tokens_from(args) -> int | None:
    return None if args.tokens is None else check_tokens(args.tokens, "--tokens")


def _run_dict(cost, mfu: float, engine: str) -> dict:
    return {"tokens": cost.tokens, "tokens_per_step": cost.tokens_per_step, "gpus": cost.gpus,
            "steps": cost.steps, "engine": engine, "mfu": mfu,
            "assumptions": list(run_assumptions(mfu, engine))}


def add_to_estimate(result: dict, tokens: int) -> dict:
    """``estimate``'s JSON with the run: ``run`` (tokens, tokens per step = tokens per GPU x
    GPUs, GPUs, steps, engine, mfu, assumptions) and per stage ``run`` (``seconds``,
    ``gpu_hours``)."""
    compute = result["compute_settings"]
    per_step = compute["tokens_per_gpu"] * result["gpus"]
    rows, cost = [], None
    for row in result["stages"]:
        # the planner's step model times context and expert parallelism (parallel_step)
        timed = row["communication"] if "communication" in row else row["parallel_step"]
        cost = run_cost(tokens, per_step, timed["step_seconds"], result["gpus"])
        rows.append({**row, "run": {"seconds": cost.seconds, "gpu_hours": cost.gpu_hours}})
    return {**result, "stages": rows, "run": _run_dict(cost, compute["mfu"], result["engine"])}


def estimate_lines(result: dict) -> list[str]:
    """The table's lines for the run: steps, then per stage the time and GPU-hours, then the
    assumptions."""
    run = result["run"]
    lines = [f"Run of {run['tokens']:,} tokens: {run['steps']:,} steps of {run['tokens_per_step']:,} "
             f"tokens (tokens per GPU x {run['gpus']:,} GPUs)."]
    for row in result["stages"]:
        lines.append(f"  {STRATEGY_NAMES[row['stage']]}: {duration_text(row['run']['seconds'])}, "
                     f"{row['run']['gpu_hours']:,.0f} GPU-hours")
    lines.append("Assumes " + "; ".join(run["assumptions"]) + ".")
    return lines


def estimate_csv(result: dict) -> tuple[list[str], list[list]]:
    """The CSV columns the run adds (after every other): ``run_seconds``, ``gpu_hours``."""
    return (["run_seconds", "gpu_hours"],
            [[row["run"]["seconds"], row["run"]["gpu_hours"]] for row in result["stages"]])


def plan_cost(result, tokens: int):
    """The run of every fitting configuration of a plan: tokens per step = global batch x
    sequence length, on all of the plan's GPUs (a :class:`~zerolib.core.step.run_cost.RunCost`
    of arrays in the order of ``result.fits``), or None when nothing fits."""
    s = result.settings
    fits = result.fits
    if not len(fits):
        return None
    return run_cost(tokens, s.global_batch * s.seq_len, fits["step_seconds"].to_numpy(), s.gpus)


def add_to_plan(out: dict, result, tokens: int) -> dict:
    """``plan``'s JSON with the run: ``run`` (as estimate's) and per fitting configuration
    ``run_seconds`` and ``gpu_hours``."""
    s = result.settings
    engine = s.engine.name
    cost = plan_cost(result, tokens)
    if cost is None:
        cost = run_cost(tokens, s.global_batch * s.seq_len, 1.0, s.gpus)   # steps only
        return {**out, "run": _run_dict(cost, s.mfu, engine)}
    seconds, hours = cost.seconds.tolist(), cost.gpu_hours.tolist()
    fits = [{**row, "run_seconds": seconds[i], "gpu_hours": hours[i]}
            for i, row in enumerate(out["fits"])]
    return {**out, "fits": fits, "run": _run_dict(cost, s.mfu, engine)}


def plan_lines(result, tokens: int) -> list[str]:
    """The table's lines for the run: steps, the fastest fitting configuration's time and
    GPU-hours, the assumptions."""
    s = result.settings
    cost = plan_cost(result, tokens)
    per_step = s.global_batch * s.seq_len
    if cost is None:
        steps = run_cost(tokens, per_step, 1.0, s.gpus).steps
        return [f"Run of {tokens:,} tokens: {steps:,} steps of {per_step:,} tokens; nothing fits."]
    return [f"Run of {tokens:,} tokens: {cost.steps:,} steps of {per_step:,} tokens (global batch "
            f"x sequence) on {s.gpus:,} GPUs; the fastest that fits takes "
            f"{duration_text(float(cost.seconds[0]))}, {float(cost.gpu_hours[0]):,.0f} GPU-hours "
            f"(JSON and CSV: every configuration's run_seconds and gpu_hours).",
            "Assumes " + "; ".join(run_assumptions(s.mfu, s.engine.name)) + "."]
