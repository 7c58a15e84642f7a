"""The planner explorer: every configuration of a model on a cluster the reader picks, the peak
per GPU of each against its step time and the capacity line, the fastest that fit and why the
rest are rejected.

:func:`summary_html` and :func:`ranking_html` are pure (tested without widgets): they read a
:class:`zerolib.core.planner.Plan` (its counts, its ranked fits, its rejections by rule).
"""
from __future__ import annotations

import html

from zerolib.chapter.charts.plan_peaks import (
    FIGSIZE,
    MARGINS,
    draw_plan_peaks,
    plan_peaks_blocks,
    update_plan_peaks,
)
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    Explorer,
    device_and_unit,
    in_unit,
    widgets,
)
from zerolib.core.devices import DEVICES
from zerolib.core.links import LINKS
from zerolib.core.nodes import NODES
from zerolib.core.offload_traffic import DEFAULT_HOST_LINK, HOST_LINKS
from zerolib.core.planner import (
    DEFAULT_LINKS,
    PLAN_HEADER,
    PLAN_LEFT_OUT,
    SHARD_GROUPS,
    Plan,
    describe_configuration,
    plan,
)
from zerolib.core.step import DEFAULT_MFU
from zerolib.core.units import GiB, format_value

MODELS = ("llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-70b", "mixtral-8x7b",
          "llama-3.1-405b")
GPU_STEPS = tuple(2**k for k in range(3, 11))          # 8 to 1,024
PER_NODE = (4, 8, 16)
SEQ_STEPS = tuple(2**k for k in range(10, 16))         # 1,024 to 32,768 tokens
BATCH_STEPS = tuple(2**k for k in range(6, 13))        # 64 to 4,096 sequences
MFU_RANGE = (0.2, 0.6, 0.05)                           # min, max, step
TiB = 1024 * GiB
HOST_MEMORIES = (None, 512 * GiB, TiB, 2 * TiB)        # None: not given (offload never fits)
TOP = 8                                                # rows of the ranking shown


def _host(value) -> str:
    return "not given" if value is None else (f"{value // TiB} TiB" if value % TiB == 0
                                              else f"{value // GiB} GiB")


def summary_html(result: Plan, unit: str) -> str:
    """The lines above the figure: the cluster, how many configurations fit, the fastest, and
    that the ranking is a model's."""
    s = result.settings
    counts = result.counts()
    fits = result.fits
    if len(fits):
        best = fits.iloc[0]
        verdict = (f"Fastest that fits: {describe_configuration(best)}: {format_value(best['step_seconds'])} s "
                   f"per step ({best['network_wait_fraction']:.0%} waiting for the network, "
                   f"{best['bubble_fraction']:.0%} in the pipeline bubble), "
                   f"{in_unit(best['peak_bytes'], unit)} per GPU.")
    else:
        closest = result.rejected[result.rejected["rule"] == "capacity"]
        verdict = "Nothing fits." + (
            f" Closest: {closest['example'].iloc[0]}, {in_unit(closest['example_bytes'].iloc[0], unit)}."
            if len(closest) else "")
    ic = s.interconnect
    where = ic.label if ic.network is None else f"{ic.name}, {s.gpus_per_node} GPUs per node"
    return (f"<p><b>{html.escape(s.model.name)}</b> on <b>{s.gpus:,} {html.escape(s.device.label)}"
            f"</b> ({html.escape(where)}), sequence {s.seq_len:,}, global batch "
            f"{s.global_batch:,} sequences, {s.mfu:.0%} of peak. {counts['configurations']:,} "
            f"configurations, {counts['runnable']:,} can run, <b>{counts['fit']:,} fit</b>."
            f"<br>{html.escape(verdict)}"
            f"<br><i>{html.escape(PLAN_HEADER)} Left out: {html.escape('; '.join(PLAN_LEFT_OUT))}.</i></p>")


def ranking_html(result: Plan, unit: str, top: int = TOP) -> str:
    """The fastest configurations that fit, then the rejections by rule with their counts."""
    def right(text):
        return f"<td style='text-align:right'>{text}</td>"

    rows = []
    for _, row in result.fits.head(top).iterrows():
        rows.append(f"<tr>{right(int(row['rank']))}<td>{html.escape(describe_configuration(row))}</td>"
                    f"{right(in_unit(row['peak_bytes'], unit))}"
                    f"{right(in_unit(row['headroom_bytes'], unit))}"
                    f"{right(format_value(row['step_seconds']) + ' s')}</tr>")
    rejected = "".join(
        f"<tr>{right(f'{r.configurations:,}')}<td>{html.escape(r.reason)}</td></tr>"
        for r in result.rejected.itertuples())
    return (f"<table><caption>The {min(top, len(result.fits))} fastest of "
            f"{len(result.fits):,} that fit</caption><thead><tr><th>Rank</th>"
            "<th>Configuration</th><th>Peak per GPU</th><th>Headroom</th><th>Step</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table>"
            "<table><caption>Rejected, by the first rule each breaks</caption><thead><tr>"
            f"<th>Configurations</th><th>Rule</th></tr></thead><tbody>{rejected}</tbody></table>")


