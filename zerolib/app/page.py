"""The engineer's page as ipywidgets: the controls, the four answers in order, the chapter's two
figures, the plan as a CSV download and a link that reopens the page as it is.

:class:`EngineerPage` reads its first settings from a URL query (Voilà hands the page's query to
the kernel as ``QUERY_STRING``), asks :func:`zerolib.app.answers.answers` on every change and
writes the answers' HTML (pure functions of :mod:`zerolib.app.answers`) and the figures' PNG
bytes into its widgets. A setting the core refuses, a query value it cannot read or a
``config.json`` it cannot read is one line on the status line; the rest keeps answering, and a
refused upload leaves the model the page answered for before (the line names it).
"""
from __future__ import annotations

import base64
import html
from collections.abc import Mapping
from dataclasses import replace

from zerolib.app import answers as answering
from zerolib.app.settings import (
    DEFAULTS,
    IDLE_VARIABLE,
    MAX_NAME_CHARS,
    MAX_TOKENS,
    PLANNED_DEVICES,
    TOKEN_EXAMPLE,
    USUAL_NODE,
    Settings,
    compact_config,
    from_query,
    to_query,
)
from zerolib.chapter.charts.plan_peaks import plan_peaks_figure
from zerolib.chapter.charts.will_it_fit import will_it_fit_figure
from zerolib.chapter.explorers.panel import EXPLORER_CLASS, TABLE_CSS, control_panel, shown_at_own_size
from zerolib.chapter.style import render_png
from zerolib.core.catalogue.devices import DEVICES
from zerolib.core.catalogue.hf_config import (
    MAX_CONFIG_BYTES,
    config_from_text,
    model_from_config,
    name_or_path,
)
from zerolib.core.catalogue.models import MODELS
from zerolib.core.catalogue.nodes import NODES
from zerolib.core.inputs import MAX_GPUS
from zerolib.core.memory.accounting import LAYOUTS
from zerolib.core.memory.model_parallel import MAX_MICRO_BATCHES
from zerolib.core.memory.tables import peak_frame
from zerolib.core.memory.working_set import MAX_MICRO_BATCH, MAX_SEQ_LEN
from zerolib.core.parse import parse_whole
from zerolib.core.units import UNITS

PAGE_CLASS = "zerolib-app"
DPI = 80                         # the explorers' resolution: readable, quick to send
UPLOADED = "uploaded config.json"   # the model menu's entry for an uploaded file
PANEL = (
    ("Model: a preset, or your own config.json", ("model", "upload")),
    ("Cluster", ("device", "gpus", "gpus_per_node", "links")),
    ("Run", ("seq_len", "global_batch", "micro_batch", "layout", "engine", "tokens", "unit")),
)
# Controls on a row of their own: menus whose entries are long (an uploaded file's name, an
# engine and its version).
WIDE = ("model", "engine")
PAGE_CSS = TABLE_CSS + f"""<style>
.{PAGE_CLASS} .zerolib-error {{color: #a00; font-weight: bold; margin: 0.2em 0;}}
.{PAGE_CLASS} h3 {{margin: 1.0em 0 0.3em;}}
</style>"""


def widgets():
    import ipywidgets
    return ipywidgets


def page_address(environ: Mapping[str, str], query: str) -> str:
    """The page's own address with ``query``, from what Voilà puts in the kernel's environment
    (``SERVER_NAME``, ``SERVER_PORT``, ``SCRIPT_NAME``); a relative ``?query`` without them."""
    host, port, path = (environ.get(k, "") for k in ("SERVER_NAME", "SERVER_PORT", "SCRIPT_NAME"))
    if not (host and path):
        return f"?{query}"
    return f"http://{host}{':' + port if port else ''}{path}?{query}"


def share_html(address: str, run_file: str | None = None) -> str:
    """The share link, and (with ``run_file``, the run's TOML) its download: one run, carried
    by both (the link packs the same file)."""
    download = "" if run_file is None else (
        f" <a download='run.toml' href='data:application/toml;base64,"
        f"{base64.b64encode(run_file.encode('utf-8')).decode('ascii')}' class='zerolib-run'>"
        f"Download this run</a> (a run file: <code>zerolib estimate --run run.toml</code> and "
        f"<code>zerolib plan --run run.toml</code> answer for it).")
    return (f"<p><a href='{html.escape(address)}' target='_blank' class='zerolib-share'>Share this "
            f"configuration</a>: the address opens the page with these settings (the model "
            f"too).{download} <code style='font-size:smaller;word-break:break-all'>"
            f"{html.escape(address)}</code></p>")


