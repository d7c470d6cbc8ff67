"""The live view's process: a Bokeh server fed by tailing the run's events file.

``python -m datavine.dashboard.server --events FILE --address A --port P --ready FILE``
(started by :class:`datavine.dashboard.launch.Dashboard`, in a session of its own) reads the
records the run appends (:class:`~datavine.dashboard.events.Tail`, every
:data:`POLL_MS`), folds them into one board (:mod:`datavine.dashboard.model`) and serves the
page (:mod:`datavine.dashboard.views`): each browser session gets its own document,
brought up to the board every ``--refresh`` seconds (:data:`REFRESH_S`: each update costs
the browser a re-render, measured in benchmarks/README.md). While a page is open, the memory
and CPU of the local workers, the manager and this host are read here
(:mod:`datavine.dashboard.procs`).

It also serves the run's Prometheus metrics at ``/metrics``
(:mod:`datavine.dashboard.metrics`: the same board, brought up to the events file at each
scrape, and the manager process's CPU time read here).

It listens on ``--address`` (127.0.0.1 by default). With an access token (the environment
variable :data:`TOKEN_ENV`, never the command line, which other users can read) every path
of the page is under ``/<token>/``: a request without it finds nothing; ``/metrics`` answers
only a request with ``Authorization: Bearer <token>`` (what a Prometheus scrape sends), else
401. Nothing on the page acts on the run. Once listening it writes
``{"port": ..., "pid": ...}`` to ``--ready``; it exits when its parent (``--parent``) is
gone, or on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from datavine.dashboard.events import Tail
from datavine.dashboard.model import Board

if TYPE_CHECKING:
    import psutil
    from bokeh.document import Document
    from bokeh.server.server import BaseServer
    from tornado.web import RequestHandler

    from datavine.dashboard.procs import Usage

TOKEN_ENV = "DATAVINE_DASHBOARD_TOKEN"
POLL_MS = 500
REFRESH_S = 2.0  # how often a page is brought up to date (each update costs its browser)
PARENT_MS = 2000


def origins(address: str, port: int, token: str | None) -> list[str]:
    """Pages allowed to open the view's websocket (pure): on loopback, pages of this server
    only; elsewhere any page that knows the token (the address users reach it by may be a
    name, an IP or a tunnel)."""
    if token:
        return ["*"]
    return [f"127.0.0.1:{port}", f"localhost:{port}"]


class Feed:
    """The board, kept up to the events file; the processes' figures while a page is open."""

    def __init__(self, events: Path) -> None:
        self.tail = Tail(events)
        self.board = Board()
        self.usage: Usage | None = None  # made at the first page
        self._manager: psutil.Process | None = None

    def refresh(self) -> None:
        for record in self.tail.read():
            self.board.apply(record)

    def sample(self) -> None:
        """Memory and CPU on this host (at most every ``procs.EVERY_S``)."""
        if self.usage is None:
            from datavine.dashboard.procs import Usage

            self.usage = Usage()
        record = self.usage.record(self.board.pids, self.board.manager_pid)
        if record is not None:
            self.board.apply(record)

    def manager_cpu_s(self) -> float | None:
        """The manager process's CPU seconds (user + system), None when it cannot be read
        (gone, or not on this host)."""
        import psutil

        pid = self.board.manager_pid
        if pid is None:
            return None
        try:
            if self._manager is None or self._manager.pid != pid:
                self._manager = psutil.Process(pid)
            times = self._manager.cpu_times()
        except psutil.Error:
            return None
        return float(times.user + times.system)

    def metrics(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics as of now (the events file read up to its end)."""
        from datavine.dashboard.metrics import exposition

        self.refresh()
        return exposition(self.board, self.manager_cpu_s(), accept)


def metrics_handler() -> type[RequestHandler]:
    """The tornado handler of ``/metrics``: ``initialize(feed=..., token=...)``."""
    from tornado.web import RequestHandler

    from datavine.dashboard.metrics import UNAUTHORIZED, authorized

    class MetricsHandler(RequestHandler):
        def initialize(self, feed: Feed, token: str | None) -> None:
            self.feed, self.token = feed, token

        def get(self) -> None:
            if not authorized(self.token, self.request.headers.get("Authorization")):
                self.set_status(401)
                self.set_header("WWW-Authenticate", 'Bearer realm="datavine"')
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                self.finish(UNAUTHORIZED)
                return
            body, content_type = self.feed.metrics(self.request.headers.get("Accept"))
            self.set_header("Content-Type", content_type)
            self.set_header("Cache-Control", "no-store")
            self.finish(body)

    return MetricsHandler


def application(feed: Feed, title: str,
                refresh_s: float = REFRESH_S) -> Callable[[Document], None]:
    """The Bokeh app: one document per browser session, updated from ``feed``."""
    from datavine.dashboard.views import build

    def make_document(doc: Document) -> None:
        feed.refresh()
        feed.sample()  # the first look starts the CPU measures: the next update has figures
        page = build(feed.board, title=title)
        for root in page.roots:
            doc.add_root(root)
        doc.title = title

        def update() -> None:
            feed.sample()
            page.update(feed.board)

        doc.add_periodic_callback(update, int(refresh_s * 1000))

    return make_document


def bokeh_server(feed: Feed, address: str, port: int, *, token: str | None, title: str,
                 refresh_s: float) -> BaseServer:
    """The page's Bokeh server (under ``/<token>/`` with a token) with ``/metrics`` beside
    it at the root, bound to ``address:port`` (0: any free port), not started yet. Built
    from Bokeh's parts (``BaseServer``) rather than ``Server``: only the application can add
    a handler outside the page's prefix."""
    from bokeh.application import Application
    from bokeh.application.handlers.function import FunctionHandler
    from bokeh.server.server import BaseServer
    from bokeh.server.tornado import BokehTornado
    from bokeh.server.util import bind_sockets, create_hosts_allowlist
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop

    from datavine.dashboard.metrics import PATH

    sockets, port = bind_sockets(address, port)
    try:
        app = BokehTornado(
            {"/": Application(FunctionHandler(application(feed, title, refresh_s)))},
            prefix=token or "",
            extra_websocket_origins=create_hosts_allowlist(origins(address, port, token), port))
        app.add_handlers(r".*", [(PATH, metrics_handler(), {"feed": feed, "token": token})])
        http = HTTPServer(app)
        http.add_sockets(sockets)
    except Exception:
        for sock in sockets:
            sock.close()
        raise
    return BaseServer(IOLoop.current(), app, http)


def serve(events: Path, address: str, port: int, ready: Path, *, token: str | None,
          parent: int | None, title: str, refresh_s: float = REFRESH_S) -> None:
    from tornado.ioloop import IOLoop, PeriodicCallback

    feed = Feed(events)
    loop = IOLoop.current()
    server = bokeh_server(feed, address, port, token=token, title=title, refresh_s=refresh_s)
    server.start()
    PeriodicCallback(feed.refresh, POLL_MS).start()
    if parent:
        def orphaned() -> None:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                loop.stop()
            except PermissionError:
                pass
        PeriodicCallback(orphaned, PARENT_MS).start()
    loop.asyncio_loop.add_signal_handler(signal.SIGTERM, loop.stop)  # type: ignore[attr-defined]
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"port": server.port, "pid": os.getpid()}))
    os.replace(tmp, ready)
    loop.start()
    with contextlib.suppress(Exception):
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datavine.dashboard.server",
                                     description="datavine's live view of a run.")
    parser.add_argument("--events", type=Path, required=True, help="the run's events file")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--ready", type=Path, required=True,
                        help="written with the port once listening")
    parser.add_argument("--parent", type=int, default=0, help="exit when this PID is gone")
    parser.add_argument("--title", default="datavine")
    parser.add_argument("--refresh", type=float, default=REFRESH_S, metavar="S",
                        help=f"seconds between a page's updates (default {REFRESH_S:g})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    serve(args.events, args.address, args.port, args.ready,
          token=os.environ.get(TOKEN_ENV) or None, parent=args.parent or None,
          title=args.title, refresh_s=max(0.2, args.refresh))
    return 0


if __name__ == "__main__":
    sys.exit(main())
