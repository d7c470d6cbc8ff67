"""The manager process's own ``/metrics`` listener, for clusters whose live view is off.

A cluster asked for metrics (``LocalCluster(metrics=True)`` or ``metrics=MetricsConfig(...)``,
or ``DATAVINE_METRICS=[ADDRESS:]PORT`` in the environment for any command: a batch job's
``datavine run`` with ``--no-dashboard``) starts one :class:`MetricsListener`: a small HTTP
server on a thread of the manager's process, serving :mod:`datavine.dashboard.metrics` at
``/metrics`` and nothing else. Its figures come from the same events the live view folds:
it tails the live view's events file when there is one, else it has the run write them to a
file of its own (:class:`~datavine.dashboard.events.EventSink` in ``metrics/`` of the run
directory), and folds them into a :class:`~datavine.dashboard.model.Board` at each scrape
(the run pays for writing the records, as it does for the live view; the fold is the
scrape's). The manager's CPU seconds are this process's own.

Safe by default, like the live view: it listens on 127.0.0.1. Bound to any other address it
takes an access token (:attr:`MetricsConfig.token`, else ``DATAVINE_METRICS_TOKEN``, else
one made here and written to ``metrics/token``, mode 0600, in the run directory) that a
scrape must send as ``Authorization: Bearer <token>`` (Prometheus' ``authorization``
setting, or ``credentials_file``); without it the answer is 401 and nothing else. A client
gets :data:`CLIENT_TIMEOUT_S` to send its request.

The thread answers while the run's loop waits in TaskVine's ``Manager.wait``, which releases
the GIL in datavine's TaskVine build; with a TaskVine whose ``wait`` holds it, a scrape
waits for the loop's next turn.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from datavine.dashboard.events import EventSink, Tail
from datavine.dashboard.launch import display_url
from datavine.dashboard.model import Board
from datavine.errors import ConfigError
from datavine.safe_paths import write_secret
from datavine.scheduler.racks import is_loopback

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

ENV = "DATAVINE_METRICS"  # [ADDRESS:]PORT: a listener for every cluster of the process
TOKEN_ENV = "DATAVINE_METRICS_TOKEN"
CLIENT_TIMEOUT_S = 10.0  # a client that sends no request in this long is dropped
STOP_S = 5.0


@dataclass(frozen=True)
class MetricsConfig:
    """Where the manager's ``/metrics`` listener listens: ``address`` (127.0.0.1: this host
    only), ``port`` (0: any free one; a scraper wants a fixed one), ``token`` (None: from
    ``DATAVINE_METRICS_TOKEN``, else one is made when ``address`` is not loopback)."""

    address: str = "127.0.0.1"
    port: int = 0
    token: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"MetricsConfig.port={self.port} is not a TCP port")
        if not self.address or any(c.isspace() for c in self.address):
            raise ConfigError(f"MetricsConfig.address is not a host or address: "
                              f"{self.address!r}")

    @property
    def needs_token(self) -> bool:
        return not is_loopback(self.address)


def parse_listen(text: str, setting: str = ENV) -> tuple[str, int]:
    """``PORT``, ``ADDRESS:PORT`` or ``[IPv6]:PORT`` as (address, port); 127.0.0.1 when
    no address is given (pure). Bad text is a ConfigError naming ``setting``."""
    text = text.strip()
    address, sep, port = text.rpartition(":")
    if not sep:
        address, port = "127.0.0.1", text
    address = address.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ConfigError(f"{setting}={text!r}: expected PORT or ADDRESS:PORT") from None
    if not 0 <= number < 65536:
        raise ConfigError(f"{setting}={text!r}: {number} is not a TCP port")
    return address, number


def metrics_config(option: bool | MetricsConfig | None,
                   environ: Mapping[str, str] = os.environ) -> MetricsConfig | None:
    """The settings a cluster's ``metrics`` option stands for: ``False`` none, ``True`` the
    defaults, ``None`` what ``DATAVINE_METRICS`` says (none when it is unset or empty)
    (pure but for the environment). The token falls back to ``DATAVINE_METRICS_TOKEN``."""
    token = environ.get(TOKEN_ENV) or None
    if isinstance(option, MetricsConfig):
        return option if option.token or not token else MetricsConfig(
            option.address, option.port, token)
    if option is False:
        return None
    if option is True:
        return MetricsConfig(token=token)
    listen = environ.get(ENV, "").strip()
    if not listen:
        return None
    address, port = parse_listen(listen)
    return MetricsConfig(address, port, token)


def metrics_from_args(args: argparse.Namespace) -> MetricsConfig | None:
    """The listener a command's ``--metrics [ADDRESS:]PORT`` asks for (``None``: not given;
    the token from ``DATAVINE_METRICS_TOKEN``, else made at start). A bad value is a
    :class:`~datavine.errors.ConfigError` naming the option."""
    text = getattr(args, "metrics", None)
    if text is None:
        return None
    return metrics_config(MetricsConfig(*parse_listen(text, "--metrics")))


def metrics_missing() -> str | None:
    """Why the metrics cannot be served here, or None."""
    if importlib.util.find_spec("prometheus_client") is None:
        return "prometheus_client is not installed (pip install prometheus_client)"
    return None


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT_S

    def log_message(self, format: str, *args: object) -> None:
        """No line per scrape on the run's standard error."""


