"""The will-it-fit explorer: a model's peak per GPU, stage by stage, against the device.

:func:`peak_rows`, :func:`summary_html` and :func:`peak_table_html` are pure (tested without
widgets): they read the drawn :func:`zerolib.core.memory.tables.peak_frame` and judge the **peak**
(model state + working set) against the device.
"""
from __future__ import annotations

import html
from dataclasses import replace
from types import MappingProxyType

import pandas as pd

from zerolib.chapter.charts.will_it_fit import (
    FIGSIZE,
    MARGINS,
    draw_will_it_fit,
    update_will_it_fit,
    will_it_fit_blocks,
    will_it_fit_titles,
)
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    Explorer,
    device_and_unit,
    in_unit,
    widgets,
)
from zerolib.chapter.explorers.start import starting_values
from zerolib.chapter.style import device_label
from zerolib.core.catalogue.devices import Device, capacity_text
from zerolib.core.catalogue.models import MODELS, TransformerConfig, get_model, parameter_count
from zerolib.core.defaults import ENGINE_NAMES
from zerolib.core.memory.accounting import STAGES, STRATEGY_NAMES, Layout, get_layout
from zerolib.core.memory.activations import RECOMPUTE
from zerolib.core.memory.conventions import reserved_bytes
from zerolib.core.memory.tables import peak_frame, show_never
from zerolib.core.memory.working_set import (
    WorkingSetSettings,
    fewest_gpus_for_peak,
    largest_micro_batches,
)
from zerolib.core.run import Run, Trainer
from zerolib.core.step.engines import get_engine
from zerolib.core.units import format_value

# What fits judges, in words (zerolib.core.memory.conventions.JUDGES)
JUDGED = MappingProxyType({"peak": "peak", "peak_reserved": "reserved peak"})
# The engines the explorer offers: the chapter's count first (the paper's), then each trainer's
ENGINE_CHOICES = ("paper", *(name for name in ENGINE_NAMES if name != "paper"))

# The explorer's ranges.
SEQ_LENGTHS = tuple(2**k for k in range(7, 18))   # 128 to 131,072 tokens
LARGEST_MICRO_BATCH_SHOWN = 64   # also the bound of the largest-micro-batch search ("64 or more")
MAX_EXPLORER_GPUS = 1024


def _count_words(count: int) -> str:
    """Parameters to three significant digits: '6.74B', '124M'."""
    if count >= 10**9:
        return f"{format_value(count / 10**9)}B"
    return f"{format_value(count / 10**6)}M"


def _and(names) -> str:
    names = list(names)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def seq_lengths_for(model: str) -> tuple[int, ...]:
    """The sequence lengths the model can take (learned position embeddings end at its context)."""
    config = get_model(model)
    if config.position_embedding != "learned":
        return SEQ_LENGTHS
    return tuple(n for n in SEQ_LENGTHS if n <= config.max_positions) or SEQ_LENGTHS[:1]


def peak_rows(frame: pd.DataFrame, device: Device) -> list[dict]:
    """Per stage of a peak frame: ``stage``, ``peak`` (the allocated peak plus the reserve
    outside the allocator, bytes), ``peak_reserved`` (with the caching allocator's reserve),
    ``judges`` (which of the two fits judges: the engine's), ``fits`` (that one <= capacity),
    ``activations`` and ``logits_loss`` (bytes)."""
    known = frame.attrs.get("peaks") or {}
    # Plain columns rather than a groupby: the explorer reads these twice on every move.
    stages = frame["stage"].to_numpy()
    components = frame["component"].to_numpy()
    n_bytes = frame["bytes"].to_numpy()
    rows = []
    for stage in sorted(set(stages.tolist())):
        at = stages == stage
        by_component = dict(zip(components[at].tolist(), n_bytes[at].tolist()))
        peak = sum(by_component.values())      # Python ints: exact
        found = known.get(int(stage)) or {"peak": peak, "peak_reserved": reserved_bytes(
            peak - by_component["reserve"]) + by_component["reserve"], "fits_judges": "peak"}
        judges = found["fits_judges"]
        rows.append({"stage": int(stage), "peak": found["peak"],
                     "peak_reserved": found["peak_reserved"], "judges": judges,
                     "fits": found[judges] <= device.capacity,
                     "activations": by_component["activations"],
                     "logits_loss": by_component["logits_loss"]})
    return rows


