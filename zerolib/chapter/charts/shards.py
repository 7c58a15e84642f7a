"""Figure: who holds what. N GPUs as columns; parameters, gradients and optimizer state as
blocks; the partition each GPU owns coloured, the partitions it does not hold left as outlines.

After Figure 1 of the ZeRO paper (Rajbhandari et al., SC20, arXiv 1910.02054), turned upright:
each category is a band as tall as the whole category's bytes (the model's parameters times
the layout's bytes per parameter), cut into N partitions of ceil(params / N) elements. A
category the stage does not partition is held whole by every GPU (one solid block); one it
partitions is held by each GPU only in its own partition, the other N - 1 drawn empty. So the
coloured area of a column is that GPU's bytes, and the empty area is what the stage saves.

:func:`draw_shards` draws one panel (one stage of
:func:`zerolib.core.memory.tables.shard_table`, or one moment of
:func:`zerolib.core.step.tables.step_shard_table`, where partitions held for a moment, gathered
or reduced away, are hatched) into an Axes and returns its artists; :func:`update_shards`
redraws the same Axes for new rows. :func:`shards_by_stage_figure` and
:func:`shards_through_a_step_figure` put panels side by side. Heights are in the figure's unit
(bytes / 10^9 for GB); the label over each column is its bytes per GPU in that unit, named at
the edge (the y label, the titles).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from zerolib.chapter.charts.tidy import check_tidy, single_value
from zerolib.chapter.style import (
    OKABE_ITO,
    a_or_an,
    gpus_text,
    layout_summary,
    new_figure,
    style,
)
from zerolib.core.memory.accounting import CATEGORIES, STRATEGY_NAMES
from zerolib.core.units import check_unit, format_count, format_value

# Blue parameters, orange gradients, green optimizer state: the ZeRO paper's Figure 1 colours,
# from the colour-blind-safe palette.
CATEGORY_COLORS = {"parameters": OKABE_ITO["blue"], "gradients": OKABE_ITO["orange"],
                   "optimizer": OKABE_ITO["bluish green"]}
CATEGORY_LABELS = {"parameters": "Parameters", "gradients": "Gradients",
                   "optimizer": "Optimizer\nstate"}
# What a GPU holds of a partition it does not own (the tables' ``others`` column), drawn so.
OTHERS = ("held", "not held", "gathered", "reduced away")
HATCHES = {"gathered": "////", "reduced away": "xxxx"}
EMPTY_EDGE = "#9a9a9a"
TINT = 0.35            # alpha of a partition held only for a moment
COLUMN_WIDTH = 0.72    # of the one unit between two GPUs' columns
GAP = 0.025            # between two bands, a fraction of the column's whole height
SHARD_COLUMNS = ("gpu", "category", "partitioned", "bytes", "shard_bytes", "others")
MADE_BY = "zerolib.core.memory.tables.shard_table or zerolib.core.step.tables.step_shard_table"
STAGE_FIGSIZE = (13.0, 5.6)
STEP_FIGSIZE = (13.0, 6.2)


@dataclass
class ShardArtists:
    """What :func:`draw_shards` drew into ``ax``. Every block is a Rectangle whose gid says what
    it is: ``"gpu 2/optimizer/owned"`` (the bytes a GPU holds: its partition, or the whole
    category when ``.../replica``), ``"gpu 2/optimizer/partition 0/not held"`` (or
    ``gathered``, ``reduced away``): one per partition it does not own."""

    ax: object
    blocks: list = field(default_factory=list)
    labels: list = field(default_factory=list)     # bytes per GPU over each column
    note: object = None                             # what the moment moves, for a step's panel
    legend: object = None                           # a caller's legend (the explorer's)


def check_shards(rows) -> pd.DataFrame:
    """``rows`` of one panel: every GPU once per category, ``others`` known."""
    rows = check_tidy(rows, SHARD_COLUMNS, ("layout",), MADE_BY)
    gpus = int(rows["gpu"].max()) + 1
    cells = set(zip(rows["gpu"].tolist(), rows["category"].tolist()))
    if len(rows) != gpus * len(CATEGORIES) or cells != {(g, c) for g in range(gpus)
                                                         for c in CATEGORIES}:
        raise ValueError("rows must hold one panel: every GPU 0..N-1 once per category "
                         "(pick one stage of a shard table, or one phase of a step table)")
    unknown = set(rows["others"]) - set(OTHERS)
    if unknown:
        raise ValueError(f"others must be one of {', '.join(OTHERS)}, got {sorted(unknown)}")
    return rows


def _bands(rows: pd.DataFrame, gpus: int, scale: float) -> dict[str, tuple[float, float]]:
    """(base, partition height) of each category's band, in the unit: a band holds ``gpus``
    partitions of ``shard_bytes``, the height of the whole (padded) category."""
    first = rows[rows["gpu"] == 0].set_index("category")
    heights = {c: float(first.at[c, "shard_bytes"]) / scale for c in CATEGORIES}
    gap = GAP * gpus * sum(heights.values())
    bands, base = {}, 0.0
    for category in CATEGORIES:
        bands[category] = (base, heights[category])
        base += gpus * heights[category] + gap
    return bands


def _blocks(ax, row, gpus: int, band: tuple[float, float], scale: float) -> list:
    base, height = band
    gpu, category, colour = int(row.gpu), row.category, CATEGORY_COLORS[row.category]
    left = gpu - COLUMN_WIDTH / 2
    if not row.partitioned:       # a replica: the whole category, its exact bytes
        return [ax.add_patch(Rectangle((left, base), COLUMN_WIDTH, float(row.bytes) / scale,
                                       facecolor=colour, edgecolor="white", linewidth=0.6,
                                       gid=f"gpu {gpu}/{category}/replica"))]
    blocks = []
    for j in range(gpus):
        y = base + j * height
        if j == gpu:
            blocks.append(ax.add_patch(Rectangle(
                (left, y), COLUMN_WIDTH, float(row.bytes) / scale, facecolor=colour,
                edgecolor="white", linewidth=0.6, gid=f"gpu {gpu}/{category}/owned")))
        elif row.others == "not held":
            blocks.append(ax.add_patch(Rectangle(
                (left, y), COLUMN_WIDTH, height, facecolor="none", edgecolor=EMPTY_EDGE,
                linewidth=0.6, linestyle=(0, (2, 2)),
                gid=f"gpu {gpu}/{category}/partition {j}/not held")))
        else:                     # held for a moment: gathered, or computed and reduced away
            blocks.append(ax.add_patch(Rectangle(
                (left, y), COLUMN_WIDTH, height, facecolor=(*_rgb(colour), TINT),
                edgecolor=colour, linewidth=0.6, hatch=HATCHES[row.others],
                gid=f"gpu {gpu}/{category}/partition {j}/{row.others}")))
    return blocks


def _rgb(colour: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb
    return to_rgb(colour)


def _note(rows: pd.DataFrame, unit: str, scale: float) -> str | None:
    """What a step's moment moves per GPU (step tables only)."""
    if "sent_bytes" not in rows.columns:
        return None
    sent, step = int(rows["sent_bytes"].iloc[0]), int(rows["step_sent_bytes"].iloc[0])
    if sent == 0 and step == 0:
        return "Per GPU: moves nothing; each updates the\nparameters of its own partition"
    return (f"Per GPU: sends {format_value(sent / scale)} {unit} and receives as much\n"
            f"(this layer); {format_value(step / scale)} {unit} over the step's layers")


