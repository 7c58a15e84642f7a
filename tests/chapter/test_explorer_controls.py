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