def csv_link_html(text: str, rows: int) -> str:
    """A download link of the plan's CSV as a data: URL."""
    data = base64.b64encode((text + "\n").encode("utf-8")).decode("ascii")
    return (f"<p><a download='plan.csv' href='data:text/csv;base64,{data}' "
            f"class='zerolib-csv'>Download the {rows:,} fastest configurations as CSV</a> (the "
            f"same file as <code>zerolib plan ... --format csv --top {answering.CSV_TOP}</code>)."
            "</p>")


def _file_name(name) -> str:
    """An uploaded file's name as shown: its last part, printable characters only, cut short."""
    name = str(name).replace("\\", "/").rsplit("/", 1)[-1]
    return "".join(c for c in name if c.isprintable())[:MAX_NAME_CHARS] or "config.json"


def read_upload(upload_value) -> tuple[str, str]:
    """(compact JSON text, model name) of an uploaded ``config.json``; ValueError with one line
    naming the file (and the field, where one is to blame) when it is too large (checked before
    it is read), not UTF-8, or not a config's JSON object (read as ``--config`` reads a file:
    :func:`~zerolib.core.catalogue.hf_config.config_from_text`). The name is the config's
    ``_name_or_path``, else the file's name without ``.json`` (``config.json`` itself when that
    is all there is: the model type, ``qwen2`` for Qwen2.5-14B, names no model). A file the
    model reader refuses is refused here, so that it changes nothing on the page."""
    files = list(upload_value)
    if not files:
        raise ValueError("no file was uploaded")
    item = files[-1]
    name, content = _file_name(item["name"]), item["content"]
    if len(content) > MAX_CONFIG_BYTES:
        raise ValueError(f"{name} is {len(content):,} bytes: a config.json is a few kilobytes "
                         f"(at most {MAX_CONFIG_BYTES:,} read)")
    try:
        text = bytes(content).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{name} cannot be read as JSON (it is not UTF-8 text)") from None
    data = config_from_text(text, name)
    stem = name[:-5] if name.lower().endswith(".json") else name
    model = name_or_path(data) or (stem if stem != "config" else name)
    model_from_config(data, name=model, where=name)    # refused here, the file named
    return compact_config(data), model


def idle_words(environ: Mapping[str, str]) -> str:
    """What the server does with this page's kernel (from ``zerolib app``'s
    :data:`IDLE_VARIABLE`): a sentence, or "" outside ``zerolib app``."""
    text = environ.get(IDLE_VARIABLE, "")
    if not text.isdigit() or not int(text):
        return ""
    seconds = int(text)
    after = (f"{seconds // 60} minute{'s' if seconds // 60 != 1 else ''}" if seconds % 60 == 0
             else f"{seconds} seconds")
    return (f" The answers come from a process the server keeps for this page while it is open "
            f"and stops after {after} without a change: then reload the page.")