def _draw(artists: ShardArtists, rows: pd.DataFrame, unit: str) -> None:
    ax, scale = artists.ax, check_unit(unit)
    gpus = int(rows["gpu"].max()) + 1
    ax.set_xlim(-0.5, gpus - 0.5)
    bands = _bands(rows, gpus, scale)
    # A layout of zero bytes per parameter leaves nothing to draw: keep a unit-high empty axis.
    top = max(base + gpus * height for base, height in bands.values()) or 1.0
    for row in rows.itertuples():
        artists.blocks += _blocks(ax, row, gpus, bands[row.category], scale)
    held = rows.groupby("gpu")["bytes"].sum()
    for gpu in range(gpus):
        artists.labels.append(ax.text(gpu, top * 1.015, format_value(int(held[gpu]) / scale),
                                      ha="center", va="bottom", fontsize=9.5))
    note = _note(rows, unit, scale)
    if note is not None:
        artists.note = ax.text(0.0, -0.09, note, transform=ax.transAxes, ha="left", va="top",
                               fontsize=9.5)
    ax.set_ylim(0, top * 1.09)
    ax.set_xticks(range(gpus), [str(g) if gpus > 8 else f"GPU {g}" for g in range(gpus)],
                  fontsize=9 if gpus > 8 else 10)
    ax.set_yticks([base + gpus * height / 2 for base, height in bands.values()],
                  [CATEGORY_LABELS[c] for c in bands])
    ax.set_xlabel("GPU" if gpus > 8 else "")    # the ticks name it when there is room
    ax.tick_params(axis="y", length=0)
    ax.grid(False)
    for side in ("left", "top", "right"):
        ax.spines[side].set_visible(False)


