"""The planner explorer takes the trainer (engine torchtitan among the engines, fp8, compile):
its plan is the core's for the same run, both peaks are shown and the judged one is drawn."""
import numpy as np

import zerolib as zl
from zerolib.chapter.charts.plan_peaks import judged_column
from zerolib.core.planner import plan


def test_torchtitan_is_planned_with_both_peaks_and_the_reserved_one_judged():
    explorer = zl.PlannerExplorer(model="llama-2-7b", gpus=16)
    explorer.controls["engine"].value = "torchtitan"
    explorer.controls["fp8"].value = True
    explorer.controls["compile"].value = True
    assert explorer.status.value == ""
    s = explorer.plan.settings
    assert s.engine.name == "torchtitan" and s.working_set.fp8 and s.working_set.compile
    assert "op-selective" in s.recompute
    core = plan(explorer.run, search=explorer.search)
    first = core.fits.iloc[0]
    assert (explorer.plan.fits.iloc[0][["peak_bytes", "peak_reserved_bytes", "step_seconds"]]
            == first[["peak_bytes", "peak_reserved_bytes", "step_seconds"]]).all()
    assert "<th>Peak per GPU</th><th>Peak reserved</th>" in explorer.table.value
    assert "Headroom (to the reserved peak)" in explorer.table.value
    assert "the reserved peak per GPU at most the capacity" in explorer.summary.value
    # drawn at the peak it is judged on: the capacity line parts what fits from the rest
    frame = explorer.data
    assert judged_column(s) == "peak_reserved_bytes"
    assert explorer.artists.ax.get_ylabel().startswith("Reserved peak per GPU")
    judged = frame["peak_reserved_bytes"].to_numpy()
    assert np.array_equal(judged <= s.device.capacity, frame["fits"].to_numpy())


def test_the_default_engine_is_drawn_and_judged_at_the_peak():
    explorer = zl.PlannerExplorer(model="llama-2-7b", gpus=16)
    assert judged_column(explorer.plan.settings) == "peak_bytes"
    assert explorer.artists.ax.get_ylabel().startswith("Peak per GPU")
    assert "the peak per GPU at most the capacity" in explorer.summary.value
