"""The step-time explorer: per-GPU memory against step time, one point per stage, for a model on
a cluster the reader chooses.

:func:`summary_html` and :func:`stage_table_html` are pure (tested without widgets): they read
the drawn :func:`zerolib.core.step.tables.tradeoff_frame` and judge the **peak** (model state +
working set) against the device and the step time against the compute alone, for the engine
chosen (:mod:`zerolib.core.step.engines`: its stages, collectives and overlap rule), which the
summary names.
"""
from __future__ import annotations

import html
from types import MappingProxyType

import pandas as pd

from zerolib.chapter.charts.tradeoff import (
    FIGSIZE,
    MARGINS,
    draw_memory_vs_step_time,
    engine_words,
    tradeoff_blocks,
    update_memory_vs_step_time,
)
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    Explorer,
    device_and_unit,
    in_unit,
    widgets,
)
from zerolib.chapter.explorers.start import starting_values
from zerolib.chapter.style import gpus_text
from zerolib.core.catalogue.devices import Device, capacity_text
from zerolib.core.catalogue.links import LINKS
from zerolib.core.catalogue.models import MODELS, get_model
from zerolib.core.catalogue.nodes import NODES, interconnect
from zerolib.core.memory.accounting import STAGES, STRATEGY_NAMES, Layout, get_layout
from zerolib.core.memory.working_set import WorkingSetSettings
from zerolib.core.run import Run
from zerolib.core.step.engines import DEFAULT_ENGINE, ENGINES
from zerolib.core.step.tables import tradeoff_frame
from zerolib.core.step.time import DEFAULT_MFU
from zerolib.core.units import GB, format_value

GPU_STEPS = tuple(2**k for k in range(11))                 # 1 to 1,024
PER_NODE_STEPS = (0, 1, 2, 4, 8, 16, 32)                   # 0: the node's own
SEQ_LEN = 4096
TOKEN_STEPS = tuple(SEQ_LEN * m for m in (1, 2, 4, 8, 16))  # tokens per GPU per step
MFU_RANGE = (0.1, 0.8, 0.05)                               # min, max, step


