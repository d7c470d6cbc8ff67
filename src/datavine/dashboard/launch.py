"""Starting and stopping the live view with a cluster: :class:`Dashboard`.

A cluster (:class:`datavine.manager.cluster.Cluster`) makes one :class:`Dashboard` when it
starts: the events file in its run directory (``dashboard/events.jsonl``), the sink its
runs write to (:class:`~datavine.dashboard.events.EventSink`), and the server process
(:mod:`datavine.dashboard.server`), started like datavine's other processes: in a session of
its own (:mod:`datavine.deploy.sessions`), registered with the client's reaper
(:mod:`datavine.deploy.reaper`), stopped with everything it left. Every wait is bounded: the
server has ``ready_timeout_s`` to listen, else the run goes on without a view and
:attr:`Dashboard.error` says why.

Safe by default: it listens on 127.0.0.1. Bound to any other address it takes an access
token, made here when none is given, that the address it prints carries
(``http://host:port/<token>/``); without it a request finds nothing. The page only shows.

``DATAVINE_DASHBOARD=0`` in the environment turns the default off (batch jobs, test suites);
``LocalCluster(dashboard=False)`` or ``--no-dashboard`` for one cluster or command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path

from datavine.dashboard.events import EventSink
from datavine.deploy.reaper import reaper
from datavine.deploy.sessions import stop_session
from datavine.scheduler.racks import is_loopback

ENABLE_ENV = "DATAVINE_DASHBOARD"
STOP_GRACE_S = 3.0
POLL_S = 0.05


@dataclass(frozen=True)
class DashboardConfig:
    """Where the live view listens: ``address`` (127.0.0.1: this host only), ``port`` (0:
    any free one), ``token`` (None: one is made when ``address`` is not loopback; the
    address printed carries it), ``refresh_s`` (how often an open page is brought up to
    date), ``ready_timeout_s`` (how long the server may take to listen before the run goes
    on without it)."""

    address: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    refresh_s: float = 2.0
    ready_timeout_s: float = 30.0

    @property
    def needs_token(self) -> bool:
        return not is_loopback(self.address)


def dashboard_config(option: bool | DashboardConfig | None) -> DashboardConfig | None:
    """The settings a cluster's ``dashboard`` option stands for: ``False`` none, ``True``
    the defaults, ``None`` the defaults unless ``DATAVINE_DASHBOARD`` is 0 (pure but for
    the environment)."""
    if isinstance(option, DashboardConfig):
        return option
    if option is False:
        return None
    if option is None and os.environ.get(ENABLE_ENV, "1").strip().lower() in (
            "0", "no", "off", "false"):
        return None
    return DashboardConfig()


def dashboard_missing() -> str | None:
    """Why the live view cannot run here, or None (Bokeh is the ``dashboard`` extra)."""
    for module in ("bokeh", "tornado", "psutil"):
        if importlib.util.find_spec(module) is None:
            return (f"{module} is not installed (pip install 'datavine[dashboard]')")
    return None


def display_url(address: str, port: int, token: str | None) -> str:
    """The address to open (pure): an address for every interface is shown as this host's
    name; a token is the first part of the path."""
    host = address
    if address in ("", "0.0.0.0", "::"):
        host = socket.getfqdn()
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/" + (f"{token}/" if token else "")


class Dashboard:
    """One cluster's live view: its events sink and its server process."""

    def __init__(self, directory: str | os.PathLike[str], config: DashboardConfig,
                 title: str = "datavine") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.title = title
        self.events_path = self.directory / "events.jsonl"
        self.events_path.unlink(missing_ok=True)  # one cluster's runs per file
        self.sink = EventSink(self.events_path)
        self.token = config.token or (secrets.token_urlsafe(24) if config.needs_token else None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.error: str | None = None
        self._ready = self.directory / "ready.json"

    # --- the process --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the server (it listens a second or two later: :meth:`wait_ready`)."""
        self._ready.unlink(missing_ok=True)
        env = dict(os.environ)
        env.pop("DATAVINE_DASHBOARD_TOKEN", None)
        if self.token:
            env["DATAVINE_DASHBOARD_TOKEN"] = self.token
        cmd = [sys.executable, "-m", "datavine.dashboard.server",
               "--events", str(self.events_path), "--address", self.config.address,
               "--port", str(self.config.port), "--ready", str(self._ready),
               "--parent", str(os.getpid()), "--title", self.title,
               "--refresh", str(self.config.refresh_s)]
        with open(self.directory / "server.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        reaper().add_session(self.proc.pid)

    def wait_ready(self) -> str | None:
        """The address to open, once the server listens (at most ``ready_timeout_s``);
        None, with :attr:`error` set, when it did not start."""
        if self.port is not None or self.proc is None:
            return self.url
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                self.port = int(json.loads(self._ready.read_text())["port"])
                return self.url
            if self.proc.poll() is not None:
                self.error = (f"the dashboard's server exited ({self.proc.returncode}): "
                              f"{self._log_tail()}")
                self.stop()
                return None
            time.sleep(POLL_S)
        self.error = (f"the dashboard's server did not listen within "
                      f"{self.config.ready_timeout_s:.0f} s: {self._log_tail()}")
        self.stop()
        return None

    @property
    def url(self) -> str | None:
        """The address to open (with the token in it), once listening."""
        if self.port is None:
            return None
        return display_url(self.config.address, self.port, self.token)

    @property
    def address(self) -> str | None:
        """The address without its token: what records and logs may keep."""
        if self.port is None:
            return None
        return display_url(self.config.address, self.port, None)

    @property
    def metrics_url(self) -> str | None:
        """Where its server serves the run's Prometheus metrics (a scrape sends the token
        as ``Authorization: Bearer <token>``; :mod:`datavine.dashboard.metrics`)."""
        address = self.address
        return f"{address}metrics" if address else None

    def describe(self) -> str:
        """One line for a command's output: the address, and the token rule."""
        if self.url is None:
            return f"off ({self.error or 'not started'})"
        if self.token:
            return (f"{self.url} (listens on {self.config.address}: the access token in "
                    "the address is required)")
        return self.url

    def _log_tail(self) -> str:
        try:
            lines = (self.directory / "server.log").read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-3:]) or "no output"

    def stop(self) -> None:
        """Stop the server and what it left (bounded); the events file stays."""
        self.sink.flush()
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_session(proc.pid, grace_s=STOP_GRACE_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
        reaper().remove_session(proc.pid)

    def close(self) -> None:
        self.stop()
        self.sink.close()

    # --- what runs and apps hand it -----------------------------------------------------------
    def expect_events(self, weights: Mapping[Hashable, int]) -> None:
        """Physics events per task key, for events/s (the next run's tasks)."""
        self.sink.expect_events(weights)

    def save_report(self, path: str | os.PathLike[str], title: str | None = None) -> Path:
        """The last run's view as one self-contained HTML file at ``path``."""
        from datavine.dashboard.report import write_report

        self.sink.flush()
        return write_report(self.events_path, path, title=title or self.title)


# --- the commands' options ------------------------------------------------------------------
def add_options(group: argparse._ArgumentGroup) -> None:
    """``--no-dashboard``, ``--dashboard-address``, ``--dashboard-port`` (``datavine run``,
    ``datavine scale-test``)."""
    group.add_argument("--no-dashboard", action="store_true",
                       help="serve no live view of the run (and save none next to --json)")
    group.add_argument("--dashboard-address", default="127.0.0.1", metavar="HOST",
                       help="where the live view listens (default 127.0.0.1: this host only; "
                       "any other address requires the access token the printed address "
                       "carries)")
    group.add_argument("--dashboard-port", type=int, default=0, metavar="P",
                       help="its port (default: any free one)")
    group.add_argument("--metrics", default=None, metavar="[ADDRESS:]PORT",
                       help="serve Prometheus /metrics from the manager's process there, "
                       "with or without the live view (default: DATAVINE_METRICS, else the "
                       "facility file's [metrics] listen, else none; an ADDRESS other than "
                       "127.0.0.1 requires a bearer token: DATAVINE_METRICS_TOKEN, else one "
                       "made and written into the run directory)")


def option_from_args(args: argparse.Namespace) -> bool | DashboardConfig | None:
    """The cluster's ``dashboard`` option from those command-line options (``None``, the
    default, when none was given: ``DATAVINE_DASHBOARD`` may turn it off)."""
    if args.no_dashboard:
        return False
    config = DashboardConfig(address=args.dashboard_address, port=args.dashboard_port)
    return None if config == DashboardConfig() else config


def announce(cluster: object) -> str:
    """The command's line about the live view of ``cluster`` (and its manager's metrics
    listener, when it has one: :mod:`datavine.dashboard.metrics_listener`)."""
    dashboard = getattr(cluster, "dashboard", None)
    if dashboard is not None:
        line = f"dashboard: {dashboard.describe()}"
    else:
        why = getattr(cluster, "dashboard_error", None)
        line = f"dashboard: off ({why})" if why else "dashboard: off"
    metrics = getattr(cluster, "metrics", None)
    if metrics is not None:
        return f"{line}; metrics: {metrics.describe()}"
    why = getattr(cluster, "metrics_error", None)
    return f"{line}; metrics: off ({why})" if why else line
