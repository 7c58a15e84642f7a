"""A saved explorer as plain HTML: what a static page shows in place of live widgets.

A notebook saves each widget's state in its metadata (``application/vnd.jupyter.widget-state+json``).
:func:`saved_widget_html` walks the tree under one displayed widget and writes what it holds: its
HTML texts and images as they were saved, and in place of its controls one line naming the
setting each showed. Nothing in it looks like a control, so nothing invites a move that would
change nothing. :func:`inert_state` marks every control of a saved state disabled, for the
pages that do load the widget renderer; :func:`as_saved` also gives each explorer's note its
saved wording: what ``zerolib notebooks`` saves, so that wherever the saved state is drawn
(JupyterLab before the notebook runs, nbviewer, an export) the explorer says it is not live.
"""
from __future__ import annotations

import copy
import html

from zerolib.chapter.explorers.panel import NOTE_CLASS, SAVED_NOTE

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
_REFERENCE = "IPY_MODEL_"
_TEXT_MODELS = ("HTMLModel", "HTMLMathModel", "LabelModel")
_BOX_MODELS = ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel")
NOTE = ("<b>Saved explorer, not live.</b> This page is static: it shows the figure and tables "
        "the notebook was saved with, and the settings below them. Nothing here can redraw the "
        "figure; open the notebook in JupyterLab and run all cells to move the controls.")


def widget_states(nb) -> dict:
    """model id -> saved model (``model_name``, ``state``, ``buffers``) of a notebook."""
    saved = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {})
    return dict(saved.get("state", {}))


def _model(states: dict, reference) -> tuple[str, dict] | None:
    if not isinstance(reference, str):
        return None
    model_id = reference[len(_REFERENCE):] if reference.startswith(_REFERENCE) else reference
    return (model_id, states[model_id]) if model_id in states else None


def _children(states: dict, model: dict) -> list[tuple[str, dict]]:
    found = (_model(states, ref) for ref in model.get("state", {}).get("children", ()))
    return [child for child in found if child is not None]


def _is_note(model: dict) -> bool:
    return (model.get("model_name") == "HTMLModel"
            and NOTE_CLASS in model.get("state", {}).get("_dom_classes", ()))


def _is_control(model: dict) -> bool:
    state = model.get("state", {})
    return "description" in state and model.get("model_name") not in _TEXT_MODELS


def setting_text(model: dict) -> str | None:
    """``'GPUs: 8'``: a control's label and the value it showed, as its readout wrote it."""
    state = model["state"]
    label = state.get("description") or "setting"
    labels = state.get("_options_labels")
    index = state.get("index")
    if labels is not None and index is not None:
        if isinstance(index, (list, tuple)):     # a range slider, a multiple selection
            chosen = [labels[i] for i in index]
            joiner = " to " if model.get("model_name") == "SelectionRangeSliderModel" else ", "
            value = joiner.join(chosen)
        else:
            value = labels[index]
    elif isinstance(state.get("value"), bool):
        value = "on" if state["value"] else "off"
    elif "value" in state:
        value = state["value"]
        spec = state.get("readout_format")
        if isinstance(value, (int, float)) and spec:
            try:
                value = format(value, spec.lstrip("~"))
            except ValueError:
                pass
        if isinstance(value, (list, tuple)):
            value = " to ".join(map(str, value))
    else:
        return None
    return f"{label}: {value}"


def _image_html(model: dict) -> str:
    for buffer in model.get("buffers", ()):
        if buffer.get("path") == ["value"] and buffer.get("encoding") == "base64":
            kind = html.escape(model["state"].get("format", "png"))
            return f'<img alt="the explorer\'s figure as saved" src="data:image/{kind};base64,{buffer["data"]}"/>'
    return ""


def saved_widget_html(states: dict, model_id: str) -> str:
    """The saved widget ``model_id`` as static HTML: a note, its texts and images in order, and
    one line of the settings its controls showed (empty when nothing was saved for it)."""
    root = _model(states, model_id)
    if root is None:
        return ""
    parts: list[str] = []
    settings: list[str] = []

    def subtree(model: dict):
        yield model
        for _, child in _children(states, model):
            yield from subtree(child)

    def walk(model: dict) -> None:
        name = model.get("model_name")
        inside = list(subtree(model))
        if name in _BOX_MODELS and any(map(_is_control, inside)) and not any(
                m.get("model_name") == "ImageModel" for m in inside):
            # A control panel: its settings in one line; its texts (section titles) name
            # controls that are not shown here.
            settings.extend(filter(None, (setting_text(m) for m in inside if _is_control(m))))
        elif name in _BOX_MODELS:
            for _, child in _children(states, model):
                walk(child)
        elif name == "ImageModel":
            parts.append(_image_html(model))
        elif _is_control(model):
            text = setting_text(model)
            if text:
                settings.append(text)
        elif name in _TEXT_MODELS and model.get("state", {}).get("value") and not _is_note(model):
            parts.append(model["state"]["value"])   # (the explorer's own note: NOTE says it)
    walk(root[1])
    if not parts and not settings:
        return ""
    line = (f'<p class="zerolib-saved-settings"><b>Saved settings:</b> '
            f'{html.escape(" · ".join(settings))}.</p>' if settings else "")
    return (f'<div class="zerolib-saved-explorer zerolib-explorer">'
            f'<p class="zerolib-saved-note">{NOTE}</p>'
            f'<div class="zerolib-saved-body">{line}{"".join(parts)}</div></div>')


def inert_state(nb):
    """A copy of ``nb`` whose saved controls are all disabled: rendered from the saved state,
    they show their setting greyed out instead of moving without effect."""
    nb = copy.deepcopy(nb)
    for model in widget_states(nb).values():
        if _is_control(model) and "disabled" in model.get("state", {}):
            model["state"]["disabled"] = True
    return nb


def as_saved(nb):
    """A copy of ``nb`` as a notebook is saved: :func:`inert_state`, and each explorer's note
    (an HTML widget of class ``NOTE_CLASS``) saying the explorer is saved, not live."""
    nb = inert_state(nb)
    for model in widget_states(nb).values():
        if _is_note(model):
            model["state"]["value"] = SAVED_NOTE
    return nb
