"""The placement explorer: where a model's state lives under each option, for a chosen model
size, GPU count, shard group, node size, host memory, device and unit.

:func:`summary_html` and :func:`options_table_html` are pure (tested without widgets): they read
the drawn :func:`zerolib.core.memory.tables.tier_table` and judge the GPU tier against the device and
each node's CPU memory against the host memory.
"""
from __future__ import annotations

import html
from contextlib import ExitStack
from dataclasses import replace

import pandas as pd
from matplotlib.transforms import offset_copy

from zerolib.chapter.charts.offload_tiers import (
    FIGSIZE,
    MARGINS,
    draw_offload_tiers,
    offload_blocks,
    update_offload_tiers,
)
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    Explorer,
    device_and_unit,
    in_unit,
    widgets,
)
from zerolib.chapter.explorers.gpu_count import MODEL_SIZES
from zerolib.chapter.style import add_axes, device_label, gpus_text, new_figure, style
from zerolib.core.catalogue.devices import Device, capacity_text
from zerolib.core.memory.placement import TIERS
from zerolib.core.memory.tables import divisors, tier_table
from zerolib.core.units import GiB, format_count

GPU_COUNTS = tuple(2**k for k in range(11))          # 1 to 1,024
GPUS_PER_NODE = (1, 2, 4, 8, 16)
# CPU memory per node a reader can pick (a DGX A100 has 1 TiB, a DGX H100 2 TiB, the DGX-2 of
# the ZeRO-Infinity paper 1.5 TB).
TiB = 1024 * GiB
HOST_MEMORIES = (256 * GiB, 512 * GiB, TiB, 1536 * GiB, 2 * TiB, 4 * TiB)
# The published figure is 12 inches wide, its legend right of the bars: 960 pixels at the
# explorer's resolution, wider than JupyterLab's output area beside its file browser in a
# 1,280-pixel window. The explorer draws it 10.5 inches wide (840 pixels), the legend in one row
# under the options' names, so the bars keep the room their labels need.
EXPLORER_FIGSIZE = (10.5, FIGSIZE[1] + 0.5)
EXPLORER_MARGINS = (MARGINS[0], 0.35, MARGINS[2] + 0.5, MARGINS[3])
LEGEND_BELOW_PT = 64      # under the four lines of the options' names


def _legend_below(artists):
    """The same legend entries, in one row under the axes."""
    ax = artists.ax
    artists.legend.remove()
    handles = [*(artists.bars[tier] for tier in reversed(TIERS)), artists.device_line]
    with style():
        legend = ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                           bbox_transform=offset_copy(ax.transAxes, ax.figure,
                                                      y=-LEGEND_BELOW_PT, units="points"),
                           ncols=len(handles), frameon=False, handlelength=2.2,
                           borderaxespad=0.0, columnspacing=1.5)
    return replace(artists, legend=legend)


def explorer_figure(table: pd.DataFrame, device, unit: str, dpi: float = EXPLORER_DPI):
    """A new Figure drawn as the explorer draws it (narrower, the legend below), and its artists."""
    figure = new_figure(EXPLORER_FIGSIZE, dpi)
    return figure, _legend_below(draw_offload_tiers(add_axes(figure, EXPLORER_MARGINS), table,
                                                    device, unit))


def _size(n_bytes: int) -> str:
    return f"{n_bytes // TiB:g} TiB" if n_bytes % TiB == 0 else f"{n_bytes / GiB:,.0f} GiB"


def option_rows(table: pd.DataFrame, device: Device, host_memory: int) -> list[dict]:
    """Per option: offered, bytes on the GPU (per GPU), CPU and NVMe per node, and whether the
    GPU tier fits the device and the node's CPU tier fits ``host_memory``."""
    records = table.to_dict("records")
    by_option: dict[str, dict] = {}
    for record in records:    # every option has one record per tier (tier_table)
        by_option.setdefault(record["option"], {})[record["tier"]] = record
    rows = []
    for option, tiers in by_option.items():
        offered = bool(tiers["gpu"]["offered"])
        gpu, cpu_node = int(tiers["gpu"]["bytes"]), int(tiers["cpu"]["per_node"])
        rows.append({"option": option, "offered": offered, "note": tiers["gpu"]["note"],
                     "gpu": gpu, "cpu_per_node": cpu_node,
                     "nvme_per_node": int(tiers["nvme"]["per_node"]),
                     "gpu_fits": offered and gpu <= device.capacity,
                     "host_fits": offered and cpu_node <= host_memory})
    return rows


