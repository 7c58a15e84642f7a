"""``zerolib app`` as a newcomer meets it: the command started as a subprocess, the page opened in
headless Chromium, a config.json from tests/data uploaded, the GPUs and the engine changed, the
answers checked against zerolib's own functions, the layout measured as the explorers' is (no
blank dropdown, no clipped label, no control past the edge), a screenshot written to
test-output/browser/app-page.png, the share link reopened, and the server stopped by Ctrl-C with
nothing left behind (its process group gone, its port free)."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from browser_support import MEASURE, chromium, free_port, layout_problems
from conftest import REPO

from zerolib.app.answers import engine_choices
from zerolib.app.settings import Settings, compact_config
from zerolib.core.planner import plan

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCREENSHOTS = REPO / "test-output" / "browser"
CONFIG = REPO / "tests" / "data" / "mistral-7b-v0.3.json"
START_SECONDS = 45        # Voila's first answer on a loaded 2-core machine: a few seconds
ANSWER_MS = 45_000        # a page load starts a kernel and runs the page's one cell


def _first_line(process: subprocess.Popen, seconds: float) -> str:
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    assert ready, f"zerolib app printed nothing within {seconds} s (exit status {process.poll()})"
    return process.stdout.readline()


@pytest.fixture
def app_server(tmp_path):
    port = free_port()
    home = tmp_path / "jupyter"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"), PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    env.pop("JUPYTER_PATH", None)
    command = [str(Path(sys.executable).parent / "zerolib"), "app", "--port", str(port)]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)
    try:
        line = _first_line(process, START_SECONDS)
        match = re.search(rf"at (http://127\.0\.0\.1:{port}/\?token=(\w+));", line)
        assert match, f"no address in {line!r}"
        yield {"process": process, "port": port, "url": match[1], "token": match[2],
               "start_seconds": time.monotonic() - started}
    finally:
        _stop_everything(process)


def _stop_everything(process: subprocess.Popen) -> None:
    """However the test ended: Ctrl-C to ``zerolib app`` (which stops Voila, in a session of its
    own, and its kernels), then SIGKILL to whatever is still below it."""
    below = _descendants(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for pid in below:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (read from /proc): the server's kernels among them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _text(page, selector: str) -> str:
    return " ".join(page.locator(selector).inner_text().split())


def _wait_for(page, selector: str, needle: str) -> None:
    page.wait_for_function(
        "([sel, needle]) => { const el = document.querySelector(sel);"
        " return el && el.innerText.replace(/\\s+/g, ' ').includes(needle); }",
        arg=[selector, needle], timeout=ANSWER_MS)


def _control(page, label: str):
    """The input of the ipywidgets control labelled ``label``."""
    return page.locator(".zerolib-app .widget-inline-hbox", has=page.locator(
        f".widget-label:text-is('{label}')")).locator("input, select").first


def _expected_fit_count(gpus: int) -> int:
    config = __import__("zerolib").model_from_config(json.loads(CONFIG.read_text()),
                                                      name="mistral-7b-v0.3")
    s = Settings()
    return plan(config, gpus, s.gpus_per_node, s.device, s.seq_len, s.global_batch).counts()["fit"]


def test_the_page_answers_an_uploaded_config_and_stops_clean(app_server, playwright, chromium_path,
                                                            tmp_path):
    assert app_server["start_seconds"] < START_SECONDS
    with chromium(playwright, tmp_path / "profile", chromium_path) as context:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        opened = time.monotonic()
        page.goto(app_server["url"], wait_until="domcontentloaded", timeout=ANSWER_MS)
        _wait_for(page, ".zerolib-app", "4. The whole run")
        _wait_for(page, ".zerolib-app", "GPU-hours")
        timings = {"start": app_server["start_seconds"], "first answers": time.monotonic() - opened}

        # Upload a config.json: the model answer names it with its exact count.
        # (ipywidgets' upload button opens a file chooser from an input outside the page's DOM)
        with page.expect_file_chooser() as chooser:
            page.locator(".zerolib-app .widget-upload").click()
        chooser.value.set_files(str(CONFIG))
        _wait_for(page, ".zerolib-app", "mistral-7b-v0.3: 7,248,023,552 parameters")

        # Change the GPUs: the planner answers for 32.
        gpus = _control(page, "GPUs")
        gpus.fill("32")
        changed = time.monotonic()
        gpus.press("Enter")
        _wait_for(page, ".zerolib-app", "mistral-7b-v0.3 on 32 ")
        timings["GPUs changed"] = time.monotonic() - changed
        fit = _expected_fit_count(32)
        _wait_for(page, ".zerolib-app", f"{fit:,} fit")

        # The engine: each one the installed step model knows is offered and named.
        engine = _control(page, "Engine")
        offered = [" ".join(t.split()) for t in engine.locator("option").all_inner_texts()]
        assert offered == [label for label, _ in engine_choices()]
        if len(offered) > 1:
            engine.select_option(label=offered[1])
            _wait_for(page, ".zerolib-app", f"engine {offered[1]}")
        else:
            assert "engine " + offered[0] in _text(page, ".zerolib-app")

        text = _text(page, ".zerolib-app")
        for heading in ("1. Does the model state fit", "2. The peak per GPU",
                        "3. The planner's fastest", "4. The whole run"):
            assert heading in text
        assert text.index("1. Does") < text.index("2. The peak") < text.index("3. The planner") \
            < text.index("4. The whole run")
        assert "⚠" not in text, text[:2000]

        # The CSV download is the plan's table.
        href = page.locator("a.zerolib-csv").get_attribute("href")
        assert href.startswith("data:text/csv;base64,")
        csv_text = base64.b64decode(href.split(",", 1)[1]).decode()
        assert csv_text.startswith("rank,tensor_parallel,pipeline_parallel,data_parallel,")

        # Layout: the explorers' checks, and a screenshot.
        root = page.locator(".zerolib-app").first
        problems = layout_problems(root.evaluate(MEASURE))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        # Voila scrolls inside its own container: a viewport as tall as the page shows it whole.
        height = page.evaluate("Math.ceil(document.querySelector('.zerolib-app')"
                               ".getBoundingClientRect().bottom + window.scrollY) + 24")
        page.set_viewport_size({"width": 1280, "height": min(int(height), 12000)})
        page.screenshot(path=str(SCREENSHOTS / "app-page.png"))
        assert not problems, "\n".join(problems)

        # The share link reopens the page as it was: the uploaded model and 32 GPUs.
        share = page.locator("a.zerolib-share").get_attribute("href")
        query = parse_qs(urlsplit(share).query, keep_blank_values=True)
        assert query["gpus"] == ["32"] and query["config_name"] == ["mistral-7b-v0.3"]
        assert "token" not in query       # the server's secret is not shared
        again = context.new_page()
        again.goto(share, wait_until="domcontentloaded", timeout=ANSWER_MS)
        _wait_for(again, ".zerolib-app", "mistral-7b-v0.3 on 32 ")
        assert _control(again, "GPUs").input_value() == "32"
        assert not errors, errors
    print("\nzerolib app seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))

    process = app_server["process"]
    below = _descendants(process.pid)
    assert below, "the server started no process"
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0
    assert "zerolib app: stopping Voila" in process.stderr.read()
    with pytest.raises(ProcessLookupError):       # the server's whole group is gone
        os.killpg(process.pid, 0)
    assert not [pid for pid in below if _alive(pid)], "processes left behind"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", app_server["port"]), timeout=5).close()
    assert compact_config(json.loads(CONFIG.read_text()))   # the file itself was left as it was
