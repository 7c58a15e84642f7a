"""Helpers for the browser tests: a throw-away JupyterLab server and a headless Chromium.

Facts these helpers rely on (measured on the project's 2-core machines, see the team notes):
- Debian's ``chromium`` at /usr/bin/chromium, driven by the Python ``playwright`` package through
  ``executable_path`` (``playwright install`` cannot download its own browser here).
- As root, Chromium needs ``--no-sandbox``; the networking flags stop it from calling Google's hosts,
  which the closed network refuses.
- JupyterLab exits at once as root without ``--allow-root``, and shows a "Jupyter news?" popup unless
  the notification extension is told not to fetch news.
- Pressing Run All before the kernel is ready opens a modal "Select Kernel" dialog: wait for "Idle".
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
INSTALL_CHROMIUM = "apt-get install -y chromium (Debian/Ubuntu), or set ZEROLIB_CHROMIUM to a Chromium binary"
INSTALL_PLAYWRIGHT = "pip install -e '.[test]'"

CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
)

# Generous ceilings: a cold kernel start plus matplotlib's first import takes ~5 s on 2 cores.
SERVER_START_SECONDS = 60
KERNEL_IDLE_MS = 60_000
RUN_ALL_MS = 120_000
WIDGET_UPDATE_MS = 20_000


# --- one notebook holding every chapter explorer ---------------------------------------------------

SETUP = "import zerolib as zl\nfrom zerolib.core.units import GiB\nTiB = 1024 * GiB"


def explorer_calls() -> dict[str, str]:
    """Per notebook with an explorer: the code that builds it, as the notebook has it."""
    calls = {}
    for path in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and re.search(r"^explorer = zl\.\w+Explorer\(",
                                                      cell.source, re.M):
                lines = cell.source.splitlines()
                end = next(i for i, line in enumerate(lines)
                           if line.startswith(("Image(", "explorer.widget")))
                calls[path.stem] = "\n".join(lines[:end])
    return calls


CALLS = explorer_calls()


def model_lines() -> list[str]:
    """The lines that read a model of one's own (notebook 08's ``model = zl.model_from_config(...)``):
    an explorer call may use that model, so the layout notebook reads it the same way."""
    return [line for path in sorted(NOTEBOOK_DIR.glob("*.ipynb"))
            for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"
            for line in cell.source.splitlines() if re.match(r"model = zl\.model_from_\w+\(", line)]


def layout_notebook() -> nbformat.NotebookNode:
    """One notebook building every chapter explorer, each in its own cell, as its notebook does.
    It sits in a folder ``notebooks`` beside a copy of ``tests/data`` (see :func:`serve_beside_data`)."""
    cells = [nbformat.v4.new_code_cell("\n".join([SETUP, *model_lines()]))]
    for stem, call in CALLS.items():
        cells.append(nbformat.v4.new_markdown_cell(f"# {stem}"))
        cells.append(nbformat.v4.new_code_cell(f"{call}\nexplorer.widget"))
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})


def write_layout_notebook(work: Path, name: str = "explorers.ipynb") -> Path:
    """``work/notebooks/NAME``, the layout notebook, beside a copy of ``tests/data`` (notebook
    08 reads its model from ``../tests/data``, as in the checkout); returns the notebooks folder."""
    root = work / "notebooks"
    root.mkdir()
    nbformat.write(layout_notebook(), root / name)
    shutil.copytree(NOTEBOOK_DIR.parent / "tests" / "data", work / "tests" / "data")
    return root


def run_explorers(page, lab, expect, name: str = "explorers.ipynb", expected: int | None = None):
    """Open the explorers' notebook, Run All once the kernel is idle, wait for every image (one
    per explorer unless told how many)."""
    count = len(CALLS) if expected is None else expected
    page.goto(lab.notebook_url(name))
    expect(page.locator(".jp-StatusBar-Widget")).to_contain_text("| Idle", timeout=KERNEL_IDLE_MS)
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()
    images = page.locator(".jp-NotebookPanel:visible img.widget-image")
    expect(images).to_have_count(count, timeout=RUN_ALL_MS)
    expect(page.locator(".jp-StatusBar-Widget")).to_contain_text("| Idle", timeout=RUN_ALL_MS)
    for i in range(count):
        page.wait_for_function("(img) => img.complete && img.naturalWidth > 0",
                               arg=images.nth(i).element_handle(), timeout=WIDGET_UPDATE_MS)


def explorer_output(page, stem: str):
    """The output area of the explorer built by notebook ``stem``'s call, scrolled into view."""
    output = page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output",
                          has=page.locator("img.widget-image")).nth(list(CALLS).index(stem))
    output.scroll_into_view_if_needed()
    return output


