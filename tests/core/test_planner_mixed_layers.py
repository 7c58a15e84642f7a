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
                  expert_parallel=(1,),   # the dense count zl.peaks makes
                  capacity_factor=1.25)
    valid = result.valid
    piped = valid[valid["pipeline_parallel"].to_numpy() >= 2]
    middle = 0
    for _, row in piped.iterrows():
        run = result.run(row)
        ws, placement = run.working_set_settings(), run.placement()
        assert ws.capacity_factor == 1.25
        (peak,) = zl.peaks(DEEPSEEK, 16, [int(row["stage"])], ws, result.settings.layout, placement)
        assert (peak.total, peak.pipeline_stage) == (row["peak_bytes"], row["pipeline_stage"])
        middle += 0 < peak.pipeline_stage < row["pipeline_parallel"] - 1
    assert middle > 0       # e.g. p = 4: stage 1's 7 expert layers outweigh stage 0
    assert result.settings.as_dict()["capacity_factor"] == 1.25


def test_interleaved_peaks_place_dense_layers_by_chunk():
    # 24 layers, the first 5 dense: interleaved chunks of 3 layers put dense layers on ranks 0
    # and 1, where 1F1B puts them all on rank 0 (test_mixed_layer_placement works it out).
    import json
    data = json.loads((REPO / "tests" / "data" / "deepseek-v2-lite.json").read_text())
    model = zl.model_from_config({**data, "num_hidden_layers": 24, "first_k_dense_replace": 5})
    # At 8,192 tokens rank 0's 11 chunk passes in flight make it the most loaded in some rows.
    result = plan(model, 16, 8, "h100-80gb", 8192, 64, max_micro_batch=2, recompute=("none",),
                      expert_parallel=(1,),   # the dense count zl.peaks makes
                  chunks=(2,), stages=(0, 1))
    rows = result.valid[(result.valid["pipeline_parallel"] == 4).to_numpy()]
    assert (rows["pipeline_stage"] == 0).any()
    for _, row in rows.iterrows():
        run = result.run(row)
        ws, placement = run.working_set_settings(), run.placement()
        assert (ws.pipeline_schedule, ws.pipeline_chunks) == ("interleaved", 2)
        (peak,) = zl.peaks(model, 16, [int(row["stage"])], ws, result.settings.layout, placement)
        assert (peak.total, peak.pipeline_stage) == (row["peak_bytes"], row["pipeline_stage"])
