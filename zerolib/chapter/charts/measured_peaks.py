"""Figure: published measured peaks of real training runs against zerolib's prediction.

:func:`measured_peaks_figure` draws one point per predicted row of ``data/measured_peaks.csv``
(a frame with ``id``, ``measured``, ``measured_bytes``, ``predicted_bytes`` and
``tolerance``): the measurement across, the prediction up, both in GiB on logarithmic axes,
the line where they are equal and the band of 10 % around it. Every point is labelled with its
row's id, in a column right of the axes ordered by the prediction and joined to its point; a
point's colour says what was measured (the reserved peak, the allocated one, or torchtune's
active bytes), its marker whether the row holds to 10 %."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from zerolib.chapter.style import OKABE_ITO, add_axes, make_titles, new_figure, style

COLUMNS = ("id", "measured", "measured_bytes", "predicted_bytes", "tolerance")
KIND_COLORS = {"reserved": OKABE_ITO["blue"], "allocated": OKABE_ITO["vermillion"],
               "active": OKABE_ITO["orange"]}
GIB = 2**30
_SIZE = (11.0, 8.0)
_MARGINS = (0.9, 3.3, 1.1, 0.9)   # the labels' column at the right


def check_frame(frame) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a DataFrame, got {type(frame).__name__}")
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"frame needs the columns {', '.join(COLUMNS)}; missing {', '.join(missing)}")
    if frame.empty or not set(frame["measured"]) <= set(KIND_COLORS):
        raise ValueError(f"frame needs rows measured as one of {', '.join(KIND_COLORS)}")
    return frame


def measured_peaks_figure(frame: pd.DataFrame, title: str = "Predicted against measured peaks",
                          subtitle: str = "", dpi: float = 100) -> Figure:
    """The figure of ``frame`` (see the module doc), a new Figure."""
    frame = check_frame(frame)
    figure = new_figure(_SIZE, dpi)
    ax = add_axes(figure, _MARGINS)
    measured = frame["measured_bytes"].to_numpy(dtype=float) / GIB
    predicted = frame["predicted_bytes"].to_numpy(dtype=float) / GIB
    low = 2 ** np.floor(np.log2(min(measured.min(), predicted.min()) * 0.8))
    high = 2 ** np.ceil(np.log2(max(measured.max(), predicted.max()) * 1.2))
    with style():
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        line = np.array([low, high])
        ax.fill_between(line, line * 0.9, line * 1.1, color="#DDDDDD", zorder=1, linewidth=0)
        ax.plot(line, line, color="#555555", linewidth=1, zorder=2)
        within = (frame["tolerance"].astype(str) == "0.1").to_numpy()
        for index, (x, y) in enumerate(zip(measured, predicted)):
            ax.plot([x], [y], marker="o" if within[index] else "X", markersize=7, linestyle="none",
                    color=KIND_COLORS[frame["measured"].iloc[index]], markeredgecolor="white",
                    zorder=3)
        # Every point labelled: the ids in a column right of the axes, in the order of the
        # points' predictions (top to bottom), each joined to its point by a thin line.
        order = sorted(range(len(frame)), key=lambda i: (-predicted[i], -measured[i], i))
        for rank, index in enumerate(order):
            label_y = 1 - (rank + 0.5) / len(order)
            ax.annotate(frame["id"].iloc[index], (measured[index], predicted[index]),
                        xytext=(1.04, label_y), textcoords="axes fraction", fontsize=7,
                        color="#333333", ha="left", va="center", annotation_clip=False,
                        arrowprops=dict(arrowstyle="-", color="#BBBBBB", linewidth=0.5,
                                        shrinkA=0, shrinkB=3))
        ax.set_xlabel("measured peak per GPU [GiB] (torch.cuda max reserved, max allocated, "
                      "or active bytes)")
        ax.set_ylabel("zerolib's predicted peak per GPU [GiB]")
        ticks = [2.0 ** k for k in range(int(np.log2(low)), int(np.log2(high)) + 1)]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        handles = [Line2D([], [], marker="o", linestyle="none", color=color, label=kind)
                   for kind, color in KIND_COLORS.items() if kind in set(frame["measured"])]
        handles += [Line2D([], [], marker="X", linestyle="none", color="#555555",
                           label="outside 10 % (a finding)"),
                    Line2D([], [], color="#DDDDDD", linewidth=8, label="within 10 %")]
        ax.legend(handles=handles, loc="upper left", frameon=False, fontsize=9)
        make_titles(ax, title, subtitle)
    return figure