def find_chromium() -> str | None:
    """The Chromium binary: $ZEROLIB_CHROMIUM if set (and only it), else chromium on PATH, else
    Debian's /usr/bin/chromium; None when there is none. ``ZEROLIB_CHROMIUM=none`` hides every
    Chromium (CI's first phase meets the README as a newcomer without one)."""
    override = os.environ.get("ZEROLIB_CHROMIUM")
    if override == "none":
        return None
    candidates = [override] if override else [shutil.which("chromium"),
                                              shutil.which("chromium-browser"), "/usr/bin/chromium"]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group started for ``process``, SIGKILL it if it lingers."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass(frozen=True)
class LabServer:
    url: str          # http://127.0.0.1:PORT/
    token: str
    root_dir: Path    # the temporary copy of the notebooks the server serves
    log: Path

    def notebook_url(self, name: str) -> str:
        # ?reset: a fresh workspace, so tabs opened by an earlier test do not come back.
        return f"{self.url}lab/tree/{name}?reset&token={self.token}"


def write_server_token(config_dir: Path, token: str) -> Path:
    """The server's token in its own config file (owner-only): not on the command line, where
    any local user could read it with ``ps``."""
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / "jupyter_server_config.json"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        json.dump({"IdentityProvider": {"token": token}}, stream)
    return path


def lab_command(port: int, root_dir: Path) -> list[str]:
    """The JupyterLab command line (no secret in it: the token comes from the config file)."""
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        "--port-retries=0", f"--ServerApp.root_dir={root_dir}",
        # No calls to the closed network: no news feed, no update check.
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    return command


def _write_lab_settings(config_dir: Path) -> None:
    """Turn off the "Jupyter news?" popup (and update checks), which would cover the notebook."""
    settings = config_dir / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))


@contextlib.contextmanager
def jupyter_lab(root_dir: Path, work_dir: Path):
    """Run JupyterLab on 127.0.0.1 (random token, free port) serving ``root_dir``; always stop it."""
    token = secrets.token_hex(24)
    port = free_port()
    home = work_dir / "jupyter"
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
        JUPYTER_PLATFORM_DIRS="1", PYTHONUNBUFFERED="1",
        # The kernel must be this interpreter (where zerolib is installed), whatever PATH says.
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    env.pop("JUPYTER_PATH", None)
    _write_lab_settings(home / "config")
    write_server_token(home / "config", token)
    command = lab_command(port, root_dir)
    log = work_dir / "jupyterlab.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, cwd=root_dir, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_for_server(process, f"{url}api/status?token={token}", log)
        yield LabServer(url=url, token=token, root_dir=root_dir, log=log)
    finally:
        stop_process_group(process)


AUTOSAVE_SECONDS = 2     # JupyterLab's autosave interval in the reading tests (120 s by default)


def reader_settings(config_dir: Path, autosave_seconds: int = AUTOSAVE_SECONDS) -> None:
    """A reader's own JupyterLab settings: autosave every ``autosave_seconds``."""
    folder = config_dir / "lab" / "user-settings" / "@jupyterlab" / "docmanager-extension"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plugin.jupyterlab-settings").write_text(json.dumps({"autosaveInterval": autosave_seconds}))


@contextlib.contextmanager
def zerolib_lab(work_dir: Path):
    """``zerolib lab`` as a reader runs it (its working copy in ``work_dir/lab``, a free port),
    with Jupyter's folders of its own under ``work_dir`` and a 2 s autosave; always stopped."""
    port = free_port()
    home = work_dir / "jupyter"
    env = dict(os.environ)
    env.update(JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
               JUPYTER_PLATFORM_DIRS="1", PYTHONUNBUFFERED="1")
    env.pop("JUPYTER_PATH", None)
    reader_settings(home / "config")
    script = Path(sys.executable).parent / "zerolib"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "zerolib"]
    workdir = work_dir / "lab"
    out = work_dir / "zerolib-lab.out"
    with open(out, "wb") as stream:
        process = subprocess.Popen([*command, "lab", "--port", str(port), "--workdir", str(workdir)],
                                   env=env, stdout=stream, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while (match := re.search(r"at (http://127\.0\.0\.1:\d+/)lab/tree/\S+\?token=(\w+)",
                                  out.read_text())) is None:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"zerolib lab did not start:\n{out.read_text()[-3000:]}")
            time.sleep(0.25)
        yield LabServer(url=match[1], token=match[2], root_dir=workdir / "notebooks",
                        log=workdir / "state" / "jupyterlab.log")
    finally:
        # zerolib lab stops its server on SIGTERM (within its own 20 s): give it the time.
        stop_process_group(process, grace=40.0)


