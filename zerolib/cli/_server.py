"""Starting a local Jupyter server for a command (``zerolib lab``, ``zerolib app``) and stopping it.

One way for both: bound to 127.0.0.1, one port (``--port``; one that is taken is a one-line
error, not a move to the next), the token in the server's environment (never on its command
line, where ``ps`` shows it), the server in its own session so Ctrl-C (or SIGTERM) reaches the
command only, which then stops the server: through its own shutdown request where it has one
(JupyterLab's ``/api/shutdown``, which stops it without a line of its own), then its process
group (SIGTERM, SIGKILL if it lingers).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import webbrowser
from dataclasses import dataclass
from pathlib import Path

from zerolib.core.parse import parse_whole

HOST = "127.0.0.1"
START_SECONDS = 120      # a cold start on a loaded 2-core machine takes a few seconds
STOP_SECONDS = 20


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def check_port(port: int) -> None:
    """ValueError when ``port`` on 127.0.0.1 is taken (the server's own message would be a page
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


def server_environment(base: dict[str, str], token: str, python: str = sys.executable) -> dict[str, str]:
    """``base`` with the server's token (empty: none) and this interpreter's folder first on PATH
    (the kernel then runs where zerolib is installed, whatever else PATH holds)."""
    env = dict(base)
    env["JUPYTER_TOKEN"] = token
    env["PATH"] = os.pathsep.join([str(Path(python).parent), *filter(None, [base.get("PATH")])])
    return env


def answers(url: str, token: str) -> bool:
    """Whether the server answers ``url`` (with the token, if any) with 200."""
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def ask_to_stop(url: str, token: str) -> None:
    """POST the server's shutdown request (with the token, if any); no answer is no matter."""
    headers = {"Authorization": f"token {token}"} if token else {}
    request = urllib.request.Request(url, data=b"", method="POST", headers=headers)
    with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
        with urllib.request.urlopen(request, timeout=5):
            pass


def stop(process: subprocess.Popen, shutdown_url: str = "", token: str = "") -> None:
    """Ask the server to stop (``shutdown_url``), then SIGTERM its process group (its kernels
    with it) if it is still there, then SIGKILL if it lingers."""
    if shutdown_url and process.poll() is None:
        ask_to_stop(shutdown_url, token)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_SECONDS)
    for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """`kill` stops the server as Ctrl-C does, rather than leaving it running without us."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class Server:
    """What to start and how to tell it is up: ``command`` (``zerolib lab``) and ``name``
    (JupyterLab) for the messages, the command line, its folder and environment, the address
    polled until it answers (``ready_url``) and the one printed (``url``), the line printed
    once it answers (``serving``; "; Ctrl-C stops it." is added), and the address that asks it
    to stop (``shutdown_url``; "": signals only). With a ``log``, the server's messages go to
    that file (overwritten each start), not to the terminal."""

    command: str
    name: str
    argv: tuple[str, ...]
    cwd: Path
    env: dict
    port: int
    token: str
    ready_url: str
    url: str
    serving: str
    log: Path | None = None
    shutdown_url: str = ""


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def serve(server: Server, browser: bool) -> int:
    """Start ``server``, print its address once it answers, run until it exits or Ctrl-C, then
    stop it; 0 on Ctrl-C or a clean exit, 1 when it fails to start or exits with an error."""
    output = None
    if server.log is not None:
        server.log.parent.mkdir(parents=True, exist_ok=True)
        output = open(server.log, "wb")   # the server keeps its own descriptor; ours is closed below
    try:
        process = subprocess.Popen(list(server.argv), cwd=server.cwd, env=server.env,
                                   stdout=output, stderr=subprocess.STDOUT if output else None,
                                   start_new_session=True)   # Ctrl-C comes to us; we stop the server
    finally:
        if output is not None:
            output.close()
    try:
        deadline = time.monotonic() + START_SECONDS
        while not answers(server.ready_url, server.token):
            if process.poll() is not None:
                where = "above" if server.log is None else f"in {server.log}; the last ones below"
                print(f"{server.command}: error: {server.name} exited with status "
                      f"{process.returncode} before answering on {HOST}:{server.port} (its "
                      f"messages are {where})", file=sys.stderr)
                if server.log is not None:
                    print(_log_tail(server.log), file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"{server.command}: error: {server.name} did not answer on "
                      f"{HOST}:{server.port} within {START_SECONDS} s", file=sys.stderr)
                return 1
            time.sleep(0.25)
        print(server.serving + "; Ctrl-C stops it.", flush=True)
        if browser:
            webbrowser.open(server.url)
        return 0 if process.wait() == 0 else 1
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the stop short
        print(f"{server.command}: stopping {server.name}", file=sys.stderr, flush=True)
        return 0
    finally:
        stop(process, server.shutdown_url, server.token)
