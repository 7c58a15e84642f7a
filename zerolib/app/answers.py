"""The page's answers, from the same functions as ``zerolib estimate`` and ``zerolib plan``.

:func:`answers` is the one place the page asks the core: for a :class:`Settings` it reads the
model (a preset, or an uploaded ``config.json`` through :func:`zerolib.core.catalogue.hf_config.
model_from_config`), then asks, in the page's order:

1. whether the model state fits under each stage: :func:`zerolib.core.estimate.estimate` of the
   model's exact parameter count (``zerolib estimate --params N``);
2. the peak with the working set: :func:`zerolib.core.estimate.estimate`
   (``zerolib estimate --model/--config``);
3. the planner's configurations: :func:`zerolib.core.planner.plan` (``zerolib plan``);
4. the run's wall-clock time and GPU-hours for the settings' tokens at the fastest plan's step
   time (:func:`zerolib.core.step.run_cost.run_cost`, as ``--tokens``).

Engines: every answer is for the settings' engine (:data:`zerolib.core.step.engines.ENGINES`,
the default first); each part that cannot be answered (a setting the core refuses) carries one
line saying why, and the parts before it still answer.

The rest are pure functions of an :class:`Answers`: the HTML of each answer, the plan's CSV
(the same bytes as ``zerolib plan --format csv --top N``) and what each configuration leaves out.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from zerolib.app.settings import Settings, run_of
from zerolib.core.catalogue.hf_config import config_from_text, model_from_config
from zerolib.core.catalogue.models import TransformerConfig, get_model, parameter_count
from zerolib.core.estimate import Estimate, estimate
from zerolib.core.memory.accounting import STRATEGY_NAMES
from zerolib.core.memory.conventions import RESERVED_PPM
from zerolib.core.memory.working_set import WorkingSetSettings
from zerolib.core.plan_table import plan_csv as table_csv
from zerolib.core.planner import (
    PLAN_HEADER,
    PLAN_LEFT_OUT,
    Plan,
    describe_configuration,
    plan,
)
from zerolib.core.run import Run
from zerolib.core.step.engines import DEFAULT_ENGINE, ENGINES, Engine
from zerolib.core.step.run_cost import RunCost, run_cost
from zerolib.core.units import format_value

TOP = 10                 # fastest configurations shown on the page
CSV_TOP = 100            # and written to the CSV (zerolib plan --format csv --top 100)
RUN_LEFT_OUT = "no failures, restarts, evaluation or checkpointing"

# Where the chapter explains each answer (notebook, heading as JupyterLab anchors it).
SECTIONS = {
    "model": ("09-size-your-own-model.ipynb", "What zerolib read"),
    "state": ("04-will-it-fit.ipynb", "Layer 1: persistent model state"),
    "peak": ("04-will-it-fit.ipynb", "The peak against the device"),
    "plan": ("08-zero-beside-model-parallelism.ipynb", "The planner in depth"),
    "left_out": ("08-zero-beside-model-parallelism.ipynb", "What the ranking leaves out"),
    "run": ("05-the-price-of-zero.ipynb", "Compute, overlap and the step time"),
}
# The chapter's static pages (`zerolib html`'s), which `zerolib app` serves beside the page, so
# the links work with no other server running; relative, so they follow the page's address.
CHAPTER_URL = "chapter/"


@dataclass(frozen=True)
class Answers:
    """Everything the page shows for one :class:`Settings`; a part is None when it could not be
    answered, and ``errors`` then holds its one line (keys: model, state, peak, plan, run)."""

    settings: Settings
    model: TransformerConfig | None = None
    engine: str = ""
    engine_label: str = ""
    state: Estimate | None = None
    peak: Estimate | None = None
    peak_settings: WorkingSetSettings | None = None
    asked: Run | None = None         # the run the settings describe (its file: the download)
    plan: Plan | None = field(default=None, repr=False)
    run: RunCost | None = None
    errors: dict = field(default_factory=dict)


def engine_choices() -> tuple[tuple[str, str], ...]:
    """(label, name) of each engine of :data:`zerolib.core.step.engines.ENGINES`, the default
    (``estimate``'s and ``plan``'s) first."""
    names = sorted(ENGINES, key=lambda name: name != DEFAULT_ENGINE)
    return tuple((f"{name} ({ENGINES[name].label})", name) for name in names)


def _engine(name: str) -> tuple[str, str, Engine]:
    """(name, label, Engine) of the settings' engine; "" is the default one."""
    name = name or DEFAULT_ENGINE
    if name not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {name!r}")
    return name, dict((value, label) for label, value in engine_choices())[name], ENGINES[name]