def settings_for(model: str, tokens_per_gpu: int) -> WorkingSetSettings:
    """How the explorer runs ``model``: sequences of 4,096 tokens (the model's context if
    shorter), as many per GPU as ``tokens_per_gpu`` takes, flash attention, no recomputation."""
    seq = min(SEQ_LEN, get_model(model).max_positions)
    if tokens_per_gpu % seq:
        raise ValueError(f"tokens_per_gpu must be a multiple of {seq:,}, got {tokens_per_gpu!r}")
    return WorkingSetSettings(seq_len=seq, micro_batch=tokens_per_gpu // seq)


def _rows(frame: pd.DataFrame, device: Device) -> list[dict]:
    return [{"stage": int(row.stage), "memory": int(row.memory_bytes),
             "fits": int(row.memory_bytes) <= device.capacity, "step": float(row.step_seconds),
             "communication": float(row.communication_seconds), "sent": int(row.sent_bytes),
             "wait": float(row.network_wait_fraction)} for row in frame.itertuples()]


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def summary_html(frame: pd.DataFrame, device: Device, unit: str) -> str:
    """The lines above the figure: the run, which stages' peaks fit, the fastest of those, the
    compute alone."""
    attrs = frame.attrs
    ic, compute = attrs["interconnect"], attrs["compute"]
    rows = _rows(frame, device)
    fitting = [row for row in rows if row["fits"]]
    if fitting:
        fastest = min(fitting, key=lambda row: (row["step"], row["stage"]))
        names = _and(STRATEGY_NAMES[row["stage"]] for row in fitting)
        verdict = (f"Peaks that fit the {device.label}: {names}. Fastest of them: "
                   f"{STRATEGY_NAMES[fastest['stage']]}, {format_value(fastest['step'])} s per "
                   f"step ({fastest['wait']:.0%} of it waiting for the network).")
    else:
        smallest = min(rows, key=lambda row: row["memory"])
        verdict = (f"No strategy's peak fits the {device.label}: the smallest is "
                   f"{in_unit(smallest['memory'], unit)} ({STRATEGY_NAMES[smallest['stage']]}).")
    where = ic.label if ic.gpus_per_node is None else (
        f"{ic.label} nodes of {gpus_text(ic.gpus_per_node)} with {ic.nics} x {ic.network.label}")
    gpus = attrs["gpus"]
    engine = attrs["engine"]
    verdict = (f"Timed for {engine_words(attrs)} (stages "
               f"{', '.join(map(str, engine.stages))}, its collectives and overlap rule). "
               f"{verdict}")
    return (f"<p><b>{html.escape(attrs['model'].name)}</b> on <b>{gpus:,} "
            f"GPU{'s' if gpus != 1 else ''}</b> ({html.escape(device.label)}), "
            f"{html.escape(where)}: bus bandwidth {format_value(attrs['bus_bandwidth'] / GB)} GB/s "
            f"per GPU. {compute.tokens_per_gpu:,} tokens per GPU per step at "
            f"{compute.mfu:.0%} of {format_value(device.peak_flops / 10**12)} TFLOP/s: "
            f"{format_value(float(frame['compute_seconds'].iloc[0]))} s of compute."
            f"<br>{html.escape(verdict)}</p>")


def stage_table_html(frame: pd.DataFrame, device: Device, unit: str) -> str:
    """Per stage: peak memory, whether it fits, bytes sent per GPU, communication, step time and
    the share of it spent waiting for the network."""
    def right(text):
        return f"<td style='text-align:right'>{text}</td>"
    cells = []
    for row in _rows(frame, device):
        wait = f"{row['wait']:.0%}"
        cells.append(
            f"<tr><td>{html.escape(STRATEGY_NAMES[row['stage']])}</td>"
            f"{right(in_unit(row['memory'], unit))}<td>{'fits' if row['fits'] else 'too big'}</td>"
            f"{right(in_unit(row['sent'], unit))}{right(format_value(row['communication']) + ' s')}"
            f"{right(format_value(row['step']) + ' s')}{right(wait)}</tr>")
    return (f"<table><caption>Per GPU and step against the {html.escape(device.label)} "
            f"({html.escape(capacity_text(device, unit))})</caption>"
            "<thead><tr><th>Strategy</th><th>Peak memory</th><th>Fits?</th><th>Sent (= received)"
            "</th><th>All collectives</th><th>Step time</th><th class='prose'>Waiting for the network</th>"
            f"</tr></thead><tbody>{''.join(cells)}</tbody></table>")


class StepTimeExplorer(Explorer):
    """What ZeRO costs in time for what it saves in memory, on a cluster the reader picks.

    Controls: ``model`` (a preset), ``gpus`` (1 to 1,024, powers of two), ``link`` (a node of
    :data:`zerolib.core.catalogue.nodes.NODES` or a link of :data:`zerolib.core.catalogue.links.LINKS`),
    ``gpus_per_node`` (0 = the node's own; ignored for a bare link), ``tokens_per_gpu``
    (sequences of 4,096 tokens per GPU and step), ``mfu`` (utilisation of the peak),
    ``engine`` (whose schedule and overlap rule: :data:`zerolib.core.step.engines.ENGINES`, by
    default the one ``zerolib estimate`` and ``plan`` default to), ``device``, ``unit``.
    ``.data`` is :func:`zerolib.core.step.tables.tradeoff_frame` over the engine's stages.
    """

    PANEL = (
        ("Model and cluster", ("model", "gpus", "link", "gpus_per_node")),
        ("Each step", ("tokens_per_gpu", "mfu", "engine")),
        ("Device", ("device", "unit", "capacity")),
    )

    # Where it starts, unless a run or fields say otherwise (explorers.start); gpus_per_node 0:
    # the node's own.
    STARTS_AT = MappingProxyType({"model": "llama-2-7b", "gpus": 64, "link": "dgx-h100",
                                  "gpus_per_node": 0, "tokens_per_gpu": SEQ_LEN, "mfu": DEFAULT_MFU,
                                  "device": "h100-80gb", "layout": "mixed-adam",
                                  "engine": DEFAULT_ENGINE})

    def __init__(self, run: Run | None = None, unit: str = "GB", dpi: float = EXPLORER_DPI,
                 **fields):
        start = starting_values(self.STARTS_AT, run, fields)
        model, gpus, link, gpus_per_node, tokens_per_gpu, mfu, device, layout, engine = (
            start[name] for name in self.STARTS_AT)
        if run is not None and "tokens_per_gpu" not in fields and run.batch.tokens_per_gpu is None:
            tokens_per_gpu = run.seq_len * run.batch.micro_batch
        super().__init__(dpi)
        w = widgets()
        if not isinstance(model, str) or get_model(model).name not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
        if gpus not in GPU_STEPS:
            raise ValueError(f"gpus must be one of {', '.join(map(str, GPU_STEPS))}, got {gpus!r}")
        if link not in NODES and link not in LINKS:
            raise ValueError(f"link must be one of {', '.join([*NODES, *LINKS])}, got {link!r}")
        if gpus_per_node not in PER_NODE_STEPS:
            raise ValueError(f"gpus_per_node must be one of {PER_NODE_STEPS}, got {gpus_per_node!r}")
        if tokens_per_gpu not in TOKEN_STEPS:
            raise ValueError(f"tokens_per_gpu must be one of {TOKEN_STEPS}, got {tokens_per_gpu!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        low, high, _ = MFU_RANGE
        if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not low <= mfu <= high:
            raise ValueError(f"mfu must be a number from {low} to {high}, got {mfu!r}")
        self._layout = get_layout(layout)
        wide = {"description_width": "initial"}
        self.controls = {
            "model": w.Dropdown(options=list(MODELS), value=get_model(model).name,
                                description="Model"),
            "gpus": w.SelectionSlider(options=[(f"{n:,}", n) for n in GPU_STEPS], value=gpus,
                                      description="GPUs", continuous_update=True),
            "link": w.Dropdown(options=[(f"{n.label} (node)", n.name) for n in NODES.values()]
                               + [(f"{k.label} (every GPU)", k.name) for k in LINKS.values()],
                               value=link, description="Link", style=wide),
            "gpus_per_node": w.Dropdown(options=[("the node's own", 0)]
                                        + [(str(n), n) for n in PER_NODE_STEPS[1:]],
                                        value=gpus_per_node, description="GPUs per node",
                                        style=wide),
            "tokens_per_gpu": w.SelectionSlider(options=[(f"{n:,}", n) for n in TOKEN_STEPS],
                                                value=tokens_per_gpu,
                                                description="Tokens per GPU", style=wide,
                                                continuous_update=True),
            "mfu": w.FloatSlider(value=mfu, min=low, max=high, step=MFU_RANGE[2],
                                 readout_format=".0%", description="Utilisation", style=wide,
                                 continuous_update=True),
            "engine": w.Dropdown(options=[(e.label, name) for name, e in ENGINES.items()],
                                 value=engine, description="Engine"),
            **device_and_unit(device, unit),
        }
        self.data = self._frame()
        # Every stage gets artists: another engine shows the ones it offers.
        self._start(FIGSIZE, MARGINS, tradeoff_blocks,
                    lambda ax: draw_memory_vs_step_time(ax, self.data, self.device, self.unit,
                                                        STAGES))
        self.widget = self._box()

    # Current settings, read from the controls.
    @property
    def model(self) -> str:
        return self.controls["model"].value

    @property
    def gpus(self) -> int:
        return int(self.controls["gpus"].value)

    @property
    def link(self) -> str:
        return self.controls["link"].value

    @property
    def gpus_per_node(self) -> int | None:
        """The chosen GPU count per node; None for the node's own, or for a bare link."""
        value = int(self.controls["gpus_per_node"].value)
        return value if value and self.link in NODES else None

    @property
    def settings(self) -> WorkingSetSettings:
        return settings_for(self.model, int(self.controls["tokens_per_gpu"].value))

    @property
    def mfu(self) -> float:
        return round(float(self.controls["mfu"].value), 4)

    @property
    def layout(self) -> Layout:
        return self._layout

    @property
    def engine(self) -> str:
        return self.controls["engine"].value

    def _frame(self):
        return tradeoff_frame(self.model, self.gpus, interconnect(self.link, self.gpus_per_node),
                              self.device, self.settings, self.mfu, self.layout, self.engine)

    def _update(self) -> bool:
        self.data = self._frame()
        update_memory_vs_step_time(self.artists, self.data, self.device, self.unit)
        self._describe()
        return True

    def _describe(self):
        self.controls["gpus_per_node"].disabled = self.link not in NODES
        self.summary.value = summary_html(self.data, self.device, self.unit)
        self.table.value = stage_table_html(self.data, self.device, self.unit)
