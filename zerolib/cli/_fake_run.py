"""``zerolib estimate ... --fake-run``: the fake run's peak beside the formula's.

The fake run (:mod:`zerolib.crosscheck.fake_run`) trains two steps of the model on fake tensors
at its real width, FSDP2 as torchtitan wraps it over fake ranks, and counts what is alive on
rank 0 (``data/mechanisms_measured.md``: exact against a hand count at Llama-3-8B's width). It
answers ZeRO stage 3 (FSDP2's ``reshard_after_forward``) without tensor, pipeline or context
parallelism, and transformers' loss (the logits kept beside their fp32 chain); it is set beside
the formula's allocated peak of the same stage."""
from __future__ import annotations

import importlib.util

from zerolib.core.units import to_unit

EXTRA = "pip install 'zerolib[validate]'"
# zerolib's recompute policies the fake run has (its names: none, op-sac, full).
POLICIES = {"none": "none", "op-selective": "op-sac", "full": "full"}


def add_argument(parser) -> None:
    parser.add_argument("--fake-run", action="store_true",
                        help="also train two steps on fake tensors at the model's full width "
                             "(PyTorch, FSDP2 over fake ranks; ZeRO stage 3, no tensor, pipeline "
                             f"or context parallelism) and show its peak beside the formula's "
                             f"(needs torch and transformers: {EXTRA})")


def check(args, run) -> None:
    """One line where the fake run cannot answer this run: what the run asks first, then what
    the machine lacks."""
    p, settings = run.parallel, run.working_set_settings()
    if run.config is None:
        raise ValueError("--fake-run needs --model (an architecture to build)")
    if (p.tensor, p.pipeline, p.context) != (1, 1, 1):
        raise ValueError("--fake-run runs FSDP2 alone: no --tensor-parallel, --pipeline-parallel "
                         "or --context-parallel")
    if settings.recompute not in POLICIES:
        raise ValueError(f"--fake-run runs --recompute {', '.join(POLICIES)}, got "
                         f"{settings.recompute!r}")
    if run.trainer.stages is not None and 3 not in run.trainer.stages:
        raise ValueError("--fake-run answers ZeRO stage 3 (FSDP2 resharding after forward): "
                         "add --stage 3 or leave --stage out")
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        raise ValueError(f"--fake-run needs PyTorch and transformers: {EXTRA}")


def answer(run, result: dict) -> dict:
    """The fake run of ``run`` and its comparison with the formula's stage-3 row of ``result``."""
    import torch  # present: check() said so

    from zerolib.crosscheck.fake_run import FakeStep, fake_step_peak

    settings = run.working_set_settings()
    ranks = run.cluster.gpus
    found = fake_step_peak(run.config, FakeStep(ranks=ranks, seq_len=settings.seq_len,
                                                micro_batch=settings.micro_batch,
                                                recompute=POLICIES[settings.recompute],
                                                compare=False))
    (row,) = [r for r in result["stages"] if r["stage"] == 3] or [None]
    formula = None if row is None else row["max_memory_allocated"]
    return {"peak_bytes": found.peak_bytes, "state_bytes": found.state_bytes,
            "seconds": found.seconds, "ranks": ranks, "torch_version": torch.__version__,
            "formula_bytes": formula,
            "ratio": None if formula is None else round(found.peak_bytes / formula, 4)}


def line(fake: dict, unit: str) -> str:
    """The table's line for the fake run."""
    text = (f"Fake run (PyTorch {fake['torch_version']}, FSDP2 over {fake['ranks']} fake ranks, "
            f"{fake['seconds']:.0f} s): {to_unit(fake['peak_bytes'], unit):,.2f} {unit} allocated "
            f"on rank 0 at its peak")
    if fake["formula_bytes"] is not None:
        text += (f", beside the formula's {to_unit(fake['formula_bytes'], unit):,.2f} {unit} "
                 f"(ZeRO stage 3, max allocated; ratio {fake['ratio']:.3f})")
    return text + "."
