"""A real explorer's saved widgets as the static page writes them: its picture, its texts and one
line of settings, no section title of controls that are not shown."""
from __future__ import annotations

import base64
import html

import ipywidgets.embed
import pytest

from zerolib.chapter.explorers import GpuCountExplorer, PlannerExplorer
from zerolib.publish.saved_widgets import inert_state, saved_widget_html


def saved(explorer):
    # Every trait, as a notebook saves them (embed_data drops defaults unless told not to), of
    # this explorer's widgets only (not every widget alive in the process).
    views = [explorer.widget]
    state = ipywidgets.embed.dependency_state(views, drop_defaults=False)
    data = ipywidgets.embed.embed_data(views=views, drop_defaults=False, state=state)
    return data["manager_state"]["state"], data["view_specs"][0]["model_id"]


@pytest.mark.parametrize("cls, settings", [
    (GpuCountExplorer, "Model size: 7B · GPUs: 1 to 64 · Layout: mixed-adam (16 bytes/param) · "
                       "Parameters: 2.0 · Gradients: 2.0 · Optimizer: 12.0 · Device: A100 80GB · "
                       "Unit: GB · Capacity: nominal GiB."),
    (PlannerExplorer, "Links: the device's usual node · CPU memory/node: not given · "),
])
def test_a_saved_explorer_is_its_picture_texts_and_settings(cls, settings):
    explorer = cls()
    states, root = saved(explorer)
    page = saved_widget_html(states, root)
    assert html.escape(settings, quote=True).replace("&#x27;", "'") in page.replace("&#x27;", "'")
    assert page.count("<img") == 1
    assert base64.b64encode(bytes(explorer.image.value)).decode() in page
    assert explorer.summary.value in page and explorer.table.value in page
    assert "Model and GPUs" not in page and "Model and cluster" not in page   # section titles
    assert saved_widget_html(states, "no-such-model") == ""


def test_inert_state_disables_every_control_of_a_copy():
    states, _ = saved(GpuCountExplorer())
    nb = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": states}}}}
    inert = inert_state(nb)["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]
    controls = [m for m in inert["state"].values() if "description" in m["state"]
                and m["model_name"] not in ("HTMLModel", "LabelModel")]
    assert len(controls) == 9 and all(m["state"]["disabled"] is True for m in controls)
    assert not any(m["state"].get("disabled") for m in states.values())   # the original untouched


def test_a_notebook_saves_its_explorers_as_saved_not_live():
    """The live explorer says it is live; the state a notebook is saved with says saved, not
    live, with every control switched off (JupyterLab draws it before the notebook runs)."""
    from zerolib.chapter.explorers.panel import LIVE_NOTE, NOTE_CLASS, SAVED_NOTE
    from zerolib.publish.saved_widgets import as_saved

    explorer = GpuCountExplorer()
    states, root = saved(explorer)
    notes = [m for m in states.values() if NOTE_CLASS in m["state"].get("_dom_classes", ())]
    assert [m["state"]["value"] for m in notes] == [LIVE_NOTE]
    assert "Live explorer" in LIVE_NOTE and "move nothing" not in LIVE_NOTE
    nb = {"metadata": {"widgets": {"application/vnd.jupyter.widget-state+json": {"state": states}}}}
    kept = as_saved(nb)["metadata"]["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert [m["state"]["value"] for m in kept.values()
            if NOTE_CLASS in m["state"].get("_dom_classes", ())] == [SAVED_NOTE]
    assert "not live" in SAVED_NOTE and "Run All Cells" in SAVED_NOTE
    assert all(m["state"]["disabled"] for m in kept.values()
               if "description" in m["state"] and "disabled" in m["state"])
    # The static page's own note says what the copy is: the saved note is not repeated.
    page = saved_widget_html(kept, root)
    assert "Saved explorer, not live." in page and SAVED_NOTE not in page and LIVE_NOTE not in page


def test_an_explorer_reads_as_a_sentence_where_widgets_do_not_render():
    """Its text/plain (GitHub, an untrusted notebook, nbconvert to text) is not the widget
    tree's repr ``VBox(children=(HTML(...``."""
    from zerolib.chapter.explorers.panel import PLAIN_TEXT

    bundle = GpuCountExplorer().widget._repr_mimebundle_()
    assert bundle["text/plain"] == PLAIN_TEXT
    assert "VBox" not in bundle["text/plain"] and "application/vnd.jupyter.widget-view+json" in bundle
