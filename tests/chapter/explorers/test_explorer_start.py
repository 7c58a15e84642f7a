"""An explorer starts at a run: its fields become the controls' values (explorers/start.py)."""
from __future__ import annotations

import pytest

import zerolib as zl


def test_an_explorer_starts_at_a_run():
    # A run hands an explorer its setting; fields named beside it win; an unknown name is refused.
    run = zl.Run.of("llama-2-13b", 16, device="a100-80gb", micro_batch=2, recompute="full")
    values = {k: c.value for k, c in zl.WillItFitExplorer(run).controls.items()}
    assert (values["model"], values["gpus"], values["micro_batch"], values["recompute"],
            values["device"]) == ("llama-2-13b", 16, 2, "full", "a100-80gb")
    assert zl.WillItFitExplorer(run, gpus=32).controls["gpus"].value == 32
    with pytest.raises(TypeError, match="the explorer has no setting 'gpu'"):
        zl.WillItFitExplorer(gpu=8)
    planner = zl.PlannerExplorer(zl.Run.of("llama-2-7b", 64, device="h100-80gb", global_batch=512))
    assert planner.run.cluster.device == "h100-80gb" and planner.run.batch.global_batch == 512