def draw_shards(ax, rows: pd.DataFrame, unit: str = "GB", title: str | None = None) -> ShardArtists:
    """One panel of the shard picture: ``rows`` of one stage (:func:`~zerolib.core.memory.tables.shard_table`)
    or one moment of a step (:func:`~zerolib.core.step.tables.step_shard_table`), one column per
    GPU, each labelled with the bytes it holds in ``unit``. ``title`` over the panel (None: the
    stage's or the moment's name from the rows)."""
    rows = check_shards(rows)
    with style():
        artists = ShardArtists(ax)
        _draw(artists, rows, unit)
        ax.set_title(_title(rows) if title is None else title, loc="left", fontsize=11.5,
                     fontweight="bold")
    return artists


def update_shards(artists: ShardArtists, rows: pd.DataFrame, unit: str = "GB",
                  title: str | None = None) -> ShardArtists:
    """Redraw the panel of :func:`draw_shards` for new rows or unit: its blocks, labels and
    note replaced, the Axes and its title kept."""
    rows = check_shards(rows)
    with style():
        for artist in [*artists.blocks, *artists.labels, *([artists.note] if artists.note else [])]:
            artist.remove()
        artists.blocks, artists.labels, artists.note = [], [], None
        _draw(artists, rows, unit)
        artists.ax.set_title(_title(rows) if title is None else title, loc="left",
                             fontsize=11.5, fontweight="bold")
    return artists


def _title(rows: pd.DataFrame) -> str:
    if "label" in rows.columns:     # "(a) When: what" on two lines
        return str(rows["label"].iloc[0]).replace(": ", ":\n", 1)
    return STRATEGY_NAMES[int(rows["stage"].iloc[0])]


def legend_handles(others=OTHERS) -> list:
    """Legend entries: one per category (its owned partition), then one per way of holding
    the partitions a GPU does not own, among ``others``."""
    handles = [Patch(facecolor=CATEGORY_COLORS[c], edgecolor="white",
                     label=CATEGORY_LABELS[c].replace("\n", " ")) for c in CATEGORIES]
    words = {"not held": "not held (another GPU's partition)",
             "gathered": "gathered for the layer, then freed",
             "reduced away": "computed, reduced into its owner's partition, freed"}
    for kind in others:
        if kind == "not held":
            handles.append(Patch(facecolor="none", edgecolor=EMPTY_EDGE, linestyle=(0, (2, 2)),
                                 label=words[kind]))
        elif kind in HATCHES:
            handles.append(Patch(facecolor=(0.5, 0.5, 0.5, TINT), edgecolor="#555555",
                                 hatch=HATCHES[kind], label=words[kind]))
    return handles


