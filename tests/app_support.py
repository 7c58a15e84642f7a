"""``zerolib app`` started as a newcomer starts it (the installed command, a free port, Jupyter
folders of its own), and what it holds, read from /proc: its kernels and the resident memory of
the server and everything below it. Shared by the plain-GET tests (tests/app) and the browser
tests (tests/browser/test_app_page.py)."""
from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

START_SECONDS = 45        # Voila's first answer on a loaded 2-core machine: a few seconds
CHAPTER_SECONDS = 120     # zerolib html's export beside the page, started with the server
# A kernel holds ~150 MB (measured: 146-160 MB); the server may keep a little of what its first
# pages loaded (templates, nbconvert), so "back to the baseline" allows less than half a kernel.
RSS_SLACK = 60 * 10**6


@dataclass
class App:
    process: subprocess.Popen
    port: int
    url: str            # the address printed, with the token
    token: str
    start_seconds: float

    def address(self, path: str = "", query: str = "") -> str:
        sep = "&" if query else ""
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}{sep}{query}"


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def app_environment(tmp_path: Path) -> dict:
    home = tmp_path / "jupyter"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               IPYTHONDIR=str(home / "ipython"), PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path))
    env.pop("JUPYTER_PATH", None)
    return env


@contextlib.contextmanager
def zerolib_app(tmp_path: Path, *flags: str):
    """``zerolib app --port N FLAGS``, once it has printed its address; stopped however the test
    ends (Ctrl-C, then SIGKILL to whatever is left below it)."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "zerolib"), "app", "--port", str(port), *flags]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=app_environment(tmp_path), start_new_session=True)
    try:
        ready, _, _ = select.select([process.stdout], [], [], START_SECONDS)
        assert ready, f"zerolib app printed nothing within {START_SECONDS} s ({process.poll()})"
        line = process.stdout.readline()
        match = re.search(rf"at (http://127\.0\.0\.1:{port}/\?token=(\w+));", line)
        assert match, f"no address in {line!r}"
        yield App(process, port, match[1], match[2], time.monotonic() - started)
    finally:
        stop_everything(process)


def stop_everything(process: subprocess.Popen) -> None:
    below = descendants(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    for pid in below:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> set[int]:
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


def alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kernels_and_rss(app: App) -> tuple[int, int]:
    """(kernels running below the server, resident bytes of the server and all below it). A
    kernel is an ipykernel process whose parent is not one: a kernel's own short-lived child
    (forked to run ``fc-list``, say) carries its command line until it execs."""
    kernels, rss = 0, 0
    for pid in {app.process.pid, *descendants(app.process.pid)}:
        try:
            status = (Path("/proc") / str(pid) / "status").read_text()
        except OSError:
            continue
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        rss += int(found[1]) * 1024 if found else 0
        parent = re.search(r"PPid:\s+(\d+)", status)
        kernels += _is_kernel(pid) and not (parent and _is_kernel(int(parent[1])))
    return kernels, rss


def _is_kernel(pid: int) -> bool:
    return b"ipykernel_launcher" in _command(pid)


def get(url: str, timeout: float = 180) -> tuple[int, str]:
    """(status, body) of a plain GET, the connection closed after it."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
        return 0, f"no answer: {error}"     # a status no server sends, said in the assertion


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def wait_until(condition, seconds: float, every: float = 0.25):
    """The first true value of ``condition()`` within ``seconds``, else the last value."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def settled_baseline(app: App) -> tuple[int, int]:
    """(kernels, RSS) once the chapter's pages are exported (their exporting process gone): the
    server as a visitor first finds it."""
    assert wait_until(lambda: get(app.address("chapter/index.html"))[0] == 200, CHAPTER_SECONDS)
    assert wait_until(lambda: not any(b"zerolib html" in _command(pid)
                                      for pid in descendants(app.process.pid)), 30)
    return kernels_and_rss(app)


def _command(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""