def summary_html(frame: pd.DataFrame, device: Device, unit: str) -> str:
    """The lines above the figure: the model and settings, which strategies' peaks fit, the
    activations and logits every strategy holds, the reference line."""
    config, settings = frame.attrs["model"], frame.attrs["settings"]
    gpus = int(frame["gpus"].iloc[0])
    rows = peak_rows(frame, device)
    on = f"{gpus} GPU{'s' if gpus != 1 else ''}"
    _, conditions = will_it_fit_titles(config.name, gpus, settings, frame.attrs["layout"])
    fitting = [STRATEGY_NAMES[row["stage"]] for row in rows if row["fits"]]
    too_big = [STRATEGY_NAMES[row["stage"]] for row in rows if not row["fits"]]
    if not too_big:
        verdict = "Fits under every strategy, even plain data parallelism."
    elif not fitting:
        smallest = min(rows, key=lambda row: row[row["judges"]])
        verdict = (f"Fits under no strategy: the smallest {JUDGED[smallest['judges']]} is "
                   f"{in_unit(smallest[smallest['judges']], unit)} "
                   f"({STRATEGY_NAMES[smallest['stage']]}). "
                   "Add GPUs, shorten the sequence, lower the micro-batch or recompute more.")
    else:
        verdict = f"Fits under {_and(fitting)}. Too big under {_and(too_big)}."
    first = rows[0]    # activations and logits are the same at every stage
    engine, rows_stages = get_engine(settings.engine), [row["stage"] for row in rows]
    return (
        f"<p><b>{html.escape(config.name)}</b> ({parameter_count(config):,} parameters) "
        f"on <b>{on}</b>: {html.escape(conditions)}."
        f"<br>{html.escape(verdict)}"
        f"<br>Every strategy also holds the activations ({in_unit(first['activations'], unit)}) "
        f"and the logits and loss ({in_unit(first['logits_loss'], unit)}) of one micro-batch per "
        "GPU; both grow with micro-batch × sequence length."
        + (f"<br>{html.escape(engine.label)} offers {_and([STRATEGY_NAMES[s] for s in engine.stages])}"
           f"; the others are shown beside them." if set(engine.stages) < set(rows_stages) else "")
        + f"<br>Fits judges the {JUDGED[first['judges']]}"
        + (" (the allocated peak with the caching allocator's reserve, as the engine reports "
           "it; the bars are the bytes held, the peak the larger of the backward's and the "
           "optimizer step's moments)" if first["judges"] == "peak_reserved" else
           " (the bars' sum); the reserved peak adds the caching allocator's reserve")
        + f".<br>Reference line: {html.escape(device_label(device, unit))}.</p>")


def peak_table_html(frame: pd.DataFrame, device: Device, unit: str, fewest: dict,
                    largest: dict) -> str:
    """Per stage: the peak, whether it fits, the fewest GPUs that fit (``fewest``: stage -> int
    or None) and the largest micro-batch that fits (``largest``: stage -> int)."""
    config, settings = frame.attrs["model"], frame.attrs["settings"]
    gpus = int(frame["gpus"].iloc[0])
    on = f"{gpus} GPU{'s' if gpus != 1 else ''}"
    judges = peak_rows(frame, device)[0]["judges"]

    def right(text):
        return f"<td style='text-align:right'>{text}</td>"
    cells = []
    for row in peak_rows(frame, device):
        stage = row["stage"]
        most = show_never(largest[stage], zero_is_never=True)   # 0: not even one sequence
        if most == LARGEST_MICRO_BATCH_SHOWN:
            most = f"{most} or more"       # the search stops at the slider's end
        cells.append(
            f"<tr><td>{html.escape(STRATEGY_NAMES[stage])}</td>{right(in_unit(row['peak'], unit))}"
            f"{right(in_unit(row['peak_reserved'], unit))}"
            f"<td>{'fits' if row['fits'] else 'too big'}</td>"
            f"{right(show_never(fewest[stage]))}"
            f"{right(most)}</tr>")
    return (
        f"<table><caption>Per GPU on {on} against the {html.escape(device.label)} "
        f"({html.escape(capacity_text(device, unit))}), {html.escape(config.name)}</caption>"
        "<thead><tr><th>Strategy</th><th>Peak per GPU</th><th>Peak reserved</th>"
        f"<th class='prose'>Fits? (the {JUDGED[judges]})</th>"
        f"<th class='prose'>Fewest GPUs that fit (micro-batch {settings.micro_batch})</th>"
        f"<th class='prose'>Largest micro-batch that fits ({on})</th></tr></thead>"
        f"<tbody>{''.join(cells)}</tbody></table>")


