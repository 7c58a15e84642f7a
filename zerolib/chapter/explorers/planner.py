"""The planner explorer: every configuration of a model on a cluster the reader picks, its
frontier (the fastest for each peak per GPU) against step time and the capacity line over the
rest faded, the fastest that fit and why the rest are rejected.

:func:`summary_html` and :func:`ranking_html` are pure (tested without widgets): they read a
:class:`zerolib.core.planner.Plan` (its counts, its ranked fits, its rejections by rule). The
explorer remembers the plans of its last :data:`PLANS_KEPT` settings with their texts, so a
slider moved back to a setting costs no plan (and, its image kept, no draw); a slider's
neighbouring settings are planned and drawn ahead while the kernel is idle, the plan in a
callback of its own.
"""
from __future__ import annotations

import html
from collections import OrderedDict
from types import MappingProxyType

from zerolib.chapter.charts.plan_peaks import (
    FIGSIZE,
    MARGINS,
    draw_plan_peaks,
    plan_peaks_blocks,
    update_plan_peaks,
)
from zerolib.chapter.explorers.base import (
    EXPLORER_DPI,
    NOT_DRAWABLE,
    Explorer,
    device_and_unit,
    unit_label,
    widgets,
)
from zerolib.chapter.explorers.start import starting_values
from zerolib.core.catalogue.devices import DEVICES
from zerolib.core.catalogue.links import LINKS
from zerolib.core.catalogue.models import MODELS
from zerolib.core.catalogue.nodes import NODES
from zerolib.core.planner import (
    PLAN_HEADER,
    PLAN_LEFT_OUT,
    SHARD_GROUPS,
    Plan,
    Search,
    describe_configuration,
    plan,
)
from zerolib.core.run import Run
from zerolib.core.step.engines import CONTEXT_PARALLEL_ENGINES, DEFAULT_ENGINE, ENGINES
from zerolib.core.step.offload_traffic import DEFAULT_HOST_LINK, HOST_LINKS
from zerolib.core.step.time import DEFAULT_MFU
from zerolib.core.units import GiB, format_value

GPU_STEPS = tuple(2**k for k in range(3, 11))          # 8 to 1,024
PER_NODE = (4, 8, 16)
SEQ_STEPS = tuple(2**k for k in range(10, 16))         # 1,024 to 32,768 tokens
# The catalogue's presets that plan at every sequence the slider offers (a learned position
# table ends at its context: GPT-2's at 1,024).
PLANNED_MODELS = tuple(name for name, config in MODELS.items()
                       if config.position_embedding != "learned"
                       or config.max_positions >= SEQ_STEPS[-1])
BATCH_STEPS = tuple(2**k for k in range(6, 13))        # 64 to 4,096 sequences
MFU_RANGE = (0.2, 0.6, 0.05)                           # min, max, step
TiB = 1024 * GiB
HOST_MEMORIES = (None, 512 * GiB, TiB, 2 * TiB)        # None: not given (offload never fits)
# A dropdown whose value is None shows no selection (ipywidgets reads None as "nothing chosen"),
# so the "not given" entries carry these stand-ins and the properties turn them back into None.
USUAL_NODE = ""
NO_HOST_MEMORY = 0
TOP = 8                                                # rows of the ranking shown
# The context-parallel degrees searched, up to a largest C (1: none; Megatron-LM's
# --context-parallel-size runs at powers of two, and 2C divides every sequence offered).
MAX_CONTEXT_PARALLEL = (1, 2, 4, 8)
# The expert-parallel degrees searched for a mixture of experts: every divisor of its routed
# experts (the planner's default) or none.
EXPERT_PARALLEL = ("all", "none")
# Plans remembered by the explorer, the least recently used dropped first: a plan is a pure
# function of the controls, and a reader moving a slider back and forth returns to the same few
# (each holds its space's arrays: 6 MB for Llama-2-70B on 64 GPUs, 16 MB on 1,024).
PLANS_KEPT = 8
# What fits judges (the engine's memory convention), in words
JUDGED_WORDS = MappingProxyType({"peak": "the peak", "peak_reserved": "the reserved peak"})