def _wait_for_server(process: subprocess.Popen, status_url: str, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(status_url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"JupyterLab did not answer within {SERVER_START_SECONDS} s:\n"
                       f"{log.read_text()[-3000:]}")


@contextlib.contextmanager
def chromium(playwright, user_data_dir: Path, executable: str):
    """A headless Chromium with a fresh profile; tall pages, so a whole explorer fits on screen."""
    context = playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=executable, headless=True, args=list(CHROMIUM_ARGS),
        viewport={"width": 1280, "height": 1800})
    try:
        yield context
    finally:
        context.close()


# --- a finished layout, measured from the page (the explorers' and the engineer's page's) ----

SLIDER_TRACK_PX = 150     # shortest slider track on which one step is a visible move
PADDING_PX = 4            # least horizontal padding of a table cell
SHORT_CELL = 24           # data cells of at most this many characters stay on one line


# Measured inside the page: everything the checks below read, as plain data.
MEASURE = """(root) => {
  const box = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width, height: r.height}; };
  const visible = (el) => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const text = (el) => (el.innerText || el.textContent || '').replace(/\\s+/g, ' ').trim();
  const lines = (el) => { const range = document.createRange(); range.selectNodeContents(el);
    const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
    return tops.size; };
  const canvas = document.createElement('canvas').getContext('2d');
  const textWidth = (el, t) => { const s = getComputedStyle(el);
    canvas.font = `${s.fontWeight} ${s.fontSize} ${s.fontFamily}`; return canvas.measureText(t).width; };
  const out = {labels: [], controls: [], dropdowns: [], sliders: [], multiples: [], cells: [], images: [],
               frame: box(root), outside: []};
  for (const widget of root.querySelectorAll('.widget-inline-hbox, .widget-toggle-buttons, .widget-checkbox')) {
    if (!visible(widget)) continue;
    const label = widget.querySelector(':scope > .widget-label');
    const parts = [...widget.children].filter(
      c => c !== label && visible(c) && !c.classList.contains('widget-readout'));
    if (label && visible(label) && text(label)) {
      out.labels.push({text: text(label), box: box(label), clipped: label.scrollWidth > label.clientWidth + 1,
                       control: parts.length ? box(parts[0]) : null});
    }
    for (const part of parts) out.controls.push({label: label ? text(label) : '', box: box(part)});
    const edge = box(widget);
    if (edge.right > out.frame.right + 0.5 || edge.left < out.frame.left - 0.5)
      out.outside.push(label ? text(label) : text(widget));
  }
  for (const button of root.querySelectorAll('.widget-toggle-button, button.widget-button')) {
    if (!visible(button)) continue;
    out.labels.push({text: text(button), box: box(button), clipped: button.scrollWidth > button.clientWidth + 1,
                     control: null, button: true});
  }
  for (const select of root.querySelectorAll('.widget-dropdown select')) {
    const chosen = select.selectedIndex >= 0 ? select.options[select.selectedIndex].text : '';
    out.dropdowns.push({label: text(select.closest('.widget-dropdown').querySelector('.widget-label') || select),
                        chosen, width: select.clientWidth, needed: chosen ? textWidth(select, chosen) + 24 : 0});
  }
  for (const slider of root.querySelectorAll('.widget-slider')) {
    const track = slider.querySelector('.slider-container') || slider.querySelector('.slider');
    out.sliders.push({label: text(slider.querySelector('.widget-label') || slider),
                      track: track ? box(track).width : 0});
  }
  for (const select of root.querySelectorAll('.widget-select-multiple select')) {
    const frame = box(select);
    const hidden = [...select.selectedOptions].filter(o => { const r = o.getBoundingClientRect();
      return r.height === 0 || r.top < frame.top - 1 || r.bottom > frame.bottom + 1; }).map(o => o.text);
    out.multiples.push({label: text(select.closest('.widget-select-multiple').querySelector('.widget-label') || select),
                        selected: select.selectedOptions.length, hidden});
  }
  for (const cell of root.querySelectorAll('table td, table th')) {
    const s = getComputedStyle(cell);
    out.cells.push({text: text(cell), lines: lines(cell), align: s.textAlign, th: cell.tagName === 'TH',
                    header: cell.tagName === 'TH' || cell.cellIndex === 0,
                    padding: Math.min(parseFloat(s.paddingLeft), parseFloat(s.paddingRight))});
  }
  for (const table of root.querySelectorAll('table')) {
    if (box(table).right > out.frame.right + 0.5)
      out.outside.push(`table ${text(table.caption || table).slice(0, 40)}`);
  }
  for (const img of root.querySelectorAll('img.widget-image')) {
    out.images.push({shown: img.getBoundingClientRect().width, natural: img.naturalWidth});
    if (box(img).right > out.frame.right + 0.5) out.outside.push('the figure');
  }
  return out;
}"""


