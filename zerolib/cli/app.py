"""``zerolib app``: the engineer's page (one notebook served by Voilà as a web app with no code
cells), bound to 127.0.0.1, stopped by Ctrl-C.

It starts Voilà on ``zerolib/app/engineer.ipynb`` the way ``zerolib lab`` starts JupyterLab
(:mod:`zerolib.cli._server`): 127.0.0.1 only, one port (``--port``; one that is taken is a
one-line error), an access token unless ``--no-token`` is asked for, no browser unless
``--browser``, and Ctrl-C (or SIGTERM) stops the server and its kernels. Voilà has no root check,
so nothing is added as root. Each page load starts its own kernel, which reads the settings in
the address's query.

The server reclaims what each visitor leaves (:mod:`zerolib.app.server`): a page's kernel is shut
down when the page closes or after ``--idle-timeout`` seconds without activity, and at most
``--max-visitors`` kernels live at once (the next visitor gets a one-line "busy" page). The
chapter's static pages are exported into a temporary folder beside the page (removed on exit),
so that its "explained in notebook NN" links work without ``zerolib lab``.
"""
from __future__ import annotations

import os
import secrets
import sys
import tempfile
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
from zerolib.cli._summaries import SUMMARIES
from zerolib.core.parse import parse_whole

DEFAULT_PORT = 8866      # Voilà's own default
PAGE = Path(__file__).resolve().parents[1] / "app" / "engineer.ipynb"
# A reader who changes nothing for 5 minutes has left, or reloads the page (it says so).
DEFAULT_IDLE_SECONDS = 300
MAX_IDLE_SECONDS = 7 * 86400
# Each kernel holds about 150 MB (the page, pandas, matplotlib): 4 is 0.6 GB at most.
DEFAULT_MAX_VISITORS = 4
MAX_VISITORS = 1024


def register(commands) -> None:
    parser = commands.add_parser(
        "app", help=SUMMARIES["app"],
        description="Start one web page that answers, for a model (a preset or your own "
                    "config.json), a cluster and a run: whether the model state fits under each "
                    "ZeRO stage, the peak per GPU with the working set, the planner's fastest "
                    "configurations with their step time, and the run's wall-clock time and "
                    "GPU-hours. It is served by Voila on 127.0.0.1 with an access token and runs "
                    "until Ctrl-C; the address it prints opens it. Each open page has a kernel "
                    "of its own on the server, shut down when the page closes or after "
                    "--idle-timeout seconds without a change.")
    parser.add_argument("--port", default=str(DEFAULT_PORT), metavar="N",
                        help=f"port on 127.0.0.1 (default {DEFAULT_PORT}); one that is taken is "
                             "an error, not a move to another")
    parser.add_argument("--browser", action="store_true",
                        help="open the address in the default web browser (default: open nothing)")
    parser.add_argument("--no-token", action="store_true",
                        help="serve without an access token: any program or user on this machine "
                             "can then open the page (default: a new token each start)")
    parser.add_argument("--idle-timeout", default=str(DEFAULT_IDLE_SECONDS), metavar="SECONDS",
                        help="shut a page's kernel down after this many seconds without activity, "
                             "its page open or not (default "
                             f"{DEFAULT_IDLE_SECONDS}); a closed page's kernel goes at once")
    parser.add_argument("--max-visitors", default=str(DEFAULT_MAX_VISITORS), metavar="N",
                        help="most pages open at once, each with its kernel of about 150 MB "
                             f"(default {DEFAULT_MAX_VISITORS}); the next visitor gets a one-line "
                             "\"busy, try again\" page")
    parser.set_defaults(func=run)


def cull_interval(idle_seconds: int) -> int:
    """How often the culler looks for idle kernels: a tenth of the idle time, 1 s to 60 s, so a
    kernel goes at most 10% (or a minute) after its time."""
    return max(1, min(60, idle_seconds // 10))


def app_argv(port: int, page: Path = PAGE, with_token: bool = True,
             python: str = sys.executable, idle_seconds: int = DEFAULT_IDLE_SECONDS,
             max_visitors: int = DEFAULT_MAX_VISITORS, chapter_dir: Path | None = None
             ) -> list[str]:
    """The page server's command line (Voilà's, through :mod:`zerolib.app.server`; no secret in
    it: the token travels in the environment, where the server reads JUPYTER_TOKEN when told to
    use one)."""
    argv = [python, "-m", "zerolib.app.server", str(page), "--no-browser", f"--Voila.ip={HOST}",
            f"--port={port}", "--Voila.port_retries=0",
            # Errors only: the address this command prints is the one to use.
            "--Voila.log_level=ERROR",
            "--VoilaConfiguration.multi_kernel_manager_class=zerolib.app.server.VisitorKernels",
            f"--VisitorKernels.max_kernels={max_visitors}",
            f"--MappingKernelManager.cull_idle_timeout={idle_seconds}",
            f"--MappingKernelManager.cull_interval={cull_interval(idle_seconds)}",
            "--MappingKernelManager.cull_connected=True", "--MappingKernelManager.cull_busy=True"]
    if chapter_dir is not None:
        argv.append(f"--PageServer.chapter_dir={chapter_dir}")
    if with_token:
        argv.append("--Voila.auto_token=True")
    return argv


def app_url(port: int, token: str) -> str:
    return f"http://{HOST}:{port}/" + (f"?token={token}" if token else "")


def run(args) -> int:
    port = port_from(args.port)
    idle = parse_whole(args.idle_timeout, "--idle-timeout", maximum=MAX_IDLE_SECONDS,
                       example="a number of seconds like 300")
    visitors = parse_whole(args.max_visitors, "--max-visitors", maximum=MAX_VISITORS,
                           example="a number of visitors like 4")
    check_port(port)
    token = "" if args.no_token else secrets.token_hex(24)
    url = app_url(port, token)
    serving = f"The engineer's page is served at {url}"
    if not token:
        serving += " without a token (anyone on this machine can open it)"
    env = server_environment(dict(os.environ), token)
    with sigterm_as_ctrl_c(), tempfile.TemporaryDirectory(prefix="zerolib-app-") as folder:
        argv = app_argv(port, PAGE, bool(token), idle_seconds=idle, max_visitors=visitors,
                        chapter_dir=Path(folder) / "chapter")
        return serve(Server(
            "zerolib app", "Voila", tuple(argv), PAGE.parent, env, port, token,
            f"http://{HOST}:{port}/voila/templates/lab/static/materialcolors.css", url, serving),
            args.browser)
