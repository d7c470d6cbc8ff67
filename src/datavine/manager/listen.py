"""Where the TaskVine manager listens: one local address, or every interface.

TaskVine's manager listens inside ``vine_create``, before any setting can be passed, so
datavine's TaskVine build reads the address from the environment variable
``VINE_LISTEN_ADDRESS`` there (``scripts/patches/cctools/0002-vine-listen-address.patch``).
:func:`listen_address` turns :attr:`ManagerConfig.listen_host
<datavine.config.ManagerConfig.listen_host>` into the numeric address to bind (``None``:
every interface), :func:`listening_on` sets the variable only while the manager is
created, so that nothing started later inherits it, and :func:`contact_host` is the
address a process on this host reaches the manager by (local workers).
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import socket
from collections.abc import Iterator

from datavine.config import ManagerConfig
from datavine.errors import ManagerStartError
from datavine.scheduler.racks import normal_host

ENV_LISTEN = "VINE_LISTEN_ADDRESS"
LOOPBACK = "127.0.0.1"


def listen_address(cfg: ManagerConfig) -> str | None:
    """The numeric address the manager binds, or ``None`` for every interface.

    A host name is resolved here (its first address), so that a name that does not
    resolve fails the start with a message naming it, not a bare "could not create"."""
    if cfg.listens_everywhere:
        return None
    host = cfg.listen_host
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ManagerStartError(f"the manager cannot listen on {host!r} "
                                f"(ManagerConfig.listen_host): the name does not resolve "
                                f"({exc.strerror or exc})") from None
    return str(infos[0][4][0])


def contact_host(address: str | None) -> str:
    """The address a process on this host connects to for a manager bound to ``address``
    (pure): loopback when it listens everywhere."""
    return LOOPBACK if address is None else address


@contextlib.contextmanager
def listening_on(address: str | None) -> Iterator[None]:
    """``VINE_LISTEN_ADDRESS`` set to ``address`` (removed for ``None``) for the duration,
    then put back as it was."""
    before = os.environ.get(ENV_LISTEN)
    if address is None:
        os.environ.pop(ENV_LISTEN, None)
    else:
        os.environ[ENV_LISTEN] = address
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_LISTEN, None)
        else:
            os.environ[ENV_LISTEN] = before


@functools.lru_cache(maxsize=1)
def local_host() -> str:
    """This machine's name (``uname -n``), normalised: the manager's host, which loopback
    names and addresses stand for in placement (:mod:`datavine.scheduler.racks`)."""
    return normal_host(socket.gethostname())
