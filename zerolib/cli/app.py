"""``zerolib app``: the engineer's page (one notebook served by Voilà as a web app with no code
cells), bound to 127.0.0.1, stopped by Ctrl-C.

It starts Voilà on ``zerolib/app/engineer.ipynb`` the way ``zerolib lab`` starts JupyterLab
(:mod:`zerolib.cli._server`): 127.0.0.1 only, one port (``--port``; one that is taken is a
one-line error), an access token unless ``--no-token`` is asked for, no browser unless
``--browser``, and Ctrl-C (or SIGTERM) stops the server and its kernels. Voilà has no root check,
so nothing is added as root. Each page load starts its own kernel, which reads the settings in
the address's query.
"""
from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from zerolib.cli._server import (
    HOST,
    Server,
    check_port,
    port_from,
    serve,
    server_environment,
    sigterm_as_ctrl_c,
)

DEFAULT_PORT = 8866      # Voilà's own default
PAGE = Path(__file__).resolve().parents[1] / "app" / "engineer.ipynb"


def register(commands) -> None:
    parser = commands.add_parser(
        "app", help="start the engineer's page: will my model train here, and how? (127.0.0.1)",
        description="Start one web page that answers, for a model (a preset or your own "
                    "config.json), a cluster and a run: whether the model state fits under each "
                    "ZeRO stage, the peak per GPU with the working set, the planner's fastest "
                    "configurations with their step time, and the run's wall-clock time and "
                    "GPU-hours. It is served by Voila on 127.0.0.1 with an access token and runs "
                    "until Ctrl-C; the address it prints opens it.")
    parser.add_argument("--port", default=str(DEFAULT_PORT), metavar="N",
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}); one that is taken is "
                             "an error, not a move to another")
    parser.add_argument("--browser", action="store_true",
                        help="open the address in the default web browser (default: open nothing)")
    parser.add_argument("--no-token", action="store_true",
                        help="serve without an access token: any program or user on this machine "
                             "can then open the page (default: a new token each start)")
    parser.set_defaults(func=run)


def app_argv(port: int, page: Path = PAGE, with_token: bool = True,
             python: str = sys.executable) -> list[str]:
    """Voilà's command line (no secret in it: the token travels in the environment, where the
    server reads JUPYTER_TOKEN when told to use one)."""
    argv = [python, "-m", "voila", str(page), "--no-browser", f"--Voila.ip={HOST}",
            f"--port={port}", "--Voila.port_retries=0",
            # Only warnings and errors: the address this command prints is the one to use.
            "--Voila.log_level=WARN"]
    if with_token:
        argv.append("--Voila.auto_token=True")
    return argv


def app_url(port: int, token: str) -> str:
    return f"http://{HOST}:{port}/" + (f"?token={token}" if token else "")


def run(args) -> int:
    port = port_from(args.port)
    check_port(port)
    token = "" if args.no_token else secrets.token_hex(24)
    url = app_url(port, token)
    serving = f"The engineer's page is served at {url}"
    if not token:
        serving += " without a token (anyone on this machine can open it)"
    with sigterm_as_ctrl_c():
        return serve(Server(
            "zerolib app", "Voila", tuple(app_argv(port, PAGE, bool(token))), PAGE.parent,
            server_environment(dict(os.environ), token), port, token,
            f"http://{HOST}:{port}/voila/templates/lab/static/materialcolors.css", url, serving), args.browser)
