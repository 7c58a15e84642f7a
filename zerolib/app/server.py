"""The server of the engineer's page: Voilà, configured so that it reclaims what each visitor
leaves and prints only what a user needs. ``zerolib app`` runs ``python -m zerolib.app.server``
with Voilà's own command line (:func:`zerolib.cli.app.app_argv`); nothing here runs on import.

What Voilà and jupyter_server already do, configured on that command line:

- a page that closes asks for its kernel's shutdown (Voilà's ``beforeunload`` beacon to
  ``/voila/api/shutdown/<kernel>``); :func:`admit_visitor` gives each page the ``_xsrf`` cookie
  that request must carry, without which Voilà 0.5 refuses it (403) and the kernel stays;
- an idle kernel is shut down by jupyter_server's culler (``MappingKernelManager.cull_idle_timeout``,
  ``cull_interval``; ``cull_connected`` and ``cull_busy`` so that an open tab nobody uses, a page
  fetched without a browser or a kernel stuck busy is reclaimed too);
- kernels talk to the server over CurveZMQ-encrypted sockets (``KernelManager.
  transport_encryption=auto``, set by :func:`server_config` where pyzmq has Curve), so no
  kernel warns about plain TCP.

What this module adds:

- :class:`VisitorKernels`: at most ``max_kernels`` kernels live or starting; jupyter_server has
  no such limit;
- :func:`admit_visitor` (Voilà's ``prelaunch_hook``): a visitor beyond the limit gets
  :data:`BUSY_PAGE` (503, ``Retry-After``) and no kernel;
- :class:`ChapterHandler`: the chapter as static pages (``zerolib html``'s, exported into
  ``PageServer.chapter_dir`` while the server starts) at ``/chapter/``, where the page's
  "explained in notebook NN" links point, so they work without ``zerolib lab``;
- quiet logs: errors only, no line per request (a request's address carries the token).
"""
from __future__ import annotations

import html
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import zmq
from jupyter_server.base.handlers import AuthenticatedFileHandler
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from jupyter_server.utils import url_path_join
from tornado import web
from traitlets import Integer, Unicode
from traitlets.config import Config
from voila.app import Voila

from zerolib.app.settings import IDLE_VARIABLE

RETRY_SECONDS = 30
BUSY_PAGE = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Busy</title></head>"
             "<body><p>The page is busy: {visitors} visitor{s} already {have} it open, as many as "
             "this server serves at once. Try again in a minute.</p></body></html>")
PREPARING_PAGE = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                  "<meta http-equiv='refresh' content='3'><title>Preparing the chapter</title>"
                  "</head><body><p>The chapter's pages are being prepared (a few seconds after the "
                  "server starts); this page reloads itself.</p></body></html>")
FAILED_PAGE = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>No chapter</title>"
               "</head><body><p>The chapter's pages could not be exported ({why}); read the "
               "chapter with <code>zerolib lab</code> instead.</p></body></html>")
CHAPTER_INDEX = "index.html"      # written last by zerolib html (all pages at once)
# Uploads travel to the kernel in one websocket message: above this size the connection drops
# without a word, below it the page refuses a file beyond a config.json's size in one line.
MAX_MESSAGE_BYTES = 64 * 2**20
# jupyter_server pings each websocket every 30 s (ms here) and tornado refuses a longer timeout.
PING_MS = 30_000


class VisitorKernels(AsyncMappingKernelManager):
    """jupyter_server's kernel manager with at most ``max_kernels`` kernels live or starting (a
    kernel is registered only once it is up, so the ones starting are counted apart)."""

    max_kernels = Integer(4, config=True, help="Most kernels live or starting at once.")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.starting = 0

    def full(self) -> bool:
        return len(self.list_kernel_ids()) + self.starting >= self.max_kernels

    async def start_kernel(self, **kwargs):
        if self.full():   # admit_visitor refuses first; this holds the limit for any caller
            raise web.HTTPError(503, "busy")
        self.starting += 1
        try:
            return await super().start_kernel(**kwargs)
        finally:
            self.starting -= 1