def read_model(settings: Settings) -> TransformerConfig:
    """The uploaded config (if any) or the preset; the config read as ``--config`` reads a file
    (:func:`zerolib.core.catalogue.hf_config.config_from_text`: bounded, one line naming the
    field)."""
    if settings.config:
        where = settings.config_name or "config.json"
        data = config_from_text(settings.config, where)
        return model_from_config(data, name=settings.config_name or None, where=where)
    return get_model(settings.model)


def peak_settings_of(settings: Settings) -> WorkingSetSettings:
    """The working set the peak answer uses: the run's sequence and micro-batch, the rest at
    ``zerolib estimate``'s defaults."""
    return WorkingSetSettings(seq_len=settings.seq_len, micro_batch=settings.micro_batch)


def answers(settings: Settings) -> Answers:
    """Ask the core everything the page shows (see the module doc)."""
    errors: dict[str, str] = {}
    found: dict = {"settings": settings, "errors": errors}
    try:
        found["model"] = config = read_model(settings)
    except (ValueError, TypeError, LookupError) as error:
        errors["model"] = str(error)
        return Answers(**found)
    try:
        name, label, engine = _engine(settings.engine)
        found.update(engine=name, engine_label=label)
    except ValueError as error:
        for part in ("state", "peak", "plan", "run"):
            errors[part] = str(error)
        return Answers(**found)
    stages = engine.stages   # the stages the engine offers
    found["asked"] = asked = run_of(settings, config)
    try:   # the model state alone: the exact count, as zerolib estimate --params judges it
        found["state"] = estimate(Run.of(parameter_count(config), settings.gpus,
                                         layout=settings.layout, device=settings.device,
                                         stages=stages, engine=name))
    except (ValueError, TypeError) as error:
        errors["state"] = str(error)
    try:   # the peak: the run's working set, judged without timing it
        found["peak_settings"] = peak_settings_of(settings)
        found["peak"] = estimate(asked.replace(link=None, stages=stages))
    except (ValueError, TypeError) as error:
        errors["peak"] = str(error)
    try:
        found["plan"] = result = plan(asked)
    except (ValueError, TypeError) as error:
        errors["plan"] = errors["run"] = str(error)
        return Answers(**found)
    if len(result.fits):
        best = result.fits.iloc[0]
        found["run"] = run_cost(settings.tokens, settings.global_batch * settings.seq_len,
                                best["step_seconds"], settings.gpus)
    else:
        errors["run"] = "nothing fits, so there is no step time to run at"
    return Answers(**found)


# --- what each configuration leaves out ---------------------------------------------------------

def left_out_for(row) -> tuple[str, ...]:
    """The items of :data:`PLAN_LEFT_OUT` that concern configuration ``row`` in particular: the
    bubble item with a pipeline, the tensor/pipeline traffic item with either. (The others
    concern every configuration alike.)"""
    t, p = int(row["tensor_parallel"]), int(row["pipeline_parallel"])
    concerns = {"pipeline bubbles": p > 1,
                "tensor-parallel and pipeline traffic": t > 1 or p > 1}
    return tuple(item for item in PLAN_LEFT_OUT
                 if any(key in item and hit for key, hit in concerns.items()))


def left_out_for_all() -> tuple[str, ...]:
    """The items of :data:`PLAN_LEFT_OUT` no single configuration is singled out for."""
    keys = ("pipeline bubbles", "tensor-parallel and pipeline traffic")
    return tuple(item for item in PLAN_LEFT_OUT if not any(key in item for key in keys))


# --- the plan as CSV ----------------------------------------------------------------------------

