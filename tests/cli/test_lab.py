"""``zerolib lab``: the command line and environment it builds for JupyterLab, the settings it
ships, one-line errors, and one real start on a free port, on a working copy, that answers,
prints only what a reader needs and stops on Ctrl-C."""
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


def test_argv_points_the_server_at_the_working_copys_signatures(tmp_path):
    from zerolib.publish.reading import WorkingCopy, notary_arguments

    copy = WorkingCopy(tmp_path / "lab")
    argv = lab.lab_argv(8888, copy.notebooks, tmp_path, as_root=False,
                        extra=tuple(notary_arguments(copy)))
    assert f"--ServerApp.root_dir={copy.notebooks}" in argv
    assert f"--NotebookNotary.db_file={copy.state / 'signatures.db'}" in argv
    assert f"--NotebookNotary.secret_file={copy.state / 'signing-key'}" in argv


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
def test_starts_on_a_working_copy_says_only_where_and_how_to_stop(tmp_path):
    port = _free_port()
    home = tmp_path / "jupyter"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), TMPDIR=str(tmp_path))
    committed = {p.name: p.read_bytes() for p in NOTEBOOK_DIR.glob("*.ipynb")}
    workdir = tmp_path / "lab"
    script = Path(sys.executable).parent / "zerolib"
    process = subprocess.Popen([str(script), "lab", "--port", str(port), "--workdir", str(workdir)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        first = process.stdout.readline()
        assert first.startswith(f"Your working copy of the chapter: {workdir / 'notebooks'} ("), first
        assert "the committed notebooks/ are never written" in first and "--reset" in first
        line = process.stdout.readline()      # printed once the server answers
        match = re.search(rf"at (http://127\.0\.0\.1:{port}/lab/tree/00-index\.ipynb\?token=(\w+))",
                          line)
        assert match, f"no address in {line!r} (exit status {process.poll()})"
        assert line.rstrip().endswith("Ctrl-C stops it.")
        token = match[2]
        assert ("(as root: --allow-root)" in line) == (os.geteuid() == 0)
        status, body = _get(f"http://127.0.0.1:{port}/api/status", token)
        assert status == 200 and "started" in body
        # The server serves the copy, trusted: opening a notebook logs no "not trusted".
        status, model = _get(f"http://127.0.0.1:{port}/api/contents/02-memory-vs-gpu-count.ipynb", token)
        assert status == 200 and all(cell["metadata"]["trusted"] is True
                                     for cell in model["content"]["cells"] if cell["cell_type"] == "code")
        # The news question is off by default, and nothing was written to the reader's settings.
        _, settings = _get(f"http://127.0.0.1:{port}/lab/api/settings/{NEWS}", token)
        assert settings["schema"]["properties"]["fetchNews"]["default"] == "false"
        assert settings["raw"] in ("", "{}")
        assert not (home / "config" / "lab" / "user-settings").exists()
        assert not (home / "data" / "nbsignatures.db").exists()   # trust lives in the copy
        (settings_dir,) = tmp_path.glob("zerolib-lab-settings-*")
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
        rest, errors = process.stdout.read(), process.stderr.read()
        assert rest == "" and errors == "zerolib lab: stopping JupyterLab\n", (rest, errors)
        assert not settings_dir.exists()
        assert (workdir / "state" / "jupyterlab.log").is_file()     # the server's messages
        # and none of them a notice a reader cannot act on: stopped through /api/shutdown, no
        # deprecated setting read, no extension news.
        log = (workdir / "state" / "jupyterlab.log").read_text()
        assert "received signal" not in log and "DeprecationWarning" not in log, log
        assert "[I " not in log, log
        # The server is gone: nothing listens on the port (it may sit in TIME_WAIT a while).
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert {p.name: p.read_bytes() for p in NOTEBOOK_DIR.glob("*.ipynb")} == committed
    assert sorted(p.name for p in (workdir / "notebooks").glob("*.ipynb")) == sorted(committed)


def test_the_copy_lines_name_the_copy_and_what_changed_under_the_readers(tmp_path):
    from zerolib.publish.reading import Prepared, WorkingCopy

    copy = WorkingCopy(tmp_path / "lab")
    lines = lab.copy_lines(Prepared(copy, (), ("02-memory-vs-gpu-count.ipynb",),
                                    ("02-memory-vs-gpu-count.ipynb",)))
    assert lines[0].startswith(f"Your working copy of the chapter: {copy.notebooks} (")
    assert lines[1].startswith("Kept your changes to 02-memory-vs-gpu-count, though the "
                               "repository's version changed") and "--reset" in lines[1]
    assert len(lab.copy_lines(Prepared(copy, ("00-index.ipynb",), (), ()))) == 1


def test_the_reading_docs_show_what_zerolib_lab_prints(monkeypatch):
    """docs/reading.md's example is the line `zerolib lab` prints from the repository root."""
    from zerolib.paths import REPO_ROOT
    from zerolib.publish.reading import Prepared, WorkingCopy, default_folder

    monkeypatch.chdir(REPO_ROOT)
    (line,) = lab.copy_lines(Prepared(WorkingCopy(default_folder()), (), (), ()))
    docs = (REPO_ROOT / "docs" / "reading.md").read_text(encoding="utf-8")
    assert f"$ .venv/bin/zerolib lab\n{line}\nJupyterLab is serving it at http://127.0.0.1:8888/" in docs