def _host(value) -> str:
    return "not given" if value is None else (f"{value // TiB} TiB" if value % TiB == 0
                                              else f"{value // GiB} GiB")


def engine_words(result: Plan) -> str:
    """Which engine the plan's rules and times are for: ``'Ranked for DeepSpeed 0.19.8 (its
    ZeRO stages 0, 1, 2, 3; beside a pipeline 0, 1; its overlap rule)'``."""
    e = result.settings.engine
    return (f"Ranked for {e.label} (its ZeRO stages {', '.join(map(str, e.stages))}; beside a "
            f"pipeline {', '.join(map(str, e.pipeline_stages))}; its overlap rule).")


def context_degrees(largest: int) -> tuple[int, ...]:
    """The context-parallel degrees searched up to ``largest`` (one of
    :data:`MAX_CONTEXT_PARALLEL`): ``(1, 2, 4)`` for 4."""
    if largest not in MAX_CONTEXT_PARALLEL or isinstance(largest, bool):
        raise ValueError(f"context_parallel must be one of {', '.join(map(str, MAX_CONTEXT_PARALLEL))}, "
                         f"got {largest!r}")
    return tuple(c for c in MAX_CONTEXT_PARALLEL if c <= largest)


def expert_degrees(choice: str) -> tuple[int, ...] | None:
    """The planner's ``expert_parallel`` for a choice of :data:`EXPERT_PARALLEL`: None (every
    divisor of the routed experts) for "all", ``(1,)`` for "none"."""
    if choice not in EXPERT_PARALLEL:
        raise ValueError(f"expert_parallel must be one of {', '.join(EXPERT_PARALLEL)}, got {choice!r}")
    return None if choice == "all" else (1,)


def searched_words(result: Plan) -> str:
    """Which context- and expert-parallel degrees the plan searched: ``'Searched context
    parallelism C = 1, 2 and expert parallelism E = 1, 2, 4, 8 (every divisor of its
    8 experts).'``."""
    s = result.settings
    cp = s.context_parallel
    words = ("no context parallelism (C = 1)" if cp == (1,)
             else f"context parallelism C = {', '.join(map(str, cp))}")
    if not s.model.mixture_of_experts:
        return f"Searched {words}; a dense model has no experts to spread."
    ep = s.expert_parallel
    every = tuple(e for e in range(1, min(s.model.experts, s.gpus) + 1) if s.model.experts % e == 0)
    experts = f" (every divisor of its {s.model.experts} experts)" if ep == every else ""
    return (f"Searched {words} and " + ("no expert parallelism (E = 1)" if ep == (1,) else
            f"expert parallelism E = {', '.join(map(str, ep))}{experts}") + ".")


def host_link_words(result: Plan) -> str:
    """Why the host link changes nothing, when no configuration the plan draws offloads (the
    link times only offload's copies); "" when some does."""
    if (result.valid["offload"] != "none").any():
        return ""
    why = ("CPU memory per node is not given, so offloaded state is never reported as fitting"
           if result.settings.host_memory is None else "none that can run does")
    return (f"Host link: it times only offload's copies to and from CPU memory, and no "
            f"configuration drawn here offloads ({why}), so it changes nothing here.")


