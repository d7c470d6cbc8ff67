"""TaskVine's password exchange, as the project's TaskVine speaks it (patch 0012), in Python.

Used where datavine talks to a manager itself (``manager_status``: how many workers are
connected) and by the tests that play an attacker against the real binaries.

The exchange (ident ``auth password hmac-sha256 v2``): each side sends the ident line and
a challenge of 32 random bytes in hex; the connecting side proves the password first, then
the accepting side. A proof is HMAC-SHA256 keyed by the password over
``ident LF role LF server-challenge LF client-challenge``, where the role names the side and
its service (``manager``/``worker``; a worker's transfer server and its peers:
``transfer-server``/``transfer-client``): it binds who answers, both challenges and the
version, so an answer can be neither reflected back to its sender nor relayed to another
connection or service. The old exchange (``auth password sha1``) is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Protocol

AUTH_IDENT = b"auth password hmac-sha256 v2"
AUTH_IDENT_V1 = b"auth password sha1"
CHALLENGE_HEX = 64


class AuthRefused(Exception):
    """The peer refused our proof, failed to prove its own, or spoke another exchange."""


class LineChannel(Protocol):
    """A connection that sends and reads lines (without their line feed)."""

    def send(self, line: bytes) -> None: ...

    def readline(self) -> bytes: ...


def proof(password: bytes, role: str, server_challenge: bytes, client_challenge: bytes) -> bytes:
    """The proof that ``role`` (e.g. ``manager``, ``worker``) holds the password, in hex."""
    message = b"\n".join((AUTH_IDENT, role.encode(), server_challenge, client_challenge))
    return hmac.new(password, message, hashlib.sha256).hexdigest().encode()


def challenge() -> bytes:
    """A fresh challenge: 32 bytes from the system's generator, in hex."""
    return secrets.token_hex(CHALLENGE_HEX // 2).encode()


def is_challenge(line: bytes) -> bool:
    """Whether a line has the form of a challenge (64 lowercase hex digits)."""
    return len(line) == CHALLENGE_HEX and all(c in b"0123456789abcdef" for c in line)


def authenticate_as_client(lines: LineChannel, password: bytes, *, role: str = "worker",
                           server_role: str = "manager") -> None:
    """Prove the password as ``role`` to the ``server_role`` at the other end, check its proof.

    Raises ``AuthRefused`` naming what failed; returns once both sides are satisfied.
    """
    lines.send(AUTH_IDENT)
    ident = lines.readline()
    if ident != AUTH_IDENT:
        if ident == AUTH_IDENT_V1:
            raise AuthRefused(f"the peer speaks {AUTH_IDENT_V1.decode()!r}, which can be "
                              "reflected: it needs the project's TaskVine (patch 0012)")
        raise AuthRefused("the peer does not use password authentication")
    mine = challenge()
    lines.send(mine)
    theirs = lines.readline()
    if not is_challenge(theirs) or theirs == mine:
        raise AuthRefused("the peer sent a malformed or reflected challenge")
    lines.send(proof(password, role, theirs, mine))
    answer = lines.readline()
    if answer == b"failure":
        raise AuthRefused("the peer rejected the password")
    if not hmac.compare_digest(answer, proof(password, server_role, theirs, mine)):
        lines.send(b"failure")
        raise AuthRefused("the peer did not prove that it holds the password")
    lines.send(b"ok")