def _and(names) -> str:
    names = list(names)
    if not names:
        return "none"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def summary_html(table: pd.DataFrame, device: Device, unit: str, host_memory: int) -> str:
    """The lines above the figure: the setting, which options fit the GPU and the host."""
    a = table.attrs
    gpus, group = a["gpus"], a["shard_group"] or a["gpus"]
    rows = option_rows(table, device, host_memory)
    both = [r["option"] for r in rows if r["gpu_fits"] and r["host_fits"]]
    gpu_only = [r["option"] for r in rows if r["gpu_fits"] and not r["host_fits"]]
    return (
        f"<p><b>{format_count(a['params'])} parameters</b> on <b>{gpus_text(gpus)}</b>, sharded over "
        f"groups of {group:,} ({gpus // group:,} replica{'s' if gpus // group != 1 else ''}), "
        f"{gpus_text(a['gpus_on_node'])} per node with {html.escape(_size(host_memory))} of CPU memory "
        f"each."
        f"<br>The GPU's share and the node's CPU memory both fit under: "
        f"{html.escape(_and(both))}."
        + (f"<br>Only the GPU fits (the node's CPU memory is too small) under: "
           f"{html.escape(_and(gpu_only))}." if gpu_only else "")
        + "<br>Model state only: activations and buffers come on top of the GPU bars (notebook 4)."
        # The placement is memory alone: no engine's collectives or overlap are timed here.
        "<br>The options are DeepSpeed 0.19.8's (offload_optimizer, offload_param, ZeRO++'s hpZ); "
        "no step time, so no engine's schedule enters."
        f"<br>Reference line: {html.escape(device_label(device, unit))}.</p>")


def options_table_html(table: pd.DataFrame, device: Device, unit: str, host_memory: int) -> str:
    """Per option: GPU per GPU, CPU and NVMe per node, and the two verdicts."""
    def right(text):
        return f"<td style='text-align:right'>{text}</td>"

    cells = []
    for r in option_rows(table, device, host_memory):
        if not r["offered"]:
            cells.append(f"<tr><td class='prose'>{html.escape(r['option'])}</td><td class='prose' "
                         f"colspan='5'>not offered: "
                         f"{html.escape(r['note'])}</td></tr>")
            continue
        cells.append(
            f"<tr><td class='prose'>{html.escape(r['option'])}</td>{right(in_unit(r['gpu'], unit))}"
            f"<td>{'fits' if r['gpu_fits'] else 'too big'}</td>"
            f"{right(in_unit(r['cpu_per_node'], unit))}"
            f"<td>{'fits' if r['host_fits'] else 'too big'}</td>"
            f"{right(in_unit(r['nvme_per_node'], unit))}</tr>")
    return (
        f"<table><caption>Model state per option against the {html.escape(device.label)} "
        f"({html.escape(capacity_text(device, unit))}) and {html.escape(_size(host_memory))} of "
        f"CPU memory per node</caption>"
        "<thead><tr><th>Option</th><th>On each GPU</th><th>GPU</th><th>CPU memory per node</th>"
        "<th>Host</th><th>NVMe per node</th></tr></thead>"
        f"<tbody>{''.join(cells)}</tbody></table>")