def summary_html(result: Plan, unit: str) -> str:
    """The lines above the figure: the cluster, how many configurations fit, the fastest, the
    engine the ranking is for, and that the ranking is a model's."""
    s = result.settings
    in_unit = unit_label(unit)
    counts = result.counts()
    fits = result.fits
    if len(fits):
        best = fits.iloc[0]
        verdict = (f"Fastest that fits: {describe_configuration(best)}: {format_value(best['step_seconds'])} s "
                   f"per step ({best['network_wait_fraction']:.0%} waiting for the network, "
                   f"{best['bubble_fraction']:.0%} in the pipeline bubble), "
                   f"{in_unit(best['peak_bytes'])} per GPU, {in_unit(best['peak_reserved_bytes'])} "
                   f"reserved.")
    else:
        closest = result.rejected[result.rejected["rule"] == "capacity"]
        verdict = "Nothing fits." + (
            f" Closest: {closest['example'].iloc[0]}, {in_unit(closest['example_bytes'].iloc[0])}."
            if len(closest) else "")
    ic = s.interconnect
    where = ic.label if ic.network is None else f"{ic.name}, {s.gpus_per_node} GPUs per node"
    unused = host_link_words(result)
    return (f"<p><b>{html.escape(s.model.name)}</b> on <b>{s.gpus:,} {html.escape(s.device.label)}"
            f"</b> ({html.escape(where)}), sequence {s.seq_len:,}, global batch "
            f"{s.global_batch:,} sequences, {s.mfu:.0%} of peak. {counts['configurations']:,} "
            f"configurations, {counts['runnable']:,} can run, <b>{counts['fit']:,} fit</b>: "
            f"{JUDGED_WORDS[s.working_set.convention.judges]} per GPU at most the capacity."
            f"<br>{html.escape(verdict)}<br>{html.escape(engine_words(result))} "
            f"{html.escape(searched_words(result))}"
            + (f"<br>{html.escape(unused)}" if unused else "")
            + f"<br><i>{html.escape(PLAN_HEADER)} Left out: {html.escape('; '.join(PLAN_LEFT_OUT))}.</i></p>")


def ranking_html(result: Plan, unit: str, top: int = TOP) -> str:
    """The fastest configurations that fit, then the rejections by rule with their counts."""
    def right(text):
        return f"<td style='text-align:right'>{text}</td>"

    in_unit = unit_label(unit)
    judges = result.settings.working_set.convention.judges
    rows = []
    for _, row in result.fits.head(top).iterrows():
        rows.append(f"<tr>{right(int(row['rank']))}<td class='prose'>{html.escape(describe_configuration(row))}</td>"
                    f"{right(in_unit(row['peak_bytes']))}"
                    f"{right(in_unit(row['peak_reserved_bytes']))}"
                    f"{right(in_unit(row['headroom_bytes']))}"
                    f"{right(format_value(row['step_seconds']) + ' s')}</tr>")
    rejected = "".join(
        f"<tr>{right(f'{r.configurations:,}')}<td class='prose'>{html.escape(r.reason)}</td></tr>"
        for r in result.rejected.itertuples())
    return (f"<table><caption>The {min(top, len(result.fits))} fastest of "
            f"{len(result.fits):,} that fit</caption><thead><tr><th>Rank</th>"
            "<th>Configuration</th><th>Peak per GPU</th><th>Peak reserved</th>"
            f"<th class='prose'>Headroom (to {JUDGED_WORDS[judges]})</th><th>Step</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table>"
            "<table><caption>Rejected, by the first rule each breaks</caption><thead><tr>"
            f"<th>Configurations</th><th>Rule</th></tr></thead><tbody>{rejected}</tbody></table>")