class PlannerExplorer(Explorer):
    """The planner over its inputs.

    Controls: ``model``, ``gpus`` (8 to 1,024), ``gpus_per_node``, ``device`` (those with a
    usual node), ``links`` (the device's usual node, or another node), ``seq_len``,
    ``global_batch``, ``mfu``, ``host_memory`` (CPU memory per node, or not given),
    ``host_link`` (the PCIe link offload copies over), ``shard_groups`` ("all": every G dividing
    d, as ``zerolib plan``; "whole": G = d only), ``unit``.
    ``.plan`` is the :class:`zerolib.core.planner.Plan`, ``.data`` its ``valid`` frame.
    """

    def __init__(self, model: str = "llama-2-70b", gpus: int = 64, gpus_per_node: int = 8,
                 device: str = "a100-80gb", links: str | None = None, seq_len: int = 4096,
                 global_batch: int = 1024, mfu: float = DEFAULT_MFU, host_memory: int | None = None,
                 host_link: str = DEFAULT_HOST_LINK, shard_groups: str = "all", unit: str = "GB",
                 dpi: float = EXPLORER_DPI):
        super().__init__(dpi)
        w = widgets()
        for name, value, allowed in (("model", model, MODELS), ("gpus", gpus, GPU_STEPS),
                                     ("gpus_per_node", gpus_per_node, PER_NODE),
                                     ("seq_len", seq_len, SEQ_STEPS),
                                     ("global_batch", global_batch, BATCH_STEPS),
                                     ("host_memory", host_memory, HOST_MEMORIES),
                                     ("host_link", host_link, HOST_LINKS),
                                     ("shard_groups", shard_groups, SHARD_GROUPS),
                                     ("links", links, (None, *NODES))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, "
                                 f"got {value!r}")
        wide = {"description_width": "initial"}
        controls = device_and_unit(device, unit)
        controls["device"].options = [(d.label, d.name) for d in DEVICES.values()
                                      if d.name in DEFAULT_LINKS]
        controls["device"].value = device
        self.controls = {
            "model": w.Dropdown(options=list(MODELS), value=model, description="Model"),
            "gpus": w.SelectionSlider(options=[(f"{n:,}", n) for n in GPU_STEPS], value=gpus,
                                      description="GPUs", continuous_update=True),
            "gpus_per_node": w.ToggleButtons(options=list(PER_NODE), value=gpus_per_node,
                                             description="GPUs/node",
                                             style={"button_width": "42px"}),
            "links": w.Dropdown(options=[("the device's usual node", None)]
                                + [(name, name) for name in NODES], value=links,
                                description="Links", style=wide),
            "seq_len": w.SelectionSlider(options=[(f"{n:,}", n) for n in SEQ_STEPS],
                                         value=seq_len, description="Sequence", style=wide,
                                         continuous_update=True),
            "global_batch": w.SelectionSlider(options=[(f"{n:,}", n) for n in BATCH_STEPS],
                                              value=global_batch, description="Global batch",
                                              style=wide, continuous_update=True),
            "mfu": w.FloatSlider(value=mfu, min=MFU_RANGE[0], max=MFU_RANGE[1], step=MFU_RANGE[2],
                                 readout_format=".2f", description="Utilisation", style=wide),
            "host_memory": w.Dropdown(options=[(_host(m), m) for m in HOST_MEMORIES],
                                      value=host_memory, description="CPU memory/node",
                                      style=wide),
            "host_link": w.Dropdown(options=[(LINKS[name].label, name) for name in HOST_LINKS],
                                    value=host_link, description="Host link", style=wide),
            "shard_groups": w.ToggleButtons(options=[("G = d", "whole"), ("every G", "all")],
                                            value=shard_groups, description="Shard groups",
                                            style={"button_width": "70px"}),
            **controls,
        }
        self.plan, self._planned = self._plan(), self._inputs()
        self.data = self.plan.valid
        self._start(FIGSIZE, MARGINS, plan_peaks_blocks,
                    lambda ax: draw_plan_peaks(ax, self.data, self.unit))
        c = self.controls
        self.widget = self._box([
            w.HBox([c["model"], c["device"], c["links"]]),
            w.HBox([c["gpus"], c["gpus_per_node"]]),
            w.HBox([c["seq_len"], c["global_batch"]]),
            w.HBox([c["mfu"], c["host_memory"], c["host_link"]]),
            w.HBox([c["shard_groups"], c["unit"]]),
        ])

    def _inputs(self) -> tuple:
        """Every control the plan depends on (all but the unit, which only changes the figure)."""
        return tuple(control.value for name, control in self.controls.items() if name != "unit")

    def _plan(self) -> Plan:
        c = self.controls
        return plan(c["model"].value, int(c["gpus"].value), int(c["gpus_per_node"].value),
                    self.device, int(c["seq_len"].value), int(c["global_batch"].value),
                    links=c["links"].value, mfu=float(c["mfu"].value),
                    host_memory=c["host_memory"].value, host_link=c["host_link"].value,
                    shard_groups=c["shard_groups"].value)

    def _update(self) -> bool:
        if self._inputs() != self._planned:
            self.plan, self._planned = self._plan(), self._inputs()
            self.data = self.plan.valid
        update_plan_peaks(self.artists, self.data, self.unit)
        self._describe()
        return True

    def _describe(self):
        self.summary.value = summary_html(self.plan, self.unit)
        self.table.value = ranking_html(self.plan, self.unit)
