"""``zerolib lab``: JupyterLab on a working copy of the chapter, bound to 127.0.0.1, stopped by Ctrl-C.

What it adds to ``jupyter lab notebooks/``:

- a working copy (:mod:`zerolib.publish.reading`, ``build/lab/`` unless ``--workdir`` says
  otherwise): what the reader runs and saves never writes the committed notebooks; the copies
  are marked trusted in a signature store of their own, so JupyterLab draws each saved explorer
  before the kernel runs; ``--reset`` takes a fresh copy;
- the server's messages (deprecations, trust, the kernel's transport, the build check) go to a
  log in the working copy's ``state/``; the terminal shows where the copy is, the address and
  how to stop;
- ``--allow-root`` when run as root (JupyterLab refuses to start as root without it);
- 127.0.0.1 only, one port (``--port``, no silent move to the next one: a port that is taken is
  a one-line error), no browser unless ``--browser``;
- the project's JupyterLab settings, as overrides of the defaults in a folder of their own
  (``--LabApp.app_settings_dir``): no "Jupyter news?" pop-up over the first notebook and no
  update notice. The user's own settings (``~/.jupyter/lab/user-settings``) are read as usual
  and never written by this command; anything they set still wins over these defaults;
- a quiet terminal (:data:`QUIET`): warnings and errors only, and none of the notices a reader
  cannot act on: the kernels' sockets are encrypted (jupyter_client's ``transport_encryption``,
  where pyzmq has Curve), so no kernel warns about plain TCP; websocket pings are timed as
  tornado requires; notebook_shim, a bridge for the classic Notebook's extensions that
  JupyterLab does not need, is not loaded (it reads every server setting, a deprecated one
  among them, which warns); and the server is stopped through its own ``/api/shutdown``.

The server runs in its own session, so Ctrl-C (or SIGTERM) reaches this command only; it then
stops the server (SIGTERM, which shuts its kernels down) and removes the settings folder.
The working copy stays, with the reader's changes, for the next start.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from zerolib.cli._server import (
    HOST,
    Server,
    check_port,
    is_root,
    port_from,
    serve,
    server_environment,
    sigterm_as_ctrl_c,
)
from zerolib.cli._summaries import SUMMARIES

DEFAULT_PORT = 8888
# Server settings that keep the terminal to what a reader can act on (see the module doc).
QUIET = ("--log-level=WARN", "--LabApp.log_level=WARN",
         '--ServerApp.tornado_settings={"ws_ping_timeout": 30000}',
         '--ServerApp.jpserver_extensions={"notebook_shim": False}')
ENCRYPTED = "--KernelManager.transport_encryption=auto"
FIRST_NOTEBOOK = "00-index.ipynb"
# Defaults for JupyterLab's notification extension: the news question pops up over the lower
# right of the first notebook; the chapter's environment is pinned, so an update notice is noise.
SETTINGS = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                            "checkForUpdates": False}}
# Files of the environment's own application settings folder, kept when we point JupyterLab at
# ours (overrides.json is merged under ours).
_APP_SETTINGS_FILES = ("overrides.json", "page_config.json")


def register(commands) -> None:
    parser = commands.add_parser(
        "lab", help=SUMMARIES["lab"],
        description="Start JupyterLab on 127.0.0.1 on a working copy of the chapter's notebooks "
                    "(build/lab/ unless --workdir says otherwise), print the address of "
                    "00-index.ipynb (with its access token) and run until Ctrl-C. What you run "
                    "and save lands in the copy, never in the committed notebooks/; the copy is "
                    "kept between starts (--reset takes a fresh one) and each saved explorer "
                    "shows before you run its notebook. As root it adds --allow-root. It starts "
                    "without JupyterLab's news pop-up and update notice (defaults in a settings "
                    "folder of its own; your own JupyterLab settings are read, never written); "
                    "the server's messages go to a log in the copy's state/ folder.")
    parser.add_argument("--port", default=str(DEFAULT_PORT), metavar="N",
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}); one that is taken is "
                             "an error, not a move to another")
    parser.add_argument("--browser", action="store_true",
                        help="open the address in the default web browser (default: open nothing)")
    parser.add_argument("--workdir", metavar="DIR",
                        help="folder of the working copy (default: build/lab in the repository, "
                             "git-ignored); created when missing")
    parser.add_argument("--reset", action="store_true",
                        help="remove the working copy first and take a fresh one (your changes "
                             "to it are lost)")
    parser.set_defaults(func=run)


def curve_available() -> bool:
    """Whether pyzmq can encrypt the kernels' sockets (jupyter_client refuses the setting
    without it)."""
    import zmq
    return bool(zmq.has("curve"))


def lab_argv(port: int, root_dir: Path, settings_dir: Path, as_root: bool,
             python: str = sys.executable, extra: tuple[str, ...] = (),
             encrypted: bool | None = None) -> list[str]:
    """The JupyterLab command line (no secret in it: the token travels in the environment);
    ``extra`` options go before ``--allow-root``."""
    argv = [python, "-m", "jupyterlab", "--no-browser", f"--ip={HOST}", f"--port={port}",
            "--port-retries=0", f"--ServerApp.root_dir={root_dir}",
            f"--LabApp.app_settings_dir={settings_dir}", *QUIET, *extra]
    if curve_available() if encrypted is None else encrypted:
        argv.append(ENCRYPTED)
    if as_root:
        argv.append("--allow-root")
    return argv


def lab_environment(base: dict[str, str], token: str, python: str = sys.executable) -> dict[str, str]:
    """``base`` with the server's token and this interpreter's folder first on PATH (the kernel
    then runs where zerolib is installed, whatever else PATH holds)."""
    return server_environment(base, token, python)


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


def shown(path: Path) -> str:
    """``path`` relative to the current folder when it is inside it, else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def copy_lines(prepared) -> list[str]:
    """What the reader needs to know about the working copy before the address."""
    where = shown(prepared.copy.notebooks)
    lines = [f"Your working copy of the chapter: {where} (what you run and save stays there; "
             f"the committed notebooks/ are never written; --reset takes a fresh copy)."]
    if prepared.behind:
        names = ", ".join(Path(name).stem for name in prepared.behind)
        lines.append(f"Kept your changes to {names}, though the repository's version changed "
                     f"since the copy was taken: --reset takes fresh copies (and drops your "
                     f"changes).")
    return lines


def run(args) -> int:
    from zerolib.publish import reading  # nbformat is slow to import: only when lab runs

    port = port_from(args.port)
    check_port(port)
    prepared = reading.prepare(Path(args.workdir) if args.workdir else None, reset=args.reset)
    for line in copy_lines(prepared):
        print(line, flush=True)
    with sigterm_as_ctrl_c(), tempfile.TemporaryDirectory(prefix="zerolib-lab-settings-") as folder:
        write_settings(Path(folder))
        return _serve(port, Path(folder), args.browser, prepared.copy,
                      tuple(reading.notary_arguments(prepared.copy)))


def _serve(port: int, settings_dir: Path, browser: bool, copy, extra: tuple[str, ...]) -> int:
    token = secrets.token_hex(24)
    url = lab_url(port, token)
    root_dir = copy.notebooks
    return serve(Server(
        "zerolib lab", "JupyterLab",
        tuple(lab_argv(port, root_dir, settings_dir, is_root(), extra=extra)),
        root_dir, lab_environment(dict(os.environ), token), port, token,
        f"http://{HOST}:{port}/api/status", url,
        f"JupyterLab is serving it at {url}" + (" (as root: --allow-root)" if is_root() else ""),
        log=copy.log, shutdown_url=f"http://{HOST}:{port}/api/shutdown"), browser)