def _panels(figure: Figure, count: int, bottom: float, top: float = 1.25) -> list:
    """``count`` Axes side by side, fixed in inches (left label column, legend below)."""
    width, height = figure.get_size_inches()
    left, right, gap = 1.05, 0.2, 0.35
    each = (width - left - right - gap * (count - 1)) / count
    with style():
        return [figure.add_axes(((left + i * (each + gap)) / width, bottom / height,
                                 each / width, 1 - (bottom + top) / height)) for i in range(count)]


def _headline(figure: Figure, title: str, subtitle: str) -> None:
    width, height = figure.get_size_inches()
    figure.text(0.2 / width, 1 - 0.3 / height, title, ha="left", va="top", fontsize=13,
                fontweight="bold")
    figure.text(0.2 / width, 1 - 0.65 / height, subtitle, ha="left", va="top", fontsize=10,
                color="#333333")


def shards_by_stage_figure(table: pd.DataFrame, unit: str = "GB",
                           dpi: float = 100) -> tuple[Figure, list[ShardArtists]]:
    """One panel per stage of a :func:`~zerolib.core.memory.tables.shard_table`, side by side."""
    table = check_tidy(table, ("params", "gpus", "stage", *SHARD_COLUMNS), ("layout",), MADE_BY)
    params = single_value(table, "params", "shard")
    gpus = single_value(table, "gpus", "shard")
    stages = sorted(int(s) for s in np.unique(table["stage"]))
    figure = new_figure(STAGE_FIGSIZE, dpi)
    panels = []
    for i, (ax, stage) in enumerate(zip(_panels(figure, len(stages), 1.3), stages)):
        rows = table[table["stage"] == stage].reset_index(drop=True)
        rows.attrs.update(table.attrs)
        panels.append(draw_shards(ax, rows, unit))
        if i:
            ax.set_yticklabels([])
    with style():
        _headline(figure, f"Who holds what: {a_or_an(format_count(params))}-parameter model on "
                          f"{gpus_text(gpus)}, bytes per GPU in {unit} over each column",
                  layout_summary(table.attrs["layout"]) + "; coloured: what the GPU holds")
        figure.legend(handles=legend_handles(("not held",)), loc="lower center", ncol=4,
                      frameon=False, bbox_to_anchor=(0.5, 0.02))
    return figure, panels


def shards_through_a_step_figure(frame: pd.DataFrame, unit: str = "GB",
                                 dpi: float = 100) -> tuple[Figure, list[ShardArtists]]:
    """One panel per moment of a :func:`~zerolib.core.step.tables.step_shard_table`, with what
    each moves per GPU."""
    frame = check_tidy(frame, ("phase", "label", "layer_params", "gpus", "sent_bytes",
                               "step_sent_bytes", *SHARD_COLUMNS), ("layout", "model"),
                       "zerolib.core.step.tables.step_shard_table")
    gpus = single_value(frame, "gpus", "shards-through-a-step")
    elements = single_value(frame, "layer_params", "shards-through-a-step")
    phases = list(dict.fromkeys(frame["phase"]))
    figure = new_figure(STEP_FIGSIZE, dpi)
    panels = []
    for i, (ax, phase) in enumerate(zip(_panels(figure, len(phases), 1.75, 1.5), phases)):
        rows = frame[frame["phase"] == phase].reset_index(drop=True)
        rows.attrs.update(frame.attrs)
        panels.append(draw_shards(ax, rows, unit))
        if i:
            ax.set_yticklabels([])
    model = frame.attrs["model"]
    with style():
        _headline(figure, f"ZeRO stage 3 through one step: one layer of {model.name} "
                          f"({elements:,} parameters) on {gpus_text(gpus)}",
                  f"Over each column: the layer's bytes the GPU keeps, in {unit}; before (b) the "
                  "parameters are all-gathered again, as in (a).\n"
                  + layout_summary(frame.attrs["layout"]))
        figure.legend(handles=legend_handles(("not held", "gathered", "reduced away")),
                      loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return figure, panels