def admit_visitor(handler, notebook, cwd):
    """Voilà's prelaunch hook, called before each page's kernel is started (and with no pause
    between this check and the kernel's registration, so two visitors cannot both take the last
    place): a visitor beyond the limit gets :data:`BUSY_PAGE` and no kernel; one admitted gets
    the ``_xsrf`` cookie that Voilà's page-close beacon must send back."""
    kernels = handler.kernel_manager
    if isinstance(kernels, VisitorKernels) and kernels.full():
        live = kernels.max_kernels
        handler.clear()
        handler.set_status(503)
        handler.set_header("Retry-After", str(RETRY_SECONDS))
        handler.set_header("Content-Type", "text/html; charset=utf-8")
        handler.set_header("Cache-Control", "no-store")
        raise web.Finish(BUSY_PAGE.format(visitors=live, s="s" if live != 1 else "",
                                          have="have" if live != 1 else "has"))
    handler.xsrf_token   # noqa: B018  (reading it sets the cookie on this response)
    return None


def quiet_request_log(handler) -> None:
    """No line per request (its address holds the token); a server error, but for the busy
    page, as one line without the query."""
    status = handler.get_status()
    if status >= 500 and status != 503:
        handler.log.error("%d %s %s", status, handler.request.method, handler.request.path)


class ChapterHandler(AuthenticatedFileHandler):
    """The chapter's static pages from ``PageServer.chapter_dir``: a page that reloads itself
    while they are being exported, a one-line page if the export failed."""

    def initialize(self, path: str, exporting=None):
        super().initialize(path)
        self.exporting = exporting

    @web.authenticated
    def get(self, path: str, **kwargs):
        if not (Path(self.root) / CHAPTER_INDEX).is_file():
            process = self.exporting
            failed = process is None or process.poll() not in (None, 0)
            self.set_status(500 if failed else 503)
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            why = ("zerolib html exited with status "
                   f"{process.returncode}" if process is not None else "no chapter folder")
            self.finish(FAILED_PAGE.format(why=html.escape(why)) if failed else PREPARING_PAGE)
            return None
        return super().get(path, **kwargs)


class PageServer(Voila):
    """Voilà with :class:`ChapterHandler` at ``/chapter/`` and the chapter exported into
    ``chapter_dir`` (by ``zerolib html``, in a process of its own) while the server starts."""

    chapter_dir = Unicode("", config=True, help="Folder the chapter's static pages go into.")

    def initialize(self, argv=None):
        super().initialize(argv)
        # The page says after how long it stops answering (Voila hands the server's environment
        # to each kernel): the culler's own setting, not a second copy of it.
        idle = self.config.MappingKernelManager.get("cull_idle_timeout", 0)
        if idle:
            os.environ[IDLE_VARIABLE] = str(idle)

    def init_handlers(self):
        handlers = super().init_handlers()
        if self.chapter_dir:
            self.exporting = subprocess.Popen(
                [sys.executable, "-m", "zerolib", "html", "--out", self.chapter_dir],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            handlers.insert(0, (url_path_join(self.server_url, r"/chapter/(.*)"), ChapterHandler,
                                {"path": self.chapter_dir, "exporting": self.exporting}))
        return handlers

    def stop(self):
        exporting = getattr(self, "exporting", None)
        if exporting is not None and exporting.poll() is None:
            exporting.kill()
            exporting.wait()
        super().stop()


def server_config(curve: bool | None = None) -> Config:
    """What cannot travel on a command line (the hook, the request log, websocket settings) and
    what depends on this machine: encrypted kernel sockets where pyzmq has Curve (``curve``;
    None: ask pyzmq; jupyter_client refuses the setting without it)."""
    config = Config({
        "VoilaConfiguration": {"prelaunch_hook": admit_visitor},
        "Voila": {"tornado_settings": {"log_function": quiet_request_log,
                                       "ws_ping_interval": PING_MS, "ws_ping_timeout": PING_MS,
                                       "websocket_max_message_size": MAX_MESSAGE_BYTES}},
    })
    if zmq.has("curve") if curve is None else curve:
        config.KernelManager.transport_encryption = "auto"
    return config


def main(argv=None) -> None:
    # Deprecation notices of the server's libraries are for their developers, not this page's
    # users (the kernels, separate processes, keep theirs). Tornado's warnings about refused
    # requests quote the address, token included; its errors still show.
    warnings.simplefilter("ignore", DeprecationWarning)
    logging.getLogger("tornado.general").setLevel(logging.ERROR)
    PageServer.launch_instance(argv, config=server_config())


if __name__ == "__main__":
    # Through the package, not as __main__: Voila imports zerolib.app.server.VisitorKernels by
    # name, and admit_visitor must see that very class.
    from zerolib.app.server import main as package_main
    package_main(sys.argv[1:])
