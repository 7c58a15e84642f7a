"""The planner on a model with dense first layers and a capacity factor (DeepSeek-V2-Lite):
every peak it reports is working_set.peaks' for the same configuration, the pipeline stage
that decides it included, a middle one where a middle stage is the most loaded."""
from __future__ import annotations

from conftest import REPO

import zerolib as zl
from zerolib.core.planner import plan

DEEPSEEK = zl.model_from_config(REPO / "tests" / "data" / "deepseek-v2-lite.json")


def test_deepseek_peaks_are_working_set_peaks():
    result = plan(DEEPSEEK, 16, 8, "h100-80gb", 1024, 64, max_micro_batch=1, recompute=("none",),
                  working_set=zl.WorkingSetSettings(capacity_factor=1.25))
    valid = result.valid
    piped = valid[valid["pipeline_parallel"].to_numpy() >= 2]
    middle = 0
    for _, row in piped.iterrows():
        ws, placement = result.settings_for(row)
        assert ws.capacity_factor == 1.25
        (peak,) = zl.peaks(DEEPSEEK, 16, [int(row["stage"])], ws, result.settings.layout, placement)
        assert (peak.total, peak.pipeline_stage) == (row["peak_bytes"], row["pipeline_stage"])
        middle += 0 < peak.pipeline_stage < row["pipeline_parallel"] - 1
    assert middle > 0       # e.g. p = 4: stage 1's 7 expert layers outweigh stage 0
    assert result.settings.as_dict()["capacity_factor"] == 1.25
