"""One layout for every explorer: labelled sections of controls in a grid, then the texts, the
figure at its own pixel size and the tables.

An explorer declares its panel as ``(title, (control name, ...))`` sections; :func:`control_panel`
gives every control the same label column and fills a grid cell with it, so labels line up,
sit left of their controls and are never cut, and sliders are long enough to set a value.
Sizes are CSS pixels at 100 % zoom, measured in JupyterLab by tests/browser/test_explorer_layout.py.
"""
from __future__ import annotations

LABEL_WIDTH = "9.5em"     # the longest description ("CPU memory/node") fits whole
CELL_MIN = "380px"        # two cells side by side in JupyterLab's output area at 1280 px
WIDE = ("capacity",)      # controls that take a whole row (three buttons and a label)
EXPLORER_CLASS = "zerolib-explorer"
NOTE_CLASS = "zerolib-explorer-note"
# The note above an explorer's controls. A live explorer (built in a running kernel) says it is
# live; the widget state a notebook is saved with carries the saved wording instead (written by
# ``zerolib notebooks``, which also switches the saved controls off): GitHub, nbviewer, an HTML
# export and JupyterLab before the notebook runs show the saved state.
_NOTE_STYLE = "font-size:smaller;color:#555"
LIVE_NOTE = (f"<p style='{_NOTE_STYLE}'><b>Live explorer:</b> each control redraws the figure "
             "and the tables below in this notebook's Python kernel.</p>")
SAVED_NOTE = (f"<p style='{_NOTE_STYLE}'><b>Saved explorer, not live:</b> the controls show the "
              "settings this notebook was saved with and are switched off. Run the notebook "
              "(in JupyterLab: Run &gt; Run All Cells) to use them.</p>")
# What a notebook shows for an explorer where widgets do not render (its text/plain): a
# sentence, not the widget tree's repr.
PLAIN_TEXT = "Explorer (ipywidgets): shown where widgets render; run the notebook to use its controls."

# Tables in the explorers' HTML widgets: padding, a rule under each row, numbers right-aligned
# (their cells say so inline), short cells on one line; prose cells may wrap.
TABLE_CSS = f"""<style>
.{EXPLORER_CLASS} table {{border-collapse: collapse; margin: 0.4em 0 0.8em;}}
.{EXPLORER_CLASS} caption {{text-align: left; font-weight: bold; padding: 0.2em 0 0.4em;}}
.{EXPLORER_CLASS} th, .{EXPLORER_CLASS} td {{padding: 0.2em 0.6em; white-space: nowrap;
  border-bottom: 1px solid #e0e0e0; vertical-align: top;}}
.{EXPLORER_CLASS} th {{text-align: left; border-bottom: 1px solid #999; vertical-align: bottom;}}
.{EXPLORER_CLASS} td.prose {{white-space: normal; min-width: 16em;}}
.{EXPLORER_CLASS} th.prose {{white-space: normal; min-width: 7em;}}
.{EXPLORER_CLASS} table.prose-last td:last-child {{white-space: normal; min-width: 14em;}}
.{EXPLORER_CLASS} .widget-html-content {{overflow-x: auto;}}
</style>"""


def widgets():
    import ipywidgets
    return ipywidgets


def fit(control) -> None:
    """Give ``control`` the panel's label column and let it fill its grid cell."""
    w = widgets()
    control.layout.width = "auto"     # stretched to its grid cell, margins included
    control.layout.min_width = "0"
    if isinstance(control, w.Checkbox):
        control.indent = True         # the box lines up with the other controls
    if hasattr(control.style, "description_width"):
        control.style.description_width = LABEL_WIDTH
    if isinstance(control, w.ToggleButtons):
        control.style.button_width = "auto"   # each button as wide as its own text
        # ipywidgets lays ToggleButtons out as a block: its label on a line above the buttons.
        control.add_class("widget-inline-hbox")
    if isinstance(control, w.SelectMultiple):
        control.rows = len(control.options)   # every entry, and so every selected one, in view


def control_panel(controls: dict, sections, wide=WIDE) -> object:
    """The labelled grid: per section a bold title and its controls, two to a row where they fit
    (a control named in ``wide``, :data:`WIDE` unless told, on a row of its own below them)."""
    w = widgets()
    boxes = []
    for title, names in sections:
        for name in names:
            fit(controls[name])
        boxes.append(w.HTML(f"<b>{title}</b>"))
        boxes.append(w.GridBox([controls[n] for n in names if n not in wide], layout=w.Layout(
            grid_template_columns=f"repeat(auto-fill, minmax({CELL_MIN}, 1fr))",
            grid_gap="2px 24px")))
        boxes.extend(controls[n] for n in names if n in wide)
    return w.VBox(boxes)


def shown_at_own_size(image, figure) -> None:
    """Show the figure's PNG at its own pixel size: never scaled, so its text keeps its size."""
    width, height = (round(v * figure.dpi) for v in figure.get_size_inches())
    image.layout.width = f"{width}px"
    image.layout.height = f"{height}px"
    image.layout.min_width = f"{width}px"
    image.layout.max_width = "none"
