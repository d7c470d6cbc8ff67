"""Ask a running TaskVine manager how many workers it has, from any process.

``vine_status HOST PORT`` cannot authenticate, so it is refused by a manager with a password
(as datavine's always are). This module speaks the manager's status protocol itself, as
``vine_factory`` does: connect, prove the password and check the manager's proof (the
project's TaskVine exchange, ``datavine.deploy.vine_auth``), send ``<what>_status`` and
read one JSON array back.

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


def query_manager(host: str, port: int, what: str = "manager", *,
                  password_file: Path | None = None, ssl: bool = False,
                  timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The manager's ``<what>_status`` answer: ``manager``, ``worker``, ``task``..."""
    address = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise ManagerQueryError(f"cannot connect to the manager at {address}: {exc}") from exc
    try:
        if ssl:
            ctx = ssl_module.SSLContext(ssl_module.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl_module.CERT_NONE  # TaskVine managers use self-signed certs
            sock = ctx.wrap_socket(sock, server_hostname=host)
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
                      ssl: bool = False, timeout_s: float = 5.0) -> int:
    """How many workers are connected to the manager now."""
    answer = query_manager(host, port, "manager", password_file=password_file, ssl=ssl,
                           timeout_s=timeout_s)
    if not answer:
        raise ManagerQueryError(f"the manager at {host}:{port} sent an empty status")
    return int(answer[0].get("workers", 0))
