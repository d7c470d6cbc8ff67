"""Ask a running TaskVine manager how many workers it has, from any process.

``vine_status HOST PORT`` cannot authenticate, so it is refused by a manager with a password
(as datavine's always are). This module speaks the manager's status protocol itself, as
``vine_factory`` does: connect, prove the password and check the manager's proof (the
project's TaskVine exchange, ``datavine.deploy.vine_auth``), send ``<what>_status`` and
read one JSON array back.

With TLS it checks whom it reached before it says anything, as the workers do
(:mod:`datavine.deploy.tls`): given a :class:`~datavine.deploy.tls.ManagerTrust`, the
manager's certificate must verify against its CA file and name the host connected to,
and/or have its pinned SHA-256 fingerprint, else :class:`ManagerQueryError` and nothing is
sent (no password proof to an impostor). ``ssl=True`` without a trust checks nothing (a
pool whose workers check nothing either).

The manager answers only while its owner is inside ``Manager.wait()`` (it serves
connections there), and that call holds the GIL: query it from another process, never from
a thread of the manager's own process.
"""

from __future__ import annotations

import json
import socket
import ssl as ssl_module
from pathlib import Path
from typing import Any

from datavine.deploy.tls import ManagerTrust, fingerprint_of_der
from datavine.deploy.vine_auth import AUTH_IDENT, AUTH_IDENT_V1, AuthRefused, authenticate_as_client
from datavine.errors import DatavineError


class ManagerQueryError(DatavineError):
    """The manager could not be reached, refused the password, or answered nonsense."""


class _Lines:
    """Line reading over a socket, with one deadline for the whole exchange."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, line: bytes) -> None:
        self.sock.sendall(line + b"\n")

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ManagerQueryError("the manager closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.rstrip(b"\r")

    def read_all(self) -> bytes:
        data = [self.buf]
        while chunk := self.sock.recv(65536):
            data.append(chunk)
        return b"".join(data)


def tls_context(trust: ManagerTrust | None) -> ssl_module.SSLContext:
    """A client context: with ``trust.ca_file``, the chain must verify against it and the
    certificate name the host; otherwise no check here (a pinned fingerprint is compared
    after the handshake, :func:`check_peer`)."""
    ctx = ssl_module.SSLContext(ssl_module.PROTOCOL_TLS_CLIENT)
    if trust is not None and trust.ca_file is not None:
        ctx.load_verify_locations(cafile=str(trust.ca_file))
        ctx.check_hostname = True  # an address is matched against the IP SANs
        ctx.verify_mode = ssl_module.CERT_REQUIRED
    else:  # nothing configured to check against (a pinned fingerprint is checked after)
        ctx.check_hostname = False
        ctx.verify_mode = ssl_module.CERT_NONE
    return ctx


def check_peer(sock: ssl_module.SSLSocket, trust: ManagerTrust, address: str) -> None:
    """ManagerQueryError unless the peer's certificate has ``trust``'s pinned fingerprint."""
    der = sock.getpeercert(binary_form=True)
    if der is None or not trust.matches(der):
        got = fingerprint_of_der(der) if der is not None else "none"
        raise ManagerQueryError(f"the manager at {address} presented a certificate whose "
                                f"SHA-256 fingerprint is {got}, not the pinned "
                                f"{trust.fingerprint}: not the manager (nothing was sent)")


def query_manager(host: str, port: int, what: str = "manager", *,
                  password_file: Path | None = None, ssl: bool = False,
                  trust: ManagerTrust | None = None,
                  timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The manager's ``<what>_status`` answer: ``manager``, ``worker``, ``task``...;
    ``trust``: what its certificate is checked against (implies ``ssl``)."""
    address = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise ManagerQueryError(f"cannot connect to the manager at {address}: {exc}") from exc
    try:
        if ssl or trust is not None:
            try:
                tls = tls_context(trust).wrap_socket(sock, server_hostname=host)
            except ssl_module.SSLCertVerificationError as exc:
                ca = trust.ca_file if trust is not None else None
                raise ManagerQueryError(f"the certificate of the manager at {address} does "
                                        f"not verify against {ca} as {host!r}: "
                                        f"{exc.verify_message} (nothing was sent)") from exc
            sock = tls
            if trust is not None:
                check_peer(tls, trust, address)
        lines = _Lines(sock)
        if password_file is not None:
            try:
                authenticate_as_client(lines, Path(password_file).read_bytes())
            except AuthRefused as exc:
                raise ManagerQueryError(f"the manager at {address}: {exc}") from exc
        lines.send(f"{what}_status".encode())
        raw = lines.read_all()
    except (OSError, ssl_module.SSLError) as exc:
        raise ManagerQueryError(f"status query to the manager at {address} failed: {exc}") \
            from exc
    finally:
        sock.close()
    if raw.startswith((AUTH_IDENT, AUTH_IDENT_V1)):
        raise ManagerQueryError(f"the manager at {address} asks for a password: pass its "
                                "password file")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ManagerQueryError(f"the manager at {address} sent no JSON: {raw[:200]!r}") from exc
    if not isinstance(doc, list):
        raise ManagerQueryError(f"the manager at {address} sent {type(doc).__name__}, not a list")
    return doc


def connected_workers(host: str, port: int, *, password_file: Path | None = None,
                      ssl: bool = False, trust: ManagerTrust | None = None,
                      timeout_s: float = 5.0) -> int:
    """How many workers are connected to the manager now."""
    answer = query_manager(host, port, "manager", password_file=password_file, ssl=ssl,
                           trust=trust, timeout_s=timeout_s)
    if not answer:
        raise ManagerQueryError(f"the manager at {host}:{port} sent an empty status")
    return int(answer[0].get("workers", 0))
