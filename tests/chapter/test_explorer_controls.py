"""Every explorer's controls, as a reader meets them: each dropdown shows a chosen entry.

ipywidgets reads an option whose value is None as "nothing selected": the dropdown renders blank
in JupyterLab and in an HTML export, whatever its label says.
"""
from __future__ import annotations

import ipywidgets
import pytest

import zerolib.chapter.explorers as explorers

EXPLORERS = [getattr(explorers, name) for name in explorers.__all__]


def descendants(widget):
    """``widget`` and every widget inside it (boxes' children), depth first."""
    yield widget
    for child in getattr(widget, "children", ()):
        yield from descendants(child)


def label(control, index: int) -> str:
    """The text the control shows for option ``index`` (options are labels or (label, value))."""
    option = control.options[index]
    return str(option[0] if isinstance(option, tuple) else option)


@pytest.fixture(scope="module", params=EXPLORERS, ids=lambda cls: cls.__name__)
def explorer(request):
    return request.param()


def test_every_selection_control_has_a_selected_label(explorer):
    selections = [w for w in descendants(explorer.widget)
                  if isinstance(w, (ipywidgets.Dropdown, ipywidgets.ToggleButtons,
                                    ipywidgets.RadioButtons, ipywidgets.Select,
                                    ipywidgets.SelectionSlider))]
    assert selections, "the explorer shows no selection control"
    blank = [w.description for w in selections if w.index is None or not label(w, w.index)]
    assert not blank, f"controls showing no selection: {blank}"


def test_every_control_is_shown(explorer):
    shown = {id(w) for w in descendants(explorer.widget)}
    hidden = [name for name, control in explorer.controls.items() if id(control) not in shown]
    assert not hidden, f"controls not in the explorer's widget: {hidden}"


def test_the_planners_not_given_entries_stand_for_none_set_from_python():
    """Setting links or CPU memory to None from Python shows the "not given" entry (a None
    value would leave the menu blank) and plans exactly as that entry does."""
    from zerolib.chapter.explorers.planner import NO_HOST_MEMORY, USUAL_NODE
    explorer = explorers.PlannerExplorer()
    before = bytes(explorer.image.value)
    explorer.controls["links"].value = None
    explorer.controls["host_memory"].value = None
    assert explorer.controls["links"].value == USUAL_NODE
    assert explorer.controls["host_memory"].value == NO_HOST_MEMORY
    assert explorer.controls["links"].label and explorer.controls["host_memory"].label
    assert explorer.links is None and explorer.host_memory is None
    assert bytes(explorer.image.value) == before and explorer.status.value == ""