def plan_csv(result: Plan, top: int | None = CSV_TOP) -> str:
    """The fitting configurations, fastest first, as ``zerolib plan --format csv --top N``
    writes them (:func:`zerolib.core.plan_table.plan_csv`: one writer for both)."""
    return table_csv(result, top)


# --- the page's HTML ----------------------------------------------------------------------------

def section_address(part: str) -> str:
    """Where the chapter explains answer ``part``: its static page and heading (nbconvert's
    anchor, the heading's words joined by "-")."""
    notebook, heading = SECTIONS[part]
    return f"{CHAPTER_URL}{notebook.removesuffix('.ipynb')}.html#{heading.replace(' ', '-')}"


def section_link(part: str) -> str:
    """A link to the chapter section that explains answer ``part``."""
    notebook, heading = SECTIONS[part]
    return (f"<a href='{html.escape(section_address(part))}' target='_blank' "
            f"class='zerolib-section'>explained in notebook {notebook[:2]}: "
            f"\u201c{html.escape(heading)}\u201d</a>")


def _bytes(n_bytes, unit: str) -> str:
    per = {"GB": 10**9, "GiB": 2**30}[unit]
    return f"{format_value(float(n_bytes) / per)} {unit}"


def _right(text) -> str:
    return f"<td style='text-align:right'>{text}</td>"


def _error(text: str) -> str:
    return f"<p class='zerolib-error'>\u26a0 {html.escape(' '.join(str(text).split()))}</p>"


def model_html(a: Answers) -> str:
    if a.model is None:
        return _error(a.errors["model"])
    own = bool(a.settings.config)
    source = html.escape(a.model.source) if own else "a preset of zerolib's catalogue"
    return (f"<p><b>{html.escape(a.model.name)}</b>: {parameter_count(a.model):,} parameters "
            f"({source}). {section_link('model')}</p>")


def state_html(a: Answers, unit: str = "GB") -> str:
    """Answer 1: the model state per GPU under each stage, and whether it fits."""
    if a.state is None:
        return _error(a.errors.get("state", ""))
    d = a.state.as_dict()
    rows = "".join(
        f"<tr><td>{html.escape(STRATEGY_NAMES[r['stage']])}</td>{_right(_bytes(r['total'], unit))}"
        f"<td>{'fits' if r['fits'] else 'does not fit'}</td></tr>" for r in d["stages"])
    device = a.state.device
    return (f"<p>Model state (parameters, gradients, optimizer state, layout "
            f"{html.escape(d['layout']['name'])}) per GPU on {d['gpus']:,} GPUs against "
            f"{html.escape(device.label)} ({_bytes(device.capacity, unit)}). "
            f"{section_link('state')}</p>"
            f"<table><thead><tr><th>Strategy</th><th>Model state per GPU</th><th>Verdict</th></tr>"
            f"</thead><tbody>{rows}</tbody></table>")


def peak_html(a: Answers, unit: str = "GB") -> str:
    """Answer 2: the peak per GPU (model state + working set) under each stage."""
    if a.peak is None:
        return _error(a.errors.get("peak", ""))
    d = a.peak.as_dict()
    rows = "".join(
        f"<tr><td>{html.escape(STRATEGY_NAMES[r['stage']])}</td>{_right(_bytes(r['total'], unit))}"
        f"{_right(_bytes(sum(r['working_set'].values()), unit))}{_right(_bytes(r['peak'], unit))}"
        f"{_right(_bytes(r['peak_reserved'], unit))}"
        f"<td>{'fits' if r['fits'] else 'does not fit'}</td></tr>" for r in d["stages"])
    ws = a.peak_settings
    judged = "the reserved peak" if d.get("fits_judges") == "peak_reserved" else "the peak"
    return (f"<p>The peak per GPU: model state plus the working set (activations at sequence "
            f"{ws.seq_len:,} and micro-batch {ws.micro_batch}, no recomputation, logits, buffers, "
            f"a {_bytes(ws.reserve_bytes, 'GiB')} reserve). The reserved peak adds the caching "
            f"allocator's reserve ({RESERVED_PPM / 10_000:.2f} % of the allocated peak, the median "
            f"of published runs); the verdict judges {judged}. {section_link('peak')}</p>"
            f"<table><thead><tr><th>Strategy</th><th>Model state</th><th>Working set</th>"
            f"<th>Peak</th><th>Peak reserved</th><th>Verdict</th></tr></thead><tbody>{rows}"
            f"</tbody></table>")