class PlannerExplorer(Explorer):
    """The planner over its inputs.

    Controls: ``model``, ``gpus`` (8 to 1,024), ``gpus_per_node``, ``device`` (those with a
    usual node), ``links`` (the device's usual node, or another node), ``seq_len``,
    ``global_batch``, ``mfu``, ``host_memory`` (CPU memory per node, or not given),
    ``host_link`` (the PCIe link offload copies over), ``shard_groups`` ("all": every G dividing
    d, as ``zerolib plan``; "whole": G = d only), ``engine`` (whose stages, pipeline rule,
    schedule, overlap and memory convention: :data:`zerolib.core.step.engines.ENGINES`,
    torchtitan's included, whose plan searches its own recomputations, op-selective among
    them, and judges the reserved peak), ``fp8`` and ``compile`` (the trainer's, as
    ``estimate`` counts them), ``context_parallel``
    (the largest C searched: 1 only, or 1, 2, ... up to 8; under an engine without ring
    attention, DeepSpeed's and the paper's, disabled at 1 only, and moving to such an engine sets
    it back to 1 in the same redraw), ``expert_parallel`` ("all": every
    divisor of a mixture's routed experts; "none": E = 1; no effect on a dense model, where it
    is disabled), ``unit``.
    ``.plan`` is the :class:`zerolib.core.planner.Plan`, ``.data`` its ``valid`` frame.
    """

    PANEL = (
        ("Model and cluster", ("model", "gpus", "gpus_per_node", "links", "host_memory",
                                   "host_link")),
        ("Training", ("seq_len", "global_batch", "mfu", "shard_groups", "engine", "fp8",
                      "compile", "context_parallel", "expert_parallel")),
        ("Device", ("device", "unit", "capacity")),
    )

    # Where it starts, unless a run or fields say otherwise (explorers.start); the last three
    # are what it searches: shard groups, up to which context-parallel degree, expert
    # parallelism ("all" divisors of the experts or "none").
    STARTS_AT = MappingProxyType({"model": "llama-2-70b", "gpus": 64, "gpus_per_node": 8,
                                  "device": "a100-80gb", "links": None, "seq_len": 4096,
                                  "global_batch": 1024, "mfu": DEFAULT_MFU, "host_memory": None,
                                  "host_link": DEFAULT_HOST_LINK, "engine": DEFAULT_ENGINE,
                                  "fp8": False, "compile": False,
                                  "shard_groups": "all", "context_parallel": 1,
                                  "expert_parallel": "all"})
    SEARCHED = ("shard_groups", "context_parallel", "expert_parallel")

    def __init__(self, run: Run | None = None, unit: str = "GB", dpi: float = EXPLORER_DPI,
                 **fields):
        # the run's own layout is searched, not where the explorer starts
        start = starting_values({k: v for k, v in self.STARTS_AT.items() if k not in self.SEARCHED},
                                run, {k: v for k, v in fields.items() if k not in self.SEARCHED})
        start.update({k: fields.get(k, self.STARTS_AT[k]) for k in self.SEARCHED})
        (model, gpus, gpus_per_node, device, links, seq_len, global_batch, mfu, host_memory,
         host_link, engine, fp8, compile_, shard_groups, context_parallel, expert_parallel) = (
            start[name] for name in self.STARTS_AT)
        super().__init__(dpi)
        w = widgets()
        for name, value, allowed in (("model", model, PLANNED_MODELS), ("gpus", gpus, GPU_STEPS),
                                     ("gpus_per_node", gpus_per_node, PER_NODE),
                                     ("seq_len", seq_len, SEQ_STEPS),
                                     ("global_batch", global_batch, BATCH_STEPS),
                                     ("host_memory", host_memory, HOST_MEMORIES),
                                     ("host_link", host_link, HOST_LINKS),
                                     ("shard_groups", shard_groups, SHARD_GROUPS),
                                     ("engine", engine, tuple(ENGINES)),
                                     ("context_parallel", context_parallel, MAX_CONTEXT_PARALLEL),
                                     ("expert_parallel", expert_parallel, EXPERT_PARALLEL),
                                     ("links", links, (None, *NODES))):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, "
                                 f"got {value!r}")
        for name, value in (("fp8", fp8), ("compile", compile_)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        if context_parallel != 1 and not ENGINES[engine].context_parallel:
            raise ValueError(f"context_parallel must be 1 under engine {engine}: it runs no "
                             f"ring-attention context parallelism (the engines that do: "
                             f"{', '.join(CONTEXT_PARALLEL_ENGINES)})")
        wide = {"description_width": "initial"}
        controls = device_and_unit(device, unit)
        controls["device"].options = [(d.label, d.name) for d in DEVICES.values()
                                      if d.node is not None]
        controls["device"].value = device
        self.controls = {
            "model": w.Dropdown(options=list(PLANNED_MODELS), value=model, description="Model"),
            "gpus": w.SelectionSlider(options=[(f"{n:,}", n) for n in GPU_STEPS], value=gpus,
                                      description="GPUs", continuous_update=True),
            "gpus_per_node": w.ToggleButtons(options=list(PER_NODE), value=gpus_per_node,
                                             description="GPUs/node",
                                             style={"button_width": "42px"}),
            "links": w.Dropdown(options=[("the device's usual node", USUAL_NODE)]
                                + [(name, name) for name in NODES],
                                value=USUAL_NODE if links is None else links,
                                description="Links", style=wide),
            "seq_len": w.SelectionSlider(options=[(f"{n:,}", n) for n in SEQ_STEPS],
                                         value=seq_len, description="Sequence", style=wide,
                                         continuous_update=True),
            "global_batch": w.SelectionSlider(options=[(f"{n:,}", n) for n in BATCH_STEPS],
                                              value=global_batch, description="Global batch",
                                              style=wide, continuous_update=True),
            "mfu": w.FloatSlider(value=mfu, min=MFU_RANGE[0], max=MFU_RANGE[1], step=MFU_RANGE[2],
                                 readout_format=".2f", description="Utilisation", style=wide),
            "host_memory": w.Dropdown(options=[(_host(m), NO_HOST_MEMORY if m is None else m)
                                               for m in HOST_MEMORIES],
                                      value=NO_HOST_MEMORY if host_memory is None else host_memory,
                                      description="CPU memory/node",
                                      style=wide),
            "host_link": w.Dropdown(options=[(LINKS[name].label, name) for name in HOST_LINKS],
                                    value=host_link, description="Host link", style=wide),
            "shard_groups": w.ToggleButtons(options=[("G = d", "whole"), ("every G", "all")],
                                            value=shard_groups, description="Shard groups",
                                            style={"button_width": "70px"}),
            "engine": w.Dropdown(options=[(f"{e.label} ({name})", name)
                                          for name, e in ENGINES.items()],
                                 value=engine, description="Engine", style=wide),
            "fp8": w.Checkbox(value=fp8, description="Float8 linears", indent=False),
            "compile": w.Checkbox(value=compile_, description="torch.compile", indent=False),
            "context_parallel": w.Dropdown(
                options=[("1 only" if c == 1 else ", ".join(map(str, context_degrees(c))), c)
                         for c in MAX_CONTEXT_PARALLEL],
                value=context_parallel, description="Context parallel C", style=wide),
            "expert_parallel": w.ToggleButtons(options=[("every E", "all"), ("E = 1", "none")],
                                               value=expert_parallel,
                                               description="Expert parallel",
                                               style={"button_width": "60px"}),
            **controls,
        }
        # None set from Python means "not given": show that entry, never a blank menu.
        for name, not_given in (("links", USUAL_NODE), ("host_memory", NO_HOST_MEMORY)):
            self.controls[name].observe(
                lambda change, not_given=not_given: change["new"] is None and setattr(
                    change["owner"], "value", not_given), names="value")
        self._plans: OrderedDict[tuple, tuple] = OrderedDict()   # inputs -> (plan, texts by unit)
        self.plans_made = 0     # plans made to show a setting (not those worked out ahead)
        self.plan = self._remembered_plan()
        self.data = self.plan.valid
        self._start(FIGSIZE, MARGINS, plan_peaks_blocks,
                    lambda ax: draw_plan_peaks(ax, self.data, self.unit))
        self.widget = self._box()

    def _watch(self):
        # The engine redraws through its own observer: one redraw, C set back to 1 first where
        # the new engine has no context parallelism.
        for name, control in self.controls.items():
            if name != "engine":
                control.observe(lambda change, name=name: self._moved(name, change), names="value")
        self.controls["engine"].observe(self.reporting(self._engine_changed), names="value")

    def _steps_ahead(self, name, value) -> list:
        # The plan and its texts in a callback of their own, then the drawing: the kernel can
        # answer a key press between the two.
        return [lambda: self._plan_ahead(name, value), *super()._steps_ahead(name, value)]

    def _plan_ahead(self, name, value) -> bool:
        """Make and remember the plan (and its texts) with control ``name`` at ``value``;
        True when it made one."""
        before = self.plans_made
        with self._at({name: value}):
            try:
                self.plan = self._remembered_plan()
                self._texts()
            except NOT_DRAWABLE:
                return False
            return self.plans_made > before

    def _engine_changed(self, change):
        with self.hold():
            if not ENGINES[change["new"]].context_parallel:
                self.controls["context_parallel"].value = 1

    def _inputs(self) -> tuple:
        """Every control the plan depends on (all but the unit, which only changes the figure)."""
        return tuple(control.value for name, control in self.controls.items() if name != "unit")

    @property
    def links(self) -> str | None:
        """The chosen node's name; None for the device's usual node."""
        return self.controls["links"].value or None

    @property
    def host_memory(self) -> int | None:
        """CPU memory per node in bytes; None when not given."""
        return self.controls["host_memory"].value or None

    def _plan(self) -> Plan:
        return plan(self.run, search=self.search)

    @property
    def run(self) -> Run:
        """The run the controls describe (what the planner keeps fixed)."""
        c = self.controls
        return Run.of(c["model"].value, int(c["gpus"].value),
                      gpus_per_node=int(c["gpus_per_node"].value), device=self.device,
                      seq_len=int(c["seq_len"].value), global_batch=int(c["global_batch"].value),
                      link=self.links, mfu=float(c["mfu"].value), host_memory=self.host_memory,
                      host_link=c["host_link"].value, engine=c["engine"].value,
                      fp8=bool(c["fp8"].value), compile=bool(c["compile"].value))

    @property
    def search(self) -> Search:
        """What the controls ask the planner to search."""
        c = self.controls
        return Search(shard_groups=c["shard_groups"].value,
                      context_parallel=context_degrees(c["context_parallel"].value),
                      expert_parallel=expert_degrees(c["expert_parallel"].value))

    def _remembered_plan(self) -> Plan:
        """The plan for the controls as they are: remembered under their values (the last
        :data:`PLANS_KEPT`), or made and remembered."""
        key = self._inputs()
        kept = self._plans.get(key)
        if kept is None:
            kept = self._plans[key] = (self._plan(), {})
            self.plans_made += 1
            while len(self._plans) > PLANS_KEPT:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return kept[0]

    def _texts(self) -> tuple[str, str]:
        """The summary and the ranking of the current plan in the current unit, remembered with
        the plan (both are pure functions of the two)."""
        texts = self._plans[self._inputs()][1]
        if self.unit not in texts:
            texts[self.unit] = (summary_html(self.plan, self.unit),
                                ranking_html(self.plan, self.unit))
        return texts[self.unit]

    def _update(self) -> bool:
        result = self._remembered_plan()
        if result is not self.plan:
            self.plan, self.data = result, result.valid
        update_plan_peaks(self.artists, self.data, self.unit)
        self._describe()
        return True

    def _describe(self):
        # A dense model has no experts: its expert-parallel choice changes nothing; an engine
        # without ring attention has no context-parallel choice; with no configuration drawn
        # that offloads, the host link times nothing shown (its menu says why, as the summary).
        self.controls["expert_parallel"].disabled = not self.plan.settings.model.mixture_of_experts
        self.controls["context_parallel"].disabled = not self.plan.settings.engine.context_parallel
        unused = host_link_words(self.plan)
        self.controls["host_link"].disabled = bool(unused)
        self.controls["host_link"].tooltip = unused or None
        self.summary.value, self.table.value = self._texts()
