"""``zerolib lab``: the command line and environment it builds for JupyterLab, the settings it
ships, one-line errors, and one real start on a free port that answers and stops on Ctrl-C."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cli_support import run

from zerolib.cli import lab
from zerolib.paths import NOTEBOOK_DIR

NEWS = "@jupyterlab/apputils-extension:notification"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_argv_binds_localhost_one_port_the_notebooks_and_the_settings(tmp_path):
    argv = lab.lab_argv(9123, NOTEBOOK_DIR, tmp_path, as_root=False, python="/env/bin/python")
    assert argv[:3] == ["/env/bin/python", "-m", "jupyterlab"]
    assert "--ip=127.0.0.1" in argv and "--port=9123" in argv
    assert "--port-retries=0" in argv          # a taken port is an error, not another port
    assert "--no-browser" in argv
    assert f"--ServerApp.root_dir={NOTEBOOK_DIR}" in argv
    assert f"--LabApp.app_settings_dir={tmp_path}" in argv
    assert "--allow-root" not in argv
    assert not any("token" in part.lower() for part in argv)   # ps would show it to everyone
    for quiet in lab.QUIET:      # warnings and errors only, none a reader cannot act on
        assert quiet in argv
    assert lab.ENCRYPTED in lab.lab_argv(9123, NOTEBOOK_DIR, tmp_path, as_root=False, encrypted=True)
    assert lab.ENCRYPTED not in lab.lab_argv(9123, NOTEBOOK_DIR, tmp_path, as_root=False,
                                             encrypted=False)


def test_argv_as_root_allows_root(tmp_path):
    assert "--allow-root" in lab.lab_argv(8888, NOTEBOOK_DIR, tmp_path, as_root=True)


def test_environment_carries_the_token_and_puts_this_python_first():
    base = {"PATH": "/usr/bin:/bin", "JUPYTER_CONFIG_DIR": "/home/reader/.jupyter", "HOME": "/home/reader"}
    env = lab.lab_environment(base, "abc123", python="/repo/.venv/bin/python")
    assert env["JUPYTER_TOKEN"] == "abc123"
    assert env["PATH"] == os.pathsep.join(["/repo/.venv/bin", "/usr/bin:/bin"])
    # The reader's own Jupyter folders are left as they are.
    assert env["JUPYTER_CONFIG_DIR"] == "/home/reader/.jupyter" and env["HOME"] == "/home/reader"
    assert base == {"PATH": "/usr/bin:/bin", "JUPYTER_CONFIG_DIR": "/home/reader/.jupyter",
                    "HOME": "/home/reader"}


def test_url_opens_the_index_with_the_token():
    assert lab.lab_url(8888, "abc") == "http://127.0.0.1:8888/lab/tree/00-index.ipynb?token=abc"


def test_settings_turn_the_news_off_and_keep_the_environments_own(tmp_path):
    own = tmp_path / "environment"
    own.mkdir()
    (own / "overrides.json").write_text(json.dumps({
        NEWS: {"fetchNews": "true", "doNotDisturbMode": True},
        "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}}))
    (own / "page_config.json").write_text('{"disabledExtensions": {}}')
    ours = tmp_path / "ours"
    ours.mkdir()
    written = json.loads(lab.write_settings(ours, own).read_text())
    # JupyterLab's schema: fetchNews is the string "true", "false" or "none" (ask), "none" by default.
    assert written[NEWS] == {"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True}
    assert written["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}
    assert (ours / "page_config.json").read_text() == '{"disabledExtensions": {}}'
    assert json.loads((own / "overrides.json").read_text())[NEWS]["fetchNews"] == "true"  # untouched


def test_settings_without_environment_settings(tmp_path):
    written = json.loads(lab.write_settings(tmp_path, tmp_path / "none").read_text())
    assert written == {NEWS: {"fetchNews": "false", "checkForUpdates": False}}


def test_a_taken_port_is_one_line_and_exit_2(capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        status, out, err = run(capsys, "lab", "--port", str(port))
    assert status == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"zerolib lab: error: --port {port} is taken on 127.0.0.1")
    assert "pick another with --port N" in err


@pytest.mark.parametrize("port, says", [("0", "--port must be a positive whole number"),
                                        ("70000", "--port must be at most 65,535"),
                                        ("http", "--port must be a port number like 8888")])
def test_bad_port_is_one_line_and_exit_2(capsys, port, says):
    status, out, err = run(capsys, "lab", "--port", port)
    assert status == 2 and out == "" and err.count("\n") == 1 and says in err


def _get(url: str, token: str):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


@pytest.mark.slow
def test_starts_answers_with_the_news_off_and_stops_on_ctrl_c(tmp_path):
    port = _free_port()
    home = tmp_path / "jupyter"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), TMPDIR=str(tmp_path))
    script = Path(sys.executable).parent / "zerolib"
    process = subprocess.Popen([str(script), "lab", "--port", str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        line = process.stdout.readline()      # printed once the server answers
        match = re.search(rf"at (http://127\.0\.0\.1:{port}/lab/tree/00-index\.ipynb\?token=(\w+))",
                          line)
        assert match, f"no address in {line!r} (exit status {process.poll()})"
        token = match[2]
        assert ("(as root: --allow-root)" in line) == (os.geteuid() == 0)
        status, body = _get(f"http://127.0.0.1:{port}/api/status", token)
        assert status == 200 and "started" in body
        # The news question is off by default, and nothing was written to the reader's settings.
        _, settings = _get(f"http://127.0.0.1:{port}/lab/api/settings/{NEWS}", token)
        assert settings["schema"]["properties"]["fetchNews"]["default"] == "false"
        assert settings["raw"] in ("", "{}")
        assert not (home / "config" / "lab" / "user-settings").exists()
        (settings_dir,) = tmp_path.glob("zerolib-lab-settings-*")
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
        # Only what a reader needs: the address (above) and this line; no notices of
        # deprecations, extensions or signals.
        assert process.stderr.read() == "zerolib lab: stopping JupyterLab\n"
        assert not settings_dir.exists()
        # The server is gone: nothing listens on the port (it may sit in TIME_WAIT a while).
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
