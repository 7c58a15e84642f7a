"""A value set on an explorer's control from Python that it cannot draw (``None``, NaN) is
reported in the status line by whichever observer meets it, never raised out of the observer;
setting the control back redraws and clears the line."""
import math

import pytest
from traitlets import TraitError

from zerolib.chapter import explorers, fast_png

EXPLORERS = {
    "gpu_count": explorers.GpuCountExplorer,
    "model_size": explorers.ModelSizeExplorer,
    "will_it_fit": explorers.WillItFitExplorer,
    "placement": explorers.PlacementExplorer,
    "step_time": explorers.StepTimeExplorer,
    "planner": explorers.PlannerExplorer,
    "shards": explorers.ShardExplorer,
}
BAD = (None, math.nan)


def offered(control, value) -> bool:
    """True if ``value`` is one of the control's own options (e.g. "not given" host memory)."""
    options = getattr(control, "options", ())
    return any((o[1] if isinstance(o, tuple) else o) is value for o in options)


@pytest.mark.parametrize("kind", EXPLORERS)
def test_values_set_from_python_are_reported_not_raised(kind):
    explorer = EXPLORERS[kind]()
    reported = 0
    for name in sorted(explorer.controls):
        control = explorer.controls[name]
        for bad in BAD:
            good = control.value
            try:
                control.value = bad
            except TraitError:        # refused by the widget itself, loudly: put it back
                control.value = good
                continue
            if control.value is not bad:   # the explorer put its own "not given" entry in its place
                assert control.value == good and explorer.status.value == "", (name, bad)
            elif not offered(control, bad):
                assert "Not redrawn" in explorer.status.value, (name, bad)
                reported += 1
            control.value = good
            assert explorer.status.value == "", (name, bad)
            assert bytes(explorer.image.value) == fast_png.IncrementalPng(explorer.figure).render()
    assert reported        # every explorer has a control that takes None or NaN


@pytest.mark.parametrize("kind", ["gpu_count", "model_size"])
def test_layout_controls_say_what_they_take(kind):
    explorer = EXPLORERS[kind]()
    explorer.controls["layout"].value = None
    assert "layout must be one of mixed-adam" in explorer.status.value
    explorer.controls["layout"].value = "custom"
    explorer.controls["optimizer_bytes"].value = math.nan
    assert "optimizer bytes/param must be a number from 0 to 32, got nan" in explorer.status.value
    # Another control's redraw meets the NaN too, and names it (not "cannot convert float NaN").
    explorer.controls["unit"].value = "GiB"
    assert "optimizer bytes/param must be a number" in explorer.status.value
    explorer.controls["optimizer_bytes"].value = 6.0
    assert explorer.status.value == "" and explorer.layout.widths() == (2.0, 2.0, 6.0)
