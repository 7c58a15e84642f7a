"""``zerolib app``: the Voila command line it builds, its one-line errors, and one real start on a
free port that serves the page only with the token and stops on Ctrl-C."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
from cli_support import run

from zerolib.cli import app
from zerolib.cli._server import STOP_SECONDS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_argv_serves_the_page_on_localhost_one_port_with_the_token_from_the_environment():
    argv = app.app_argv(9123, python="/env/bin/python")
    # Voila's own command line, through the launcher that adds the hook and the quiet logs.
    assert argv[:4] == ["/env/bin/python", "-m", "zerolib.app.server", str(app.PAGE)]
    assert "--Voila.ip=127.0.0.1" in argv and "--port=9123" in argv
    assert "--Voila.port_retries=0" in argv       # a taken port is an error, not another port
    assert "--no-browser" in argv
    assert "--Voila.auto_token=True" in argv      # the server reads JUPYTER_TOKEN
    assert not any(part.startswith("--token") or part.startswith("--Voila.token") for part in argv)


def test_argv_reclaims_each_visitors_kernel_with_jupyter_servers_culler_and_bounds_them():
    argv = app.app_argv(9123, idle_seconds=300, max_visitors=4)
    for setting in ("--MappingKernelManager.cull_idle_timeout=300",
                    "--MappingKernelManager.cull_interval=30",   # a tenth of the idle time
                    "--MappingKernelManager.cull_connected=True",  # an open tab nobody uses
                    "--MappingKernelManager.cull_busy=True",       # a kernel stuck busy
                    "--VisitorKernels.max_kernels=4",
                    "--VoilaConfiguration.multi_kernel_manager_class="
                    "zerolib.app.server.VisitorKernels",
                    "--Voila.log_level=ERROR"):
        assert setting in argv, setting
    assert [app.cull_interval(s) for s in (1, 6, 25, 300, 3600)] == [1, 1, 2, 30, 60]


@pytest.mark.parametrize("flag, value, says", [
    ("--idle-timeout", "0", "--idle-timeout must be a positive whole number"),
    ("--idle-timeout", "-5", "--idle-timeout must be a positive whole number"),
    ("--idle-timeout", "five", "--idle-timeout must be a number of seconds like 300"),
    ("--idle-timeout", "1e9", "--idle-timeout must be at most 604,800"),
    ("--max-visitors", "0", "--max-visitors must be a positive whole number"),
    ("--max-visitors", "many", "--max-visitors must be a number of visitors like 4"),
    ("--max-visitors", "100000", "--max-visitors must be at most 1,024"),
])
def test_bad_limits_are_one_line_and_exit_2(capsys, flag, value, says):
    status, out, err = run(capsys, "app", flag, value)
    assert status == 2 and out == "" and err.count("\n") == 1 and says in err, err


def test_argv_without_a_token_asks_for_none():
    assert "--Voila.auto_token=True" not in app.app_argv(9123, with_token=False)


def test_url_carries_the_token_only_when_there_is_one():
    assert app.app_url(8866, "abc") == "http://127.0.0.1:8866/?token=abc"
    assert app.app_url(8866, "") == "http://127.0.0.1:8866/"


def test_the_page_is_shipped_with_the_package_and_builds_the_page_in_one_cell():
    notebook = nbformat.read(app.PAGE, as_version=4)
    (cell,) = notebook.cells
    assert "EngineerPage.from_environment(os.environ).widget" in cell.source
    assert cell.outputs == [] and notebook.metadata.kernelspec.name == "python3"


def test_a_taken_port_is_one_line_and_exit_2(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        status, out, err = run(capsys, "app", "--port", str(port))
    assert status == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"zerolib app: error: --port {port} is taken on 127.0.0.1")


@pytest.mark.parametrize("port, says", [("0", "--port must be a positive whole number"),
                                        ("99999", "--port must be at most 65,535"),
                                        ("voila", "--port must be a port number like 8888")])
def test_bad_port_is_one_line_and_exit_2(capsys, port, says):
    status, out, err = run(capsys, "app", "--port", port)
    assert status == 2 and out == "" and err.count("\n") == 1 and says in err


def _status(url: str) -> int:
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(url, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@pytest.mark.slow
def test_starts_serves_the_page_with_the_token_only_and_stops_on_ctrl_c(tmp_path):
    port = _free_port()
    home = tmp_path / "jupyter"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), TMPDIR=str(tmp_path))
    script = Path(sys.executable).parent / "zerolib"
    started = time.monotonic()
    process = subprocess.Popen([str(script), "app", "--port", str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        line = process.stdout.readline()      # printed once the server answers
        match = re.search(rf"at (http://127\.0\.0\.1:{port}/\?token=(\w+)); Ctrl-C stops it", line)
        assert match, f"no address in {line!r} (exit status {process.poll()})"
        assert time.monotonic() - started < 60
        assert _status(f"http://127.0.0.1:{port}/") in (302, 403)   # no token: the login page
        with urllib.request.urlopen(match[1] + "&gpus=16", timeout=120) as response:
            assert response.status == 200
            body = response.read().decode()
        assert "EngineerPage" not in body                # Voila shows no code
        process.send_signal(signal.SIGINT)
        # The stop's own bound: the shutdown request (5 s), then SIGTERM and SIGKILL after
        # STOP_SECONDS each; on a loaded machine it takes its time, and must still end cleanly.
        assert process.wait(timeout=4 * STOP_SECONDS) == 0
        # Only what a user needs: the address and how to stop (above), then this line; no
        # warnings about trust, plain TCP, websocket pings or deprecations, no request lines.
        assert process.stderr.read() == "zerolib app: stopping Voila\n"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        if process.poll() is None:    # a failed check: stop it as Ctrl-C does (Voila with it)
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def test_every_flag_is_documented_in_docs_app_md_and_the_readme_points_there(capsys):
    from conftest import REPO
    status, out, _ = run(capsys, "app", "--help")
    assert status == 0
    flags = sorted(set(re.findall(r"(--[a-z][a-z-]+)", out)) - {"--help"})
    assert {"--idle-timeout", "--max-visitors", "--no-token", "--port", "--browser"} <= set(flags)
    docs = (REPO / "docs" / "app.md").read_text(encoding="utf-8")
    assert [flag for flag in flags if f"`{flag}" not in docs] == []
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/app.md" in readme and "--idle-timeout" in docs and "--max-visitors" in docs
    assert f"`--idle-timeout SECONDS` | {app.DEFAULT_IDLE_SECONDS} |" in docs
    assert f"`--max-visitors N` | {app.DEFAULT_MAX_VISITORS} |" in docs