def overlaps(a: dict, b: dict, slack: float = 0.5) -> bool:
    return (a["left"] < b["right"] - slack and b["left"] < a["right"] - slack
            and a["top"] < b["bottom"] - slack and b["top"] < a["bottom"] - slack)


NUMBER = re.compile(r"^[<>≈~]?\s*[\d,.]+%?( ?(GB|GiB|TB|s|ms|TiB|B|M|T))?( \(.*\))?$")


def layout_problems(m: dict) -> list[str]:
    """Everything wrong with one explorer's measurements, in words."""
    problems = []
    for d in m["dropdowns"]:
        if not d["chosen"]:
            problems.append(f"dropdown {d['label']!r} shows no value")
        elif d["width"] < d["needed"]:
            problems.append(f"dropdown {d['label']!r} is {d['width']:.0f} px wide, its value "
                            f"{d['chosen']!r} needs {d['needed']:.0f} px")
    for s in m["sliders"]:
        if s["track"] < SLIDER_TRACK_PX:
            problems.append(f"slider {s['label']!r} has a {s['track']:.0f} px track "
                            f"(at least {SLIDER_TRACK_PX} px)")
    for label in m["labels"]:
        if label["clipped"]:
            problems.append(f"label {label['text']!r} is cut off")
        control = label["control"]
        if control is not None:
            b = label["box"]
            if not (b["top"] < control["bottom"] and control["top"] < b["bottom"]):
                problems.append(f"label {label['text']!r} is not on its control's line")
            elif b["right"] > control["left"] + 0.5:
                problems.append(f"label {label['text']!r} runs into its control")
    boxes = [(f"label {x['text']!r}", x["box"]) for x in m["labels"] if not x.get("button")]
    boxes += [(f"control of {x['label']!r}", x["box"]) for x in m["controls"]]
    for i, (name_a, a) in enumerate(boxes):
        for name_b, b in boxes[i + 1:]:
            if overlaps(a, b) and not (a["left"] <= b["left"] and b["right"] <= a["right"]
                                       and a["top"] <= b["top"] and b["bottom"] <= a["bottom"]):
                problems.append(f"{name_a} overlaps {name_b}")
    for name in m["outside"]:
        problems.append(f"{name!r} runs past the explorer's edge")
    for s in m["multiples"]:
        if s["hidden"]:
            problems.append(f"list {s['label']!r} hides selected {s['hidden']} of {s['selected']}")
    for cell in m["cells"]:
        if cell["padding"] < PADDING_PX:
            problems.append(f"table cell {cell['text']!r} has {cell['padding']:.0f} px padding")
        if not cell["th"] and cell["text"] and len(cell["text"]) <= SHORT_CELL and cell["lines"] > 1:
            problems.append(f"table cell {cell['text']!r} wraps")
        if not cell["header"] and NUMBER.match(cell["text"]) and cell["align"] not in ("right", "end"):
            problems.append(f"number {cell['text']!r} is not right-aligned")
    for image in m["images"]:
        if abs(image["shown"] - image["natural"]) > 1:
            problems.append(f"the figure is shown {image['shown']:.0f} px wide, it is drawn "
                            f"{image['natural']} px wide: its text is scaled")
    return list(dict.fromkeys(problems))