class PlacementExplorer(Explorer):
    """Where the state lives, option by option, against the device and the host.

    Controls: ``params`` (model size), ``gpus`` (1 to 1,024), ``shard_group`` (a divisor of the
    GPU count; the options follow the GPU count), ``gpus_per_node``, ``host_memory`` (CPU memory
    per node), ``device``, ``unit``. ``.data`` is :func:`zerolib.core.memory.tables.tier_table`.
    """

    PANEL = (
        ("Model and cluster", ("params", "gpus", "shard_group", "gpus_per_node",
                                   "host_memory")),
        ("Device", ("device", "unit", "capacity")),
    )

    def __init__(self, params: int = 70 * 10**9, gpus: int = 64, shard_group: int | None = None,
                 gpus_per_node: int = 8, host_memory: int = 1024 * GiB, device: str = "a100-80gb",
                 unit: str = "GB", dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = widgets()
        if params not in MODEL_SIZES:
            raise ValueError(f"params must be one of {', '.join(format_count(p) for p in MODEL_SIZES)}")
        if gpus not in GPU_COUNTS:
            raise ValueError(f"gpus must be one of {', '.join(map(str, GPU_COUNTS))}, got {gpus!r}")
        shard_group = gpus if shard_group is None else shard_group
        if shard_group not in divisors(gpus):
            raise ValueError(f"shard_group must divide gpus ({gpus}), got {shard_group!r}")
        if gpus_per_node not in GPUS_PER_NODE:
            raise ValueError(f"gpus_per_node must be one of {GPUS_PER_NODE}, got {gpus_per_node!r}")
        if host_memory not in HOST_MEMORIES:
            raise ValueError(f"host_memory must be one of {', '.join(map(_size, HOST_MEMORIES))}")
        wide = {"description_width": "initial"}
        self._after_image = ExitStack()   # widget messages held until the image is sent
        self.controls = {
            "params": w.SelectionSlider(options=[(format_count(p), p) for p in MODEL_SIZES],
                                        value=params, description="Model size",
                                        style=wide, continuous_update=True),
            "gpus": w.SelectionSlider(options=[(str(n), n) for n in GPU_COUNTS], value=gpus,
                                      description="GPUs", continuous_update=True),
            "shard_group": w.SelectionSlider(options=self._group_options(gpus), value=shard_group,
                                             description="Shard group", style=wide,
                                             continuous_update=True),
            "gpus_per_node": w.ToggleButtons(options=list(GPUS_PER_NODE), value=gpus_per_node,
                                             description="GPUs/node",
                                             style={"button_width": "42px"}),
            "host_memory": w.Dropdown(options=[(_size(m), m) for m in HOST_MEMORIES],
                                      value=host_memory, description="CPU memory/node",
                                      style=wide),
            **device_and_unit(device, unit),
        }
        self.data = self._table()
        # Registered before the redraw observer (_start), so the shard group follows the GPU
        # count before the one redraw that change causes.
        self.controls["gpus"].observe(self.reporting(self._gpus_changed), names="value")
        self._start(EXPLORER_FIGSIZE, EXPLORER_MARGINS, offload_blocks,
                    lambda ax: _legend_below(draw_offload_tiers(ax, self.data, self.device, self.unit)))
        self.widget = self._box()

    @staticmethod
    def _group_options(gpus: int) -> list[tuple[str, int]]:
        return [(f"{g}" + (" (all)" if g == gpus else ""), g) for g in divisors(gpus)]

    def _followers(self, name, value) -> dict:
        """The shard group at a GPU count worked out ahead, as :meth:`_gpus_changed` sets it."""
        if name != "gpus":
            return {}
        return {"shard_group": self._group_for(self.controls["shard_group"].value,
                                               self.controls["gpus"].value, value)}

    def redraw(self):
        """The base redraw, then the shard group's held messages: the figure is what a reader
        waits for, and the slider's new options can follow it."""
        try:
            super().redraw()
        finally:
            if not self._holding:
                self._after_image.close()

    @staticmethod
    def _group_for(group: int, old_gpus: int, new_gpus: int) -> int:
        return new_gpus if group == old_gpus else min(group, new_gpus)

    def _gpus_changed(self, change):
        """Keep the shard group a divisor of the new GPU count ("all" stays "all"); the redraw
        observer that runs next draws both changes at once."""
        control = self.controls["shard_group"]
        # Its new options and value reach the browser after the image (see :meth:`redraw`).
        self._after_image.enter_context(control.hold_sync())
        old_gpus, new_gpus = change["old"], change["new"]
        value = self._group_for(control.value, old_gpus, new_gpus)
        self._holding = True     # the shard group's own change must not redraw on its own
        try:
            control.options = self._group_options(new_gpus)
            control.value = value
        finally:
            self._holding = False

    @property
    def params(self) -> int:
        return int(self.controls["params"].value)

    @property
    def gpus(self) -> int:
        return int(self.controls["gpus"].value)

    @property
    def shard_group(self) -> int:
        return int(self.controls["shard_group"].value)

    @property
    def host_memory(self) -> int:
        return int(self.controls["host_memory"].value)

    def _table(self):
        return tier_table(self.params, self.gpus, shard_group=self.shard_group,
                          gpus_per_node=int(self.controls["gpus_per_node"].value))

    def _update(self) -> bool:
        self.data = self._table()
        update_offload_tiers(self.artists, self.data, self.device, self.unit)
        self._describe()
        return True

    def _describe(self):
        self.summary.value = summary_html(self.data, self.device, self.unit, self.host_memory)
        self.table.value = options_table_html(self.data, self.device, self.unit, self.host_memory)