class EngineerPage:
    """The page. ``.widget`` is what the notebook shows, ``.controls`` name -> control,
    ``.settings`` the current :class:`Settings`, ``.answers`` the current answers."""

    def __init__(self, settings: Settings = DEFAULTS, problems=(), environ: Mapping[str, str] | None = None):
        w = widgets()
        self.environ = dict(environ or {})
        self.answers = None
        self._problems = list(problems)
        self._syncing = False
        wide = {"description_width": "initial"}
        self.controls = {
            "model": w.Dropdown(options=[(name, name) for name in MODELS], description="Preset"),
            "upload": w.FileUpload(accept=".json,application/json", multiple=False,
                                   description="config.json"),
            "device": w.Dropdown(options=[(DEVICES[n].label, n) for n in PLANNED_DEVICES],
                                 description="Device"),
            "gpus": w.BoundedIntText(min=1, max=MAX_GPUS, description="GPUs"),
            "gpus_per_node": w.BoundedIntText(min=1, max=MAX_GPUS, description="GPUs per node"),
            "links": w.Dropdown(options=[("the device's usual node", USUAL_NODE)]
                                + [(name, name) for name in NODES], description="Links"),
            "seq_len": w.BoundedIntText(min=1, max=MAX_SEQ_LEN, description="Sequence"),
            "global_batch": w.BoundedIntText(min=1, max=MAX_MICRO_BATCHES,
                                             description="Global batch"),
            "micro_batch": w.BoundedIntText(min=1, max=MAX_MICRO_BATCH,
                                            description="Micro-batch (peak)"),
            "layout": w.Dropdown(options=list(LAYOUTS), description="Layout"),
            "engine": w.Dropdown(options=list(answering.engine_choices()), description="Engine",
                                 style=wide),
            "tokens": w.Text(description="Tokens", placeholder="2T",
                             tooltip=f"training tokens: {TOKEN_EXAMPLE}"),
            "unit": w.ToggleButtons(options=list(UNITS), description="Unit",
                                    style={"button_width": "60px"}),
        }
        self.status = w.HTML()
        self.parts = {name: w.HTML() for name in ("model", "state", "peak", "plan", "run",
                                                  "csv", "share")}
        self.images = {name: w.Image(format="png") for name in ("peak", "plan")}
        self.settings = settings
        self._show(settings)
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        self.widget = self._box()
        self.refresh()

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> EngineerPage:
        """The page Voilà opens: settings from the request's ``QUERY_STRING``."""
        settings, problems = from_query(environ.get("QUERY_STRING", ""))
        return cls(settings, problems, environ)

    # --- controls <-> settings -------------------------------------------------------------------

    def _model_options(self, settings: Settings):
        presets = [(name, name) for name in MODELS]
        if settings.config:
            named = settings.config_name not in ("", "config.json")   # a name beyond the file's
            label = f"{UPLOADED} ({settings.config_name})" if named else UPLOADED
            return [(label, UPLOADED), *presets]
        return presets

    def _show(self, settings: Settings) -> None:
        """Set every control to ``settings`` without answering in between."""
        c = self.controls
        self._syncing = True
        try:
            c["model"].options = self._model_options(settings)
            c["model"].value = UPLOADED if settings.config else settings.model
            for name in ("device", "gpus", "gpus_per_node", "links", "seq_len", "global_batch",
                         "micro_batch", "layout"):
                c[name].value = getattr(settings, name)
            engines = [value for _, value in c["engine"].options]
            if settings.engine and settings.engine not in engines:
                known = ", ".join(label for label, _ in c["engine"].options)
                self._problems.append(f"engine {settings.engine!r} is not one this zerolib's step "
                                      f"model knows ({known}); the page answers for "
                                      f"{c['engine'].options[0][0]}")
                settings = replace(settings, engine=engines[0])
                self.settings = settings
            c["engine"].value = settings.engine if settings.engine in engines else engines[0]
            c["tokens"].value = f"{settings.tokens:,}"
        finally:
            self._syncing = False

    def _read_controls(self) -> Settings:
        c = self.controls
        tokens = parse_whole(c["tokens"].value, "tokens", maximum=MAX_TOKENS, example=TOKEN_EXAMPLE)
        model = c["model"].value
        own = model == UPLOADED
        return replace(self.settings, model=self.settings.model if own else model,
                       config=self.settings.config if own else "",
                       config_name=self.settings.config_name if own else "",
                       device=c["device"].value, gpus=int(c["gpus"].value),
                       gpus_per_node=int(c["gpus_per_node"].value), links=c["links"].value,
                       seq_len=int(c["seq_len"].value), global_batch=int(c["global_batch"].value),
                       micro_batch=int(c["micro_batch"].value), layout=c["layout"].value,
                       engine=c["engine"].value, tokens=tokens)

    def _changed(self, change) -> None:
        if self._syncing:
            return
        if change["owner"] is self.controls["upload"]:
            self._uploaded(change["new"])
            return
        if change["owner"] is self.controls["unit"]:
            self._render()
            return
        try:
            self.settings = self._read_controls()
        except (ValueError, TypeError) as error:
            self._problems.append(str(error))
            self._render_status()
            return
        if change["owner"] is self.controls["model"]:
            self._show(self.settings)     # a preset replaces the upload: its entry goes
        self.refresh()

    def _answered_for(self) -> str:
        """The model the page answers for now, as a refusal names it."""
        model = None if self.answers is None else self.answers.model
        return model.name if model is not None else self.settings.model

    def _uploaded(self, value) -> None:
        if not value:
            return
        # The file's bytes are not kept in the widget (nor sent back), and the same file can be
        # uploaded again.
        self.controls["upload"].value = ()
        try:
            text, name = read_upload(value)
            try:
                candidate = replace(self._read_controls(), config=text, config_name=name)
            except (ValueError, TypeError):
                candidate = replace(self.settings, config=text, config_name=name)
        except (ValueError, TypeError) as error:
            self._problems.append(f"{error}; the page still answers for {self._answered_for()}")
            self._render_status()
            return
        self.settings = candidate
        self._show(candidate)
        self.refresh()

    # --- answering and drawing -------------------------------------------------------------------

    def refresh(self) -> None:
        """Ask the core for the current settings and show the answers."""
        self.answers = answering.answers(self.settings)
        if "model" in self.answers.errors and self.settings.config:
            # The config (a shared link's) cannot be read: say so in one line, and which preset
            # answers instead.
            self._problems.append(f"{self.answers.errors['model']}; the page answers for the "
                                  f"preset {self.settings.model} instead")
            self.settings = replace(self.settings, config="", config_name="")
            self._show(self.settings)
            self.answers = answering.answers(self.settings)
        self._render()

    @property
    def unit(self) -> str:
        return self.controls["unit"].value

    def _render_status(self) -> None:
        lines = [" ".join(str(p).split()) for p in self._problems]
        self.status.value = "".join(f"<p class='zerolib-error'>\u26a0 {html.escape(line)}</p>"
                                    for line in lines)
        self._problems = []

    def _render(self) -> None:
        a, unit = self.answers, self.unit
        # The figures first: the texts arrive after them, so a page that shows the new texts
        # shows the new figures too.
        self._draw("peak", None if a.peak is None else lambda: will_it_fit_figure(
            peak_frame(a.model, self.settings.gpus, tuple(r["stage"] for r in a.peak.stages),
                       a.peak_settings, self.settings.layout),
            self.settings.device, unit, dpi=DPI)[0])
        self._draw("plan", None if a.plan is None or not len(a.plan.valid) else
                   lambda: plan_peaks_figure(a.plan.valid, unit, dpi=DPI)[0])
        self.parts["model"].value = answering.model_html(a)
        self.parts["state"].value = answering.state_html(a, unit)
        self.parts["peak"].value = answering.peak_html(a, unit)
        self.parts["plan"].value = answering.plan_html(a, unit)
        self.parts["run"].value = answering.run_html(a)
        if a.plan is not None and len(a.plan.fits):
            self.parts["csv"].value = csv_link_html(answering.plan_csv(a.plan),
                                                    min(len(a.plan.fits), answering.CSV_TOP))
        else:
            self.parts["csv"].value = ""
        self.parts["share"].value = share_html(
            page_address(self.environ, to_query(self.settings, a.asked)),
            None if a.asked is None else a.asked.to_toml())
        self._render_status()

    def _draw(self, name: str, make) -> None:
        image = self.images[name]
        if make is None:
            image.layout.display = "none"
            return
        figure = make()
        image.value = render_png(figure)
        shown_at_own_size(image, figure)
        image.layout.display = None

    def _box(self):
        w = widgets()
        p, i = self.parts, self.images

        def heading(text):
            return w.HTML(f"<h3>{html.escape(text)}</h3>")

        box = w.VBox([
            w.HTML(PAGE_CSS + "<h2>Will my model train here, and how should I lay it out?</h2>"
                   "<p>Pick a model (or drop in its config.json), the cluster and the run; the "
                   "answers below follow. Every number comes from the functions behind "
                   "<code>zerolib estimate</code> and <code>zerolib plan</code>."
                   f"{idle_words(self.environ)}</p>"),
            control_panel(self.controls, PANEL, WIDE), self.status, p["model"],
            heading("1. Does the model state fit, stage by stage?"), p["state"],
            heading("2. The peak per GPU, with the working set"), p["peak"], i["peak"],
            heading("3. The planner's fastest configurations"), p["plan"], i["plan"], p["csv"],
            heading("4. The whole run"), p["run"], p["share"]])
        box.add_class(EXPLORER_CLASS)
        box.add_class(PAGE_CLASS)
        return box
