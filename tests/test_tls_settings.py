"""The settings that carry the checks of the manager's certificate (issue 28, item 3),
without TaskVine: fingerprints and CA files checked and refused naming their setting, the
options a worker's and a factory's command lines get, a pool's staged CA file, a facility
file's keys (and its default pin to its own certificate), ``datavine pool start``'s
options. On the real binaries: ``tests/test_tls_verify.py``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from datavine.config import ConfigError, LocalWorkersConfig
from datavine.deploy.facility import FacilityError, load_facility
from datavine.deploy.local_workers import worker_command
from datavine.deploy.pools import cli as pool_cli
from datavine.deploy.pools.base import PoolStatus, WorkerPool
from datavine.deploy.pools.ca_file import CA_NAME, stage_ca
from datavine.deploy.pools.factory import (
    FactoryConfig,
    config_from_dict,
    config_to_dict,
    factory_command,
)
from datavine.deploy.pools.local import LocalFactoryPool
from datavine.deploy.tls import ManagerTrust, certificate_fingerprint
from tests.tls_certs import Certs, facility, make_certs, openssl_fingerprint


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_the_fingerprint_is_the_one_openssl_prints(certs: Certs) -> None:
    ours = certificate_fingerprint(certs.cert)
    assert ours == openssl_fingerprint(certs.cert).replace(":", "").lower()
    assert ManagerTrust(fingerprint=openssl_fingerprint(certs.cert)).fingerprint == ours
    assert ManagerTrust.pinned_to(certs.cert) == ManagerTrust(fingerprint=ours)
    with pytest.raises(ConfigError, match=re.escape(str(certs.key))):
        certificate_fingerprint(certs.key)  # a key, no certificate
    with pytest.raises(ConfigError, match=r"missing\.pem"):
        certificate_fingerprint(certs.ca.parent / "missing.pem")


@pytest.mark.parametrize("bad", ["", "abc", "ab" * 31, "ab" * 33, "zz" * 32, "ab" * 31 + "a-"])
def test_bad_fingerprints_are_refused_naming_the_setting(bad: str) -> None:
    with pytest.raises(ConfigError, match=f"ssl_fingerprint={re.escape(repr(bad))}"):
        ManagerTrust(fingerprint=bad)
    with pytest.raises(ConfigError, match=r"FactoryConfig\.ssl_fingerprint"):
        FactoryConfig("h", 1, ssl_fingerprint=bad)


def test_ca_files_that_are_missing_or_hold_no_certificate_are_refused(
        certs: Certs, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigError, match=f"ssl_ca='{missing}': no such file"):
        ManagerTrust(ca_file=missing)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="holds no PEM CA certificate"):
        ManagerTrust(ca_file=junk)
    with pytest.raises(ConfigError, match="ssl_ca or ssl_fingerprint"):
        ManagerTrust()
    both = ManagerTrust(certs.ca, "AB" * 32)
    assert both.worker_options() == (f"--ssl-ca={certs.ca}", f"--ssl-fingerprint={'ab' * 32}")


def test_worker_command_carries_the_checks(certs: Certs, tmp_path: Path) -> None:
    trust = ManagerTrust(certs.ca, "ab" * 32)
    cmd = worker_command(LocalWorkersConfig(workers=1), 9123, tmp_path, password_file=None,
                         ssl=False, trust=trust, binary="vine_worker")
    assert "--ssl" in cmd  # implied
    assert f"--ssl-ca={certs.ca}" in cmd and f"--ssl-fingerprint={'ab' * 32}" in cmd
    plain = worker_command(LocalWorkersConfig(workers=1), 9123, tmp_path, password_file=None,
                           ssl=True, binary="vine_worker")
    assert not [a for a in plain if a.startswith(("--ssl-ca", "--ssl-fingerprint"))]


def test_factory_config_passes_the_checks_to_workers(certs: Certs, tmp_path: Path) -> None:
    cfg = FactoryConfig("mgr.example", 9123, ssl_ca=certs.ca, ssl_fingerprint="AB:" * 31 + "AB",
                        transfer_address="127.0.0.1")
    assert cfg.ssl and cfg.ssl_fingerprint == "ab" * 32  # implied; one form
    cmd = factory_command(cfg)
    assert "--ssl" in cmd
    extra = cmd[cmd.index("--extra-options") + 1]
    assert extra == (f"--transfer-address 127.0.0.1 --ssl-ca={certs.ca.name} "
                     f"--ssl-fingerprint={'ab' * 32}")
    shipped = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--wrapper-input"]
    assert shipped == [str(certs.ca)]  # with each job, named there by its name alone
    assert "--wrapper" not in cmd
    # the factory's own status connection checks the manager too
    assert f"--ssl-ca={certs.ca}" in cmd and f"--ssl-fingerprint={'ab' * 32}" in cmd
    assert config_from_dict(config_to_dict(cfg)) == cfg  # a pool's state file
    only_pin = factory_command(FactoryConfig("m", 1, ssl_fingerprint="cd" * 32))
    assert "--ssl" in only_pin and "--wrapper-input" not in only_pin
    assert f"--ssl-fingerprint={'cd' * 32}" in only_pin
    assert FactoryConfig("m", 1).worker_options is None
    with pytest.raises(ConfigError, match=r"FactoryConfig\.ssl_ca"):
        FactoryConfig("m", 1, ssl_ca=tmp_path / "a ca.pem")  # its name goes into a shell line
    # a pool stages the CA in its scratch folder under one name, readable by the factory
    staged = stage_ca(cfg, tmp_path / "scratch")
    assert staged.ssl_ca == tmp_path / "scratch" / "trust" / CA_NAME
    assert staged.ssl_ca.read_bytes() == certs.ca.read_bytes()
    assert staged.ssl_ca.stat().st_mode & 0o777 == 0o644
    assert f"--ssl-ca={CA_NAME}" in (staged.worker_options or "")


def test_a_pool_refuses_a_missing_ca_file_before_it_starts(tmp_path: Path) -> None:
    cfg = FactoryConfig("127.0.0.1", 9123, batch="local", ssl_ca=tmp_path / "gone.pem")
    pool = LocalFactoryPool(cfg, name="t-no-ca", pool_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"pool 't-no-ca''s ssl_ca=.*gone\.pem.*no such file"):
        pool.start()
    assert not pool.running


def test_a_facility_with_tls_pins_its_pools_by_default(certs: Certs, tmp_path: Path) -> None:
    f = load_facility(facility(tmp_path, certs))
    trust = f.worker_trust()
    assert trust == ManagerTrust(fingerprint=certificate_fingerprint(certs.cert))
    cfg = f.pools[0].factory_config("127.0.0.1", 9123, ssl=True, trust=trust)
    assert cfg.ssl_fingerprint == trust.fingerprint and cfg.ssl_ca is None
    # named: the CA, the pin, or both
    f = load_facility(facility(tmp_path, certs, f'ssl_ca = "{certs.ca}"'))
    assert f.worker_trust() == ManagerTrust(ca_file=certs.ca)
    fp = openssl_fingerprint(certs.cert)
    f = load_facility(facility(tmp_path, certs, f'ssl_fingerprint = "{fp}"'))
    assert f.ssl_fingerprint == certificate_fingerprint(certs.cert)
    # without TLS, nothing to check
    plain = tmp_path / "plain.toml"
    plain.write_text("[manager]\nhost = \"127.0.0.1\"\n")
    assert load_facility(plain).worker_trust() is None


@pytest.mark.parametrize(("extra", "key", "problem"), [
    ('ssl_fingerprint = "12:34"', "manager.ssl_fingerprint", "not a SHA-256"),
    ('ssl_ca = "no-such-ca.pem"', "manager.ssl_ca", "no such file"),
])
def test_a_facility_refuses_bad_checks_naming_the_key(certs: Certs, tmp_path: Path, extra: str,
                                                      key: str, problem: str) -> None:
    with pytest.raises(FacilityError, match=rf"{re.escape(key)}: .*{problem}"):
        load_facility(facility(tmp_path, certs, extra))


def test_a_facility_refuses_checks_without_tls(certs: Certs, tmp_path: Path) -> None:
    path = tmp_path / "site.toml"
    path.write_text(f'[manager]\nssl_ca = "{certs.ca}"\n')
    with pytest.raises(FacilityError, match=r"manager\.ssl_ca: .*TLS on"):
        load_facility(path)
    path.write_text(f'[manager]\nssl_cert = "{certs.key}"\nssl_key = "{certs.key}"\n'
                    '[[pools]]\nname = "p"\n')  # a certificate that holds none: no pin
    with pytest.raises(FacilityError, match=r"manager\.ssl_cert: .*holds no PEM certificate"):
        load_facility(path)


class RecordingPool(WorkerPool):
    """Stands in for a backend in ``pool start``: keeps the config it was given."""

    started: list[FactoryConfig] = []

    def __init__(self, config: FactoryConfig, *, name: str, pool_dir: Path) -> None:
        self.config, self.name, self.pid = config, name, 4242
        self.log_path = pool_dir / "factory.log"

    def start(self, *, detach: bool = False) -> RecordingPool:
        RecordingPool.started.append(self.config)
        return self

    def status(self) -> PoolStatus:
        return PoolStatus(self.name, "local", self.config.manager, True, 0, None)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> list[FactoryConfig]:
    RecordingPool.started = []
    monkeypatch.setattr(pool_cli, "pool_class", lambda batch: RecordingPool)
    return RecordingPool.started


def pool_start(tmp_path: Path, *extra: str) -> int:
    return pool_cli.main(["pool", "start", "--batch", "local", "--workers", "1", "--rack", "A",
                          "--manager", "127.0.0.1:9123", "--pool-dir", str(tmp_path), *extra])


def test_pool_start_takes_the_checks(certs: Certs, tmp_path: Path,
                                     recording: list[FactoryConfig],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    fp = openssl_fingerprint(certs.cert)
    assert pool_start(tmp_path, "--ssl-ca", str(certs.ca), "--ssl-fingerprint", fp) == 0
    cfg = recording[-1]
    assert cfg.ssl and cfg.ssl_ca == certs.ca.resolve()
    assert cfg.ssl_fingerprint == certificate_fingerprint(certs.cert)
    assert "do not check" not in capsys.readouterr().err
    # --ssl alone: encrypted, no check, and it says so
    assert pool_start(tmp_path, "--ssl") == 0
    assert recording[-1].ssl_ca is None and recording[-1].ssl_fingerprint is None
    assert "do not check the manager's certificate" in capsys.readouterr().err
    # --facility: its manager's checks (here the default pin to its certificate)
    assert pool_start(tmp_path, "--facility", str(facility(tmp_path, certs)), "--name", "p") == 0
    assert recording[-1].ssl_fingerprint == certificate_fingerprint(certs.cert)


@pytest.mark.parametrize(("option", "value", "problem"), [
    ("--ssl-fingerprint", "12:34", "not a SHA-256"),
    ("--ssl-ca", "/no/such/ca.pem", "no such file"),
])
def test_pool_start_refuses_bad_checks_naming_the_option(
        tmp_path: Path, recording: list[FactoryConfig], capsys: pytest.CaptureFixture[str],
        option: str, value: str, problem: str) -> None:
    with pytest.raises(SystemExit) as exc:
        pool_start(tmp_path, option, value)
    assert exc.value.code == 2 and not recording
    err = capsys.readouterr().err
    assert f"argument {option}" in err and problem in err