def plan_html(a: Answers, unit: str = "GB", top: int = TOP) -> str:
    """Answer 3: the planner's fastest configurations, each with what it leaves out."""
    if a.plan is None:
        return _error(a.errors.get("plan", ""))
    s, counts, fits = a.plan.settings, a.plan.counts(), a.plan.fits
    ic = s.interconnect
    where = ic.label if ic.network is None else f"{ic.name}, {s.gpus_per_node} GPUs per node"
    judged = "the reserved peak" if s.working_set.convention.judges == "peak_reserved" else "the peak"
    rows = []
    for record in fits.head(top).to_dict("records"):
        particular = left_out_for(record)
        rows.append(
            f"<tr>{_right(int(record['rank']))}<td class='prose'>"
            f"{html.escape(describe_configuration(record))}</td>"
            f"{_right(_bytes(record['peak_bytes'], unit))}"
            f"{_right(_bytes(record['peak_reserved_bytes'], unit))}"
            f"{_right(_bytes(record['headroom_bytes'], unit))}"
            f"{_right(format_value(record['step_seconds']) + ' s')}"
            f"<td class='prose'>{html.escape('; '.join(particular) or 'only what every row leaves out')}"
            "</td></tr>")
    table = (f"<table class='prose-last'><caption>The {min(top, len(fits))} fastest of "
             f"{len(fits):,} that fit</caption><thead><tr><th>Rank</th><th>Configuration</th>"
             "<th>Peak per GPU</th><th>Peak reserved</th><th>Headroom</th><th>Step</th>"
             "<th>Leaves out, besides the "
             f"list below</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
             if len(fits) else "<p><b>Nothing fits.</b></p>")
    every = "".join(f"<li>{html.escape(item)}</li>" for item in left_out_for_all())
    return (f"<p>{html.escape(s.model.name)} on {s.gpus:,} {html.escape(s.device.label)} "
            f"({html.escape(where)}), sequence {s.seq_len:,}, global batch {s.global_batch:,}, "
            f"layout {html.escape(s.layout.name)}, mfu {s.mfu:g}, engine "
            f"{html.escape(a.engine_label)}: {counts['configurations']:,} configurations, "
            f"{counts['runnable']:,} can run, <b>{counts['fit']:,} fit</b>: {judged} per GPU at "
            f"most {_bytes(s.device.capacity, unit)}, headroom the capacity less it (the reserved "
            f"peak adds the caching allocator's reserve to the peak). "
            f"{section_link('plan')}</p>{table}"
            f"<p><i>{html.escape(PLAN_HEADER)}</i> Every row leaves out: </p><ul>{every}</ul>"
            f"<p>{section_link('left_out')}</p>")


def _duration(seconds: float) -> str:
    days = seconds / 86400
    return f"{format_value(days)} days" if days >= 1 else f"{format_value(seconds / 3600)} hours"


def run_html(a: Answers) -> str:
    """Answer 4: the run's wall-clock time and GPU-hours at the fastest configuration."""
    if a.run is None:
        return _error(a.errors.get("run", ""))
    r, s = a.run, a.plan.settings
    step_seconds = float(a.plan.fits.iloc[0]["step_seconds"])
    return (f"<p>{r.tokens:,} tokens at {r.tokens_per_step:,} tokens per step (global batch "
            f"{s.global_batch:,} x sequence {s.seq_len:,}): <b>{r.steps:,} steps</b> of "
            f"{format_value(step_seconds)} s (the fastest configuration above) = "
            f"<b>{_duration(r.seconds)}</b> of wall-clock time, <b>{r.gpu_hours:,.0f} GPU-hours"
            f"</b> on {s.gpus:,} GPUs. Assumes engine {html.escape(a.engine_label)}, mfu "
            f"{s.mfu:g}, the planner's overlap, and {RUN_LEFT_OUT}. {section_link('run')}</p>")