class MetricsListener:
    """One cluster's ``/metrics`` listener: the events it folds (``events``: the live
    view's file, else a sink of its own, :attr:`sink`), its HTTP server and thread."""

    def __init__(self, config: MetricsConfig, directory: str | os.PathLike[str],
                 events: Path | None = None,
                 cpu_s: Callable[[], float] = time.process_time) -> None:
        self.config = config
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sink: EventSink | None = None  # the run's sink when the listener has its own
        if events is None:
            events = self.directory / "events.jsonl"
            events.unlink(missing_ok=True)  # one cluster's runs per file
            self.sink = EventSink(events)
        self.tail = Tail(events)
        self.board = Board()
        self.cpu_s = cpu_s
        self.token = config.token
        self.token_file: Path | None = None
        if self.token is None and config.needs_token:
            self.token = secrets.token_urlsafe(24)
            self.token_file = write_secret(self.directory / "token", self.token, replace=True)
        self._lock = threading.Lock()  # one scrape folds the board at a time
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- serving -------------------------------------------------------------------------------
    def start(self) -> None:
        """Listen (an OSError names the address when it cannot) and serve on a thread."""
        server_class = _Server6 if ":" in self.config.address else _Server
        try:
            server = make_server(self.config.address, self.config.port, self.app,
                                 server_class=server_class, handler_class=_Quiet)
        except OSError as exc:
            raise OSError(exc.errno, f"the metrics listener cannot listen on "
                          f"{self.config.address}:{self.config.port} (MetricsConfig, "
                          f"{ENV}): {exc.strerror or exc}") from exc
        assert isinstance(server, _Server)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="datavine-metrics", daemon=True)
        self._thread.start()

    def scrape(self, accept: str | None = None) -> tuple[bytes, str]:
        """The metrics as of now: the events read up to the file's end, folded."""
        from datavine.dashboard.metrics import exposition

        with self._lock:
            self.board.apply_all(self.tail.read())
            return exposition(self.board, self.cpu_s(), accept)

    def app(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """The WSGI application: ``/metrics`` (behind the token), else 404."""
        from datavine.dashboard.metrics import PATH, UNAUTHORIZED, authorized

        if environ.get("PATH_INFO", "") not in (PATH, PATH + "/"):
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"404: only /metrics here\n"]
        if not authorized(self.token, environ.get("HTTP_AUTHORIZATION")):
            start_response("401 Unauthorized", [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("WWW-Authenticate", 'Bearer realm="datavine"')])
            return [UNAUTHORIZED]
        body, content_type = self.scrape(environ.get("HTTP_ACCEPT"))
        start_response("200 OK", [("Content-Type", content_type), ("Cache-Control", "no-store"),
                                  ("Content-Length", str(len(body)))])
        return [body]

    # --- what a cluster shows --------------------------------------------------------------------
    @property
    def port(self) -> int | None:
        if self._server is None:
            return None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str | None:
        """The address to scrape (the token goes in a header, never in the address)."""
        if self.port is None:
            return None
        return display_url(self.config.address, self.port, None) + "metrics"

    def describe(self) -> str:
        """One line for a command's output: the address, and where the token is."""
        if self.url is None:
            return "off (not started)"
        if self.token_file is not None:
            return f"{self.url} (bearer token in {self.token_file})"
        if self.token:
            return f"{self.url} (bearer token required)"
        return self.url

    def close(self) -> None:
        """Stop serving (bounded) and close the sink it owns; the events file stays."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=STOP_S)
        if self.sink is not None:
            self.sink.close()