SEARCHES_KEPT = 32   # search results kept per kind


def _remembered(kept: list, key: tuple, search):
    """The result kept under ``key`` (compared by ``==``: a model of one's own is not hashable),
    or ``search()`` on first use; the most recent first, at most SEARCHES_KEPT kept."""
    for i, (known, found) in enumerate(kept):
        if known == key:
            kept.insert(0, kept.pop(i))
            return found
    found = search()
    kept.insert(0, (key, found))
    del kept[SEARCHES_KEPT:]
    return found


class WillItFitExplorer(Explorer):
    """Will a model train on these GPUs? Its peak per GPU, stage by stage, against the device.

    Controls: ``model`` (a preset of :mod:`zerolib.core.catalogue.models`, or a model of one's
    own such as ``zl.model_from_config("config.json")``, listed first), ``gpus`` (1 to 1024),
    ``micro_batch`` (1 to 64), ``seq_len`` (powers of two, 128 to 131,072 tokens, up to the
    model's context where its position embeddings are learned), ``recompute`` (none, selective,
    full, op-selective), ``flash_attention``, the trainer (``engine``: the chapter's count, the
    paper's, or a trainer's memory convention, torchtitan's included; ``fp8``; ``compile``),
    ``device``, ``unit``. The layout is the one given, else the engine's own (torchtitan's
    fp32-adam). ``.data`` is
    :func:`zerolib.core.memory.tables.peak_frame` (bytes per stage and component). The table gives, per
    stage, the peak, whether it fits, the fewest GPUs at which it fits (at this micro-batch) and
    the largest micro-batch that fits (on these GPUs), all from :mod:`zerolib.core.memory.working_set`.
    """

    PANEL = (
        ("Model and run", ("model", "gpus", "micro_batch", "seq_len", "recompute",
                               "flash_attention")),
        ("Trainer", ("engine", "fp8", "compile")),
        ("Device", ("device", "unit", "capacity")),
    )

    # Where it starts, unless a run or fields say otherwise (explorers.start).
    STARTS_AT = MappingProxyType({"model": "llama-2-7b", "gpus": 8, "micro_batch": 1,
                                  "seq_len": 4096, "recompute": "selective",
                                  "flash_attention": True, "device": "h100-80gb",
                                  "layout": None, "engine": "paper", "fp8": False,
                                  "compile": False})

    def __init__(self, run: Run | None = None, unit: str = "GB", dpi: float = EXPLORER_DPI,
                 **fields):
        start = starting_values(self.STARTS_AT, run, fields)
        (model, gpus, micro_batch, seq_len, recompute, flash_attention, device, layout, engine,
         fp8, compile_) = (start[name] for name in self.STARTS_AT)
        super().__init__(dpi)
        w = widgets()
        # A model of one's own (zl.model_from_config) joins the presets at the top of the list.
        own = model if isinstance(model, TransformerConfig) else None
        if own is None and (not isinstance(model, str) or get_model(model).name not in MODELS):
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
        for name, value, high in (("gpus", gpus, MAX_EXPLORER_GPUS),
                                  ("micro_batch", micro_batch, LARGEST_MICRO_BATCH_SHOWN)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
                raise ValueError(f"{name} must be a whole number from 1 to {high}, got {value!r}")
        if seq_len not in seq_lengths_for(model):
            raise ValueError(f"seq_len must be one of {', '.join(map(str, seq_lengths_for(model)))}"
                             f" for {model if own is None else own.name}, got {seq_len!r}")
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        for name, value in (("flash_attention", flash_attention), ("fp8", fp8),
                            ("compile", compile_)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        if engine not in ENGINE_CHOICES:
            raise ValueError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, got {engine!r}")
        # the layout given, else (None) the engine's own (Trainer.layout_of)
        self._layout_fixed = None if layout is None else get_layout(layout)
        # Search results by their inputs (pure functions of them), the least recently used
        # dropped first: moving a slider back and forth searches each setting once.
        self._fewest: list[tuple] = []     # (inputs, fewest GPUs per stage)
        self._largest: list[tuple] = []    # (inputs, largest micro-batch per stage)
        wide = {"description_width": "initial"}
        self.controls = {
            "model": w.Dropdown(options=[(f"{config.name} ({_count_words(parameter_count(config))})",
                                          config) for config in ((own,) if own else ())]
                                + [(f"{name} ({_count_words(parameter_count(config))})", name)
                                   for name, config in MODELS.items()],
                                value=own if own else get_model(model).name, description="Model"),
            "gpus": w.IntSlider(value=gpus, min=1, max=MAX_EXPLORER_GPUS, description="GPUs",
                                continuous_update=True),
            "micro_batch": w.IntSlider(value=micro_batch, min=1, max=LARGEST_MICRO_BATCH_SHOWN,
                                       description="Micro-batch", style=wide,
                                       continuous_update=True),
            "seq_len": w.SelectionSlider(options=self._seq_options(model), value=seq_len,
                                         description="Sequence", style=wide,
                                         continuous_update=True),
            "recompute": w.ToggleButtons(options=list(RECOMPUTE), value=recompute,
                                         description="Recompute", style={"button_width": "80px"}),
            "flash_attention": w.Checkbox(value=flash_attention, description="Flash attention",
                                          indent=False),
            "engine": w.Dropdown(options=list(ENGINE_CHOICES), value=engine,
                                 description="Engine's memory", style=wide),
            "fp8": w.Checkbox(value=fp8, description="Float8 linears", indent=False),
            "compile": w.Checkbox(value=compile_, description="torch.compile", indent=False),
            **device_and_unit(device, unit),
        }
        self.data = self._frame()
        self._start(FIGSIZE, MARGINS, will_it_fit_blocks,
                    lambda ax: draw_will_it_fit(ax, self.data, self.device, self.unit))
        self.controls["model"].observe(self.reporting(self._model_changed), names="value")
        self.widget = self._box()

    @staticmethod
    def _seq_options(model: str) -> list[tuple[str, int]]:
        return [(f"{n:,}", n) for n in seq_lengths_for(model)]

    def _model_changed(self, change):
        """Keep the sequence control within what the new model can take, in one redraw."""
        control = self.controls["seq_len"]
        options = self._seq_options(change["new"])
        if [n for _, n in options] != [n for _, n in control.options]:
            with self.hold():
                value = min(control.value, options[-1][1])
                control.options = options
                control.value = value

    # Current settings, read from the controls.
    @property
    def model(self) -> str:
        return self.controls["model"].value

    @property
    def gpus(self) -> int:
        return int(self.controls["gpus"].value)

    @property
    def settings(self) -> WorkingSetSettings:
        c = self.controls
        return WorkingSetSettings(
            seq_len=int(c["seq_len"].value), micro_batch=int(c["micro_batch"].value),
            recompute=c["recompute"].value, flash_attention=bool(c["flash_attention"].value),
            engine=c["engine"].value, fp8=bool(c["fp8"].value), compile=bool(c["compile"].value))

    @property
    def layout(self) -> Layout:
        if self._layout_fixed is not None:
            return self._layout_fixed
        return get_layout(Trainer(engine=self.controls["engine"].value).layout_of)

    def _frame(self):
        return peak_frame(self.model, self.gpus, STAGES, self.settings, self.layout)

    def _update(self) -> bool:
        self.data = self._frame()
        update_will_it_fit(self.artists, self.data, self.device, self.unit)
        self._describe()
        return True

    def _searches(self, settings, device):
        """Fewest GPUs and largest micro-batch per stage, each searched once per set of inputs."""
        fewest_key = (self.model, settings, self.layout, device)   # the device as read; not the GPU count
        fewest = _remembered(self._fewest, fewest_key, lambda: {
            stage: int(n) or None for stage, n in zip(STAGES, fewest_gpus_for_peak(
                self.model, STAGES, settings, self.layout, device))})
        largest_key = (self.model, self.gpus, replace(settings, micro_batch=1), self.layout, device)
        largest = _remembered(self._largest, largest_key, lambda: dict(zip(STAGES, largest_micro_batches(
            self.model, self.gpus, STAGES, settings, self.layout, device,
            max_micro_batch=LARGEST_MICRO_BATCH_SHOWN))))
        return fewest, largest

    def _describe(self):
        device, unit = self.device, self.unit
        fewest, largest = self._searches(self.data.attrs["settings"], device)
        self.summary.value = summary_html(self.data, device, unit)
        self.table.value = peak_table_html(self.data, device, unit, fewest, largest)
