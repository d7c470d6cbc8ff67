"""A ``root://`` URL opened as given (no shard map), and the XRootD client's settings.

:class:`DirectSource` opens the URL on the server it names; its reads are ``"direct"`` in
the records (far: no rack is known). The XCache way (:mod:`datavine.io.source.xcache`) imports
this module too, for the settings below.

Why the XRootD client environment is set here, at import (each value measured on the
loopback testbed, XRootD 5.5.3 servers, Python client 6.2):

- ``XRD_CONNECTIONRETRY=1``, ``XRD_CONNECTIONWINDOW=3``: by default XrdCl retries a refused
  connection 5 times in 120 s windows, so a stopped shard blocked a reader for minutes; now
  it fails in milliseconds.
- ``XRD_STREAMERRORWINDOW=5``: after such a failure XrdCl remembers the server as broken for
  this window (default 1800 s) and fails every request to it at once, so a restarted shard
  stayed unusable to the process for half an hour; now ~5 s.
- ``XRD_TIMEOUTRESOLUTION=1``, ``XRD_STREAMTIMEOUT=10``: timeouts are only checked every 15 s
  by default, and a connected stream may stay silent 60 s; a hung (SIGSTOPped) shard then
  cost 15 s (new connection) or 45 s (open connection) before failover; now ~4 s and ~14 s.
- ``XRD_REQUESTTIMEOUT=60`` bounds any single request (default 1800 s).

XrdCl reads these variables once, when the client library first sets up its environment, so
they must be in ``os.environ`` before any ``root://`` file is opened in this process; values
already set by the user win. If the client module was already imported,
:func:`configure_xrootd_client` also pushes them into its live environment. The read layer
imports this module when it first opens a URL (:func:`datavine.io.reading.source_for`), and
so does ``import datavine.io.xcache`` (the testbed); local workers get the same values in
their environment (:func:`datavine.deploy.local_workers.worker_environment`).
"""

from __future__ import annotations

import os
import sys

from datavine.io.source.base import DIRECT, H, Opener, OpenRecord, Source, open_on

XRD_CLIENT_ENV: dict[str, str] = {
    "XRD_CONNECTIONRETRY": "1",
    "XRD_CONNECTIONWINDOW": "3",
    "XRD_REQUESTTIMEOUT": "60",
    "XRD_STREAMTIMEOUT": "10",
    "XRD_STREAMERRORWINDOW": "5",
    "XRD_TIMEOUTRESOLUTION": "1",
}
# The same settings' names inside XrdCl's environment (XRootD.client.EnvPutInt).
_XRDCL_NAMES = {"XRD_CONNECTIONRETRY": "ConnectionRetry", "XRD_CONNECTIONWINDOW":
                "ConnectionWindow", "XRD_REQUESTTIMEOUT": "RequestTimeout",
                "XRD_STREAMTIMEOUT": "StreamTimeout",
                "XRD_STREAMERRORWINDOW": "StreamErrorWindow",
                "XRD_TIMEOUTRESOLUTION": "TimeoutResolution"}


def configure_xrootd_client(env: dict[str, str] | None = None) -> dict[str, str]:
    """Put fast-failover settings in the environment (user values win); returns what is set."""
    env = env if env is not None else XRD_CLIENT_ENV
    for key, value in env.items():
        os.environ.setdefault(key, value)
    client = sys.modules.get("XRootD.client")
    if client is not None:  # already imported: its environment may be initialised already
        for key in env:
            if key in _XRDCL_NAMES:
                client.EnvPutInt(_XRDCL_NAMES[key], int(os.environ[key]))
    return {k: os.environ[k] for k in env}


configure_xrootd_client()


class DirectSource(Source):
    """Opens a URL on the server it names."""

    def open(self, url: str, opener: Opener[H], **options: object) -> tuple[H, OpenRecord]:
        return open_on(DIRECT, url, opener, **options)
