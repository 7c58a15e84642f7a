"""``zerolib lab``: JupyterLab on the chapter's notebooks, bound to 127.0.0.1, stopped by Ctrl-C.

What it adds to ``jupyter lab notebooks/``:

- ``--allow-root`` when run as root (JupyterLab refuses to start as root without it);
- 127.0.0.1 only, one port (``--port``, no silent move to the next one: a port that is taken is
  a one-line error), no browser unless ``--browser``;
- the project's JupyterLab settings, as overrides of the defaults in a folder of their own
  (``--LabApp.app_settings_dir``): no "Jupyter news?" pop-up over the first notebook and no
  update notice. The user's own settings (``~/.jupyter/lab/user-settings``) are read as usual
  and never written by this command; anything they set still wins over these defaults.

The server runs in its own session, so Ctrl-C (or SIGTERM) reaches this command only; it then
stops the server (SIGTERM, which shuts its kernels down) and removes the settings folder.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import webbrowser
from pathlib import Path

from zerolib.core.parse import parse_whole
from zerolib.paths import NOTEBOOK_DIR

HOST = "127.0.0.1"
DEFAULT_PORT = 8888
FIRST_NOTEBOOK = "00-index.ipynb"
# Defaults for JupyterLab's notification extension: the news question pops up over the lower
# right of the first notebook; the chapter's environment is pinned, so an update notice is noise.
SETTINGS = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                            "checkForUpdates": False}}
# Files of the environment's own application settings folder, kept when we point JupyterLab at
# ours (overrides.json is merged under ours).
_APP_SETTINGS_FILES = ("overrides.json", "page_config.json")
START_SECONDS = 120      # a cold start on a loaded 2-core machine takes a few seconds
STOP_SECONDS = 20


def register(commands) -> None:
    parser = commands.add_parser(
        "lab", help="start JupyterLab on the chapter (127.0.0.1, notebooks/)",
        description="Start JupyterLab in the chapter's notebooks/ folder on 127.0.0.1, print the "
                    "address of 00-index.ipynb (with its access token) and run until Ctrl-C. As "
                    "root it adds --allow-root. It starts without JupyterLab's news pop-up and "
                    "update notice (defaults in a settings folder of its own; your own "
                    "JupyterLab settings are read, never written).")
    parser.add_argument("--port", default=str(DEFAULT_PORT), metavar="N",
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}); one that is taken is "
                             "an error, not a move to another")
    parser.add_argument("--browser", action="store_true",
                        help="open the address in the default web browser (default: open nothing)")
    parser.set_defaults(func=run)


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def lab_argv(port: int, root_dir: Path, settings_dir: Path, as_root: bool,
             python: str = sys.executable) -> list[str]:
    """The JupyterLab command line (no secret in it: the token travels in the environment)."""
    argv = [python, "-m", "jupyterlab", "--no-browser", f"--ip={HOST}", f"--port={port}",
            "--port-retries=0", f"--ServerApp.root_dir={root_dir}",
            f"--LabApp.app_settings_dir={settings_dir}",
            # Only warnings and errors: the address this command prints is the one to use.
            "--log-level=WARN"]
    if as_root:
        argv.append("--allow-root")
    return argv


def lab_environment(base: dict[str, str], token: str, python: str = sys.executable) -> dict[str, str]:
    """``base`` with the server's token and this interpreter's folder first on PATH (the kernel
    then runs where zerolib is installed, whatever else PATH holds)."""
    env = dict(base)
    env["JUPYTER_TOKEN"] = token
    env["PATH"] = os.pathsep.join([str(Path(python).parent), *filter(None, [base.get("PATH")])])
    return env


def lab_url(port: int, token: str) -> str:
    return f"http://{HOST}:{port}/lab/tree/{FIRST_NOTEBOOK}?token={token}"


def default_app_settings_dir() -> Path:
    """Where JupyterLab looks for application settings when not told otherwise."""
    app_dir = os.environ.get("JUPYTERLAB_DIR") or os.path.join(sys.prefix, "share", "jupyter", "lab")
    return Path(app_dir) / "settings"


def write_settings(folder: Path, environment_settings: Path | None = None) -> Path:
    """``folder`` as JupyterLab's application settings: the environment's own files, with
    :data:`SETTINGS` merged into ``overrides.json``."""
    overrides: dict = {}
    source = environment_settings or default_app_settings_dir()
    for name in _APP_SETTINGS_FILES:
        path = source / name
        if path.is_file():
            if name == "overrides.json":
                with contextlib.suppress(ValueError):
                    overrides = json.loads(path.read_text(encoding="utf-8"))
            else:
                shutil.copyfile(path, folder / name)
    for plugin, values in SETTINGS.items():
        overrides[plugin] = {**overrides.get(plugin, {}), **values}
    (folder / "overrides.json").write_text(json.dumps(overrides, indent=2, sort_keys=True) + "\n",
                                           encoding="utf-8")
    return folder / "overrides.json"


def check_port(port: int) -> None:
    """ValueError when ``port`` on 127.0.0.1 is taken (JupyterLab's own message would be a page
    of log lines)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the server binds (tornado sets SO_REUSEADDR): a port a stopped server left in
        # TIME_WAIT is free, one something listens on is not.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as error:
            raise ValueError(f"--port {port} is taken on {HOST} ({error.strerror or error}): stop "
                             f"what listens there or pick another with --port N") from None


def port_from(text: str) -> int:
    return parse_whole(text, "--port", maximum=65535, example="a port number like 8888")


def _answers(port: int, token: str) -> bool:
    request = urllib.request.Request(f"http://{HOST}:{port}/api/status",
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group (its kernels with it), SIGKILL it if it lingers."""
    for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(args) -> int:
    port = port_from(args.port)
    check_port(port)
    # `kill` stops the server as Ctrl-C does, rather than leaving it running without us.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with tempfile.TemporaryDirectory(prefix="zerolib-lab-settings-") as folder:
            write_settings(Path(folder))
            return _serve(port, Path(folder), args.browser)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _serve(port: int, settings_dir: Path, browser: bool) -> int:
    token = secrets.token_hex(24)
    process = subprocess.Popen(
        lab_argv(port, NOTEBOOK_DIR, settings_dir, is_root()),
        cwd=NOTEBOOK_DIR, env=lab_environment(dict(os.environ), token),
        start_new_session=True)   # Ctrl-C comes to us; we stop the server
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _answers(port, token):
            if process.poll() is not None:
                print(f"zerolib lab: error: JupyterLab exited with status {process.returncode} "
                      f"before answering on {HOST}:{port} (its messages are above)", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"zerolib lab: error: JupyterLab did not answer on {HOST}:{port} within "
                      f"{START_SECONDS} s", file=sys.stderr)
                return 1
            time.sleep(0.25)
        url = lab_url(port, token)
        print(f"JupyterLab is serving {NOTEBOOK_DIR} at {url}"
              + (" (as root: --allow-root)" if is_root() else "") + "; Ctrl-C stops it.", flush=True)
        if browser:
            webbrowser.open(url)
        return 0 if process.wait() == 0 else 1
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the stop short
        print("zerolib lab: stopping JupyterLab", file=sys.stderr, flush=True)
        return 0
    finally:
        _stop(process)
