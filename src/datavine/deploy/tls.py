"""How a worker (or datavine's own status client) knows that it talks to its manager.

With TLS on (``ManagerConfig.ssl_key``/``ssl_cert``) the wire is private, but a worker that
does not check the certificate it gets learns nothing about who answered: whoever takes the
manager's address, or sits on the path, can play the manager. The project's TaskVine
(``scripts/patches/cctools/0014-*``) gives ``vine_worker`` two checks, each implying
``--ssl``:

- ``--ssl-ca=<file>``: the manager's certificate must verify against the CA certificates in
  this PEM file and name the host the worker connects to (an address as an IP SAN);
- ``--ssl-fingerprint=<hex>``: the certificate must have this SHA-256 fingerprint (the
  digest of its DER form; 64 hex digits, colons allowed, any case).

:class:`ManagerTrust` holds either or both, checked when it is made (a
:class:`~datavine.errors.ConfigError` naming the setting and its value), and gives the
worker's options; :func:`certificate_fingerprint` computes the pin of a certificate file
(a manager with TLS pins its local workers to its own certificate). The checks of values
(:func:`check_fingerprint`, :func:`check_ca_file`) take the setting's name so that a
pool's, a facility file's or a command's error names its own. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from datavine.errors import ConfigError

__all__ = ["ManagerTrust", "certificate_fingerprint", "check_ca_file", "check_fingerprint",
           "fingerprint_of_der", "trust_options"]

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----\s.*?-----END CERTIFICATE-----", re.S)
_HEX = re.compile(r"^[0-9a-f]{64}$")


def fingerprint_of_der(der: bytes) -> str:
    """The SHA-256 fingerprint of a DER certificate: 64 lowercase hex digits."""
    return hashlib.sha256(der).hexdigest()


def certificate_fingerprint(cert_pem: Path) -> str:
    """The SHA-256 fingerprint of the first certificate in the PEM file ``cert_pem`` (the
    one a TaskVine manager presents: it sends no chain), as 64 lowercase hex digits;
    a ConfigError naming the file when it cannot be read or holds no PEM certificate."""
    try:
        data = Path(cert_pem).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the certificate {cert_pem}: "
                          f"{exc.strerror or exc}") from exc
    found = _PEM_CERT.search(data)
    if found is None:
        raise ConfigError(f"{cert_pem} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    try:
        der = ssl.PEM_cert_to_DER_cert(found.group().decode("ascii"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{cert_pem}: its first certificate is not valid PEM ({exc})") \
            from exc
    return fingerprint_of_der(der)


def check_fingerprint(text: str, setting: str = "ssl_fingerprint") -> str:
    """``text`` as a SHA-256 fingerprint in one form (lowercase hex, no colons); ``AB:cd:..``
    and ``abcd..`` are the same. A ConfigError naming ``setting`` and the value otherwise."""
    digits = text.replace(":", "").strip().lower()
    if not _HEX.match(digits):
        raise ConfigError(f"{setting}={text!r} is not a SHA-256 certificate fingerprint "
                          "(64 hex digits, colons allowed; e.g. openssl x509 -noout "
                          "-fingerprint -sha256 -in manager.crt)")
    return digits


def check_ca_file(path: Path, setting: str = "ssl_ca") -> Path:
    """``path`` if it is a readable PEM file of CA certificates (one at least); a
    ConfigError naming ``setting`` and the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{setting}={str(path)!r}: no such file (the PEM file of the CA "
                          "certificates the manager's certificate must verify against)")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{setting}={str(path)!r}: not readable by this user")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(path))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"{setting}={str(path)!r} holds no PEM CA certificate ({exc})") \
            from exc
    return path


def trust_options(ca_file: str | None, fingerprint: str | None) -> tuple[str, ...]:
    """``vine_worker``'s options for these checks, ``vine_factory``'s too (pure; values
    already checked):
    ``--ssl-ca=<file>``, ``--ssl-fingerprint=<hex>``."""
    options = []
    if ca_file is not None:
        options.append(f"--ssl-ca={ca_file}")
    if fingerprint is not None:
        options.append(f"--ssl-fingerprint={fingerprint}")
    return tuple(options)


@dataclass(frozen=True)
class ManagerTrust:
    """What a worker checks the manager's certificate against: a CA file (the chain and
    the host's name), a pinned SHA-256 fingerprint, or both (both must hold). At least one
    is given; ``fingerprint`` is kept in one form (lowercase hex, no colons), ``ca_file``
    absolute (it names the same file from any folder)."""

    ca_file: Path | None = None
    fingerprint: str | None = None

    def __post_init__(self) -> None:
        if self.ca_file is None and self.fingerprint is None:
            raise ConfigError("ManagerTrust needs ssl_ca or ssl_fingerprint (or both)")
        if self.fingerprint is not None:
            object.__setattr__(self, "fingerprint", check_fingerprint(self.fingerprint))
        if self.ca_file is not None:
            object.__setattr__(self, "ca_file", check_ca_file(self.ca_file).absolute())

    @classmethod
    def pinned_to(cls, cert_pem: Path) -> ManagerTrust:
        """Trust pinned to the certificate in ``cert_pem`` (a manager's ``ssl_cert``)."""
        return cls(fingerprint=certificate_fingerprint(cert_pem))

    def worker_options(self) -> tuple[str, ...]:
        """``vine_worker``'s options: ``--ssl-ca=<file>`` and/or ``--ssl-fingerprint=<hex>``
        (each implies ``--ssl``)."""
        return trust_options(str(self.ca_file) if self.ca_file is not None else None,
                             self.fingerprint)

    def matches(self, der: bytes) -> bool:
        """Whether a peer certificate (DER) has the pinned fingerprint (True without one)."""
        return self.fingerprint is None or fingerprint_of_der(der) == self.fingerprint
