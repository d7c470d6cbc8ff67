"""Certificates for the TLS tests, made with the ``openssl`` command: a CA, the manager's
certificate signed by it for ``IP:127.0.0.1``, an impostor's (self-signed, the same subject
and address) and one signed by the CA for another host. Each test module makes them once
(its own ``certs`` fixture calls :func:`make_certs`)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]  # quick to make
SUBJECT = "/CN=datavine manager"


@dataclass(frozen=True)
class Certs:
    ca: Path  # the site's CA certificate
    key: Path  # the manager's key and certificate (signed by the CA, IP:127.0.0.1)
    cert: Path
    impostor_key: Path  # self-signed, the same subject and address
    impostor_cert: Path
    elsewhere_key: Path  # signed by the CA, for another host
    elsewhere_cert: Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def signed(folder: Path, name: str, san: str, ca: Path, ca_key: Path) -> tuple[Path, Path]:
    key, csr, cert, ext = (folder / f"{name}{s}" for s in (".key", ".csr", ".pem", ".ext"))
    ext.write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                   "extendedKeyUsage=serverAuth\n")
    openssl("req", "-new", *EC, "-keyout", str(key), "-out", str(csr), "-subj", SUBJECT)
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return key, cert


def make_certs(d: Path) -> Certs:
    """The test certificates, made in the folder ``d``."""
    assert shutil.which("openssl"), "openssl is missing: scripts/setup.sh installs it"
    ca, ca_key = d / "ca.pem", d / "ca.key"
    openssl("req", "-x509", *EC, "-keyout", str(ca_key), "-out", str(ca), "-days", "1",
            "-subj", "/CN=datavine test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    key, cert = signed(d, "manager", "IP:127.0.0.1", ca, ca_key)
    elsewhere_key, elsewhere_cert = signed(d, "elsewhere", "DNS:elsewhere.example", ca, ca_key)
    impostor_key, impostor_cert = d / "impostor.key", d / "impostor.pem"
    openssl("req", "-x509", *EC, "-keyout", str(impostor_key), "-out", str(impostor_cert),
            "-days", "1", "-subj", SUBJECT, "-addext", "subjectAltName=IP:127.0.0.1")
    return Certs(ca, key, cert, impostor_key, impostor_cert, elsewhere_key, elsewhere_cert)


def openssl_fingerprint(cert: Path) -> str:
    """``AB:CD:...`` as ``openssl x509 -fingerprint -sha256`` prints it."""
    out = subprocess.run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in",
                          str(cert)], check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1]


def facility(tmp_path: Path, certs: Certs, manager_extra: str = "") -> Path:
    """A facility file with TLS on its manager and one local pool."""
    path = tmp_path / "site.toml"
    path.write_text(f"""
[manager]
host = "127.0.0.1"
ssl_key = "{certs.key}"
ssl_cert = "{certs.cert}"
{manager_extra}
[[pools]]
name = "p"
batch = "local"
""")
    return path
