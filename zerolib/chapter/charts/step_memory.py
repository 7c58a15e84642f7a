"""Figure: one GPU's memory through one training step, a panel per ZeRO stage.

:func:`step_memory_figure` draws a :func:`zerolib.core.memory.step_memory.step_memory_frame`:
the live bytes at each moment (forward layer by layer, the loss, backward layer by layer, the
optimizer step) stacked by component in the will-it-fit figure's colours, the device's capacity
dashed, and each panel's highest moment marked with the peak the chapter reports.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from zerolib.chapter.charts.will_it_fit import COMPONENT_COLORS, COMPONENT_LABELS, TOL_MUTED
from zerolib.chapter.style import DEVICE_COLOR, device_label, new_figure, style
from zerolib.core.catalogue.devices import Device, get_device
from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.memory.step_memory import COMPONENTS, PHASES
from zerolib.core.units import check_unit, format_value

FIGSIZE = (12.0, 5.4)   # inches
COLORS = {**COMPONENT_COLORS, "model state": TOL_MUTED["indigo"]}
LABELS = {**COMPONENT_LABELS, "model state": "Model state (parameters, gradients, optimizer)"}
# Bottom up: what stays all step, then what comes and goes.
ORDER = ("model state", "reserve", "ddp_buckets", "reduce_bucket", "gathered_parameters",
         "allgather_bucket", "activations", "logits_loss")
COLUMNS = ("stage", "moment", "phase", "component", "bytes")


def _check(frame) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame) or not set(COLUMNS) <= set(frame.columns):
        raise ValueError("frame must be a step_memory_frame (columns stage, moment, phase, "
                         "component, bytes)")
    if set(frame["component"]) - set(COMPONENTS) or len(frame) == 0:
        raise ValueError(f"frame's components must be among {', '.join(COMPONENTS)}")
    return frame


def step_memory_figure(frame: pd.DataFrame, device: str | Device = "h100-80gb", unit: str = "GB",
                       dpi: float = 100) -> tuple[Figure, dict]:
    """The figure and, per stage, its axes and the (moment, bytes) of its highest moment."""
    frame, device = _check(frame), get_device(device)
    per = check_unit(unit)
    stages = sorted(set(frame["stage"]))
    figure = new_figure(FIGSIZE, dpi)
    marks = {}
    with style():
        axes = figure.subplots(1, len(stages), sharey=True, squeeze=False)[0]
        figure.subplots_adjust(left=0.07, right=0.99, top=0.80, bottom=0.27, wspace=0.08)
        top = max(int(frame.groupby(["stage", "moment"])["bytes"].sum().max()), device.capacity)
        for ax, stage in zip(axes, stages):
            rows = frame[frame["stage"] == stage]
            table = rows.pivot(index="moment", columns="component", values="bytes")
            x = table.index.to_numpy()
            bottom = np.zeros(len(x))
            for component in ORDER:
                if component in table and table[component].any():
                    values = table[component].to_numpy() / per
                    ax.fill_between(x, bottom, bottom + values, step="mid", color=COLORS[component],
                                    linewidth=0, gid=f"stage {stage}/{component}")
                    bottom = bottom + values
            totals = table.sum(axis=1)
            peak_moment = int(totals.idxmax())
            peak = int(totals.max())
            marks[stage] = {"axes": ax, "moment": peak_moment, "bytes": peak}
            ax.plot([peak_moment], [peak / per], marker="v", color="black", markersize=7,
                    gid=f"stage {stage}/peak")
            ax.annotate(f"peak {format_value(peak / per)} {unit}", (peak_moment, peak / per),
                        xytext=(0, 8), textcoords="offset points", ha="center", fontsize=9)
            ax.axhline(device.capacity / per, color=DEVICE_COLOR, linestyle="--", linewidth=1.2)
            ax.set_title(STRATEGY_NAMES[stage], fontsize=10, fontweight="bold")
            phases = rows.drop_duplicates("moment").set_index("moment")["phase"]
            ticks = [int(phases[phases == p].index.to_numpy().mean()) for p in PHASES if (phases == p).any()]
            ax.set_xticks(ticks, [p.replace("optimizer step", "step") for p in PHASES if (phases == p).any()],
                          fontsize=8)
            ax.set_xlim(x[0] - 0.5, x[-1] + 0.5)
            ax.set_ylim(0, 1.15 * top / per)
        axes[0].set_ylabel(f"live on one GPU [{unit}]")
        model, settings = frame.attrs.get("model"), frame.attrs.get("settings")
        name = getattr(model, "name", "the model")
        where = (f", {settings.seq_len:,} tokens x {settings.micro_batch}, {settings.recompute} "
                 "recomputation") if settings is not None else ""
        figure.suptitle(f"One training step of {name}{where}: one GPU's memory",
                        x=0.07, ha="left", fontsize=12, fontweight="bold")
        figure.text(0.07, 0.86, f"Forward layer by layer, the loss, backward layer by layer, the "
                    f"optimizer step; dashed: {device_label(device, unit)}; the peak is the highest "
                    "moment", fontsize=9)
        present = [c for c in ORDER if (frame.loc[frame["component"] == c, "bytes"] > 0).any()]
        handles = [Patch(color=COLORS[c], label=LABELS[c]) for c in present]
        figure.legend(handles=handles, loc="lower center", ncol=min(3, len(handles)), frameon=False,
                      bbox_to_anchor=(0.53, 0.0))
    return figure, marks
