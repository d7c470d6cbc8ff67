"""Facility files: the example loads into datavine's configuration objects, every bad key or
value is an error naming the file and the key, and ``datavine run --facility`` runs on the
facility's local workers or on a pool it starts (a real local vine_factory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datavine.apps import cli
from datavine.config import ConfigError
from datavine.deploy.facility import FacilityError, load_facility
from datavine.deploy.pools.factory import rack_feature
from datavine.io.datagen import generate_dataset

EXAMPLE = Path(__file__).resolve().parents[1] / "manager" / "facility.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_example_loads_into_configuration_objects() -> None:
    f = load_facility(EXAMPLE, check_files=False)
    assert f.manager.port == 9123 and f.manager_host == "manager.example.org"
    assert f.manager.ssl == ("/etc/datavine/manager.key", "/etc/datavine/manager.crt")
    assert f.manager.password_file == Path("/etc/datavine/vine.password")
    assert f.run.timeout_s == 7200 and f.run.progress is True
    assert f.shards is not None and len(f.shards) == 4
    assert [s.rack for s in f.shards.shards] == ["A", "A", "B", "B"]
    assert f.shards.origin is not None and f.shards.origin.url.startswith("root://origin")
    assert f.export_root == Path("/data/xrootd")
    assert [p.name for p in f.pools] == ["rack-a", "rack-b"]
    assert f.prestarted_workers == 16
    cfg = f.pools[0].factory_config(f.manager_host, 9123, f.manager.password_file, ssl=True)
    assert cfg.manager == "manager.example.org:9123" and cfg.ssl and cfg.min_workers == 8
    assert rack_feature("A") in cfg.all_features
    assert cfg.extra_condor_submit == ('+AccountingGroup = "group_analysis"',)
    assert f.memory.per_category == {"agc-chunk": 1536.0} and f.memory.ceiling_mb == 8192
    assert f.placement.max_wait_s == 5.0 and f.placement.cache_wait_s == 1.0
    assert f.local_workers is None
    assert f.racks is not None and f.racks.names == ("A", "B")
    assert f.racks.rack_for("wn-b17.example.org") == "B"
    assert f.racks.rack_for("xcache-0.example.org") == f.racks.rack_for("10.1.1.5") == "A"
    # the run settings carry the policies, the shards and the racks to the runtime
    assert f.run.memory == f.memory and f.run.placement == f.placement
    assert f.run.shardmap is f.shards and f.run.racks is f.racks


def test_racks_map_hosts_and_give_shards_without_a_rack_theirs(tmp_path: Path) -> None:
    f = load_facility(write(tmp_path, """
[racks]
A = ["a*.box", "198.18.11.0/24"]
B = ["b*.box"]
[xcache]
origin = "root://mgr.box:1094"
[[xcache.shards]]
url = "root://a1.box:1094"
[[xcache.shards]]
url = "root://B1.BOX:1094"
[[xcache.shards]]
url = "root://198.18.11.12:1094"
[[xcache.shards]]
url = "root://c1.box:1094"
rack = "C"
[[xcache.shards]]
url = "root://d1.box:1094"
"""))
    assert f.shards is not None and f.racks is not None
    assert [s.rack for s in f.shards.shards] == ["A", "B", "A", "C", None]
    assert f.shards.origin is not None and f.shards.origin.url == "root://mgr.box:1094"
    assert f.run.racks is f.racks and f.run.shardmap is f.shards
    assert load_facility(write(tmp_path, "")).racks is None


def test_policies_can_be_switched_off_and_racks_given(tmp_path: Path) -> None:
    f = load_facility(write(tmp_path, """
[memory]
enabled = false
[placement]
enabled = false
[local_workers]
workers = 4
racks = ["A", "B"]
"""))
    assert f.memory is None and f.run.memory is None
    assert f.placement is None and f.run.placement is None
    assert f.local_workers is not None and f.local_workers.racks == ("A", "B")


def test_example_names_missing_files_when_checked() -> None:
    with pytest.raises(FacilityError, match=r"manager\.password_file.*does not exist") as err:
        load_facility(EXAMPLE)
    assert str(EXAMPLE) in str(err.value)


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    f = load_facility(write(tmp_path, ""))
    assert f.manager.port == 0 and f.shards is None and f.pools == ()
    assert f.prestarted_workers == 0


def test_relative_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("secret")
    (tmp_path / "export").mkdir()
    f = load_facility(write(tmp_path, """
[manager]
password_file = "pw"
run_dir = "state"
[xcache]
origin = "root://o:1094"
export_root = "export"
[[xcache.shards]]
url = "root://s:1094"
"""))
    assert f.manager.password_file == tmp_path / "pw"
    assert Path(f.manager.run_dir) == tmp_path / "state"
    assert f.export_root == tmp_path / "export"
    assert f.shards is not None and f.shards.shards[0].name == "root://s:1094"


BAD = [
    ("[managr]\nport = 1\n", "managr", "unknown section"),
    ("[manager]\nprot = 1\n", "manager.prot", "unknown key"),
    ("[manager]\nport = true\n", "manager.port", "integer"),
    ("[manager]\nport = 70000\n", "manager", "port"),
    ('[manager]\nssl_key = "k.pem"\n', "manager", "ssl_cert"),
    ("[manager]\nworkers_timeout_s = 0\n", "manager.workers_timeout_s", "> 0"),
    ('[run]\nmax_retries = "3"\n', "run.max_retries", "integer"),
    ("[run]\nbundles_per_slot = 0\n", "run", "bundles_per_slot"),
    ("[run]\nprogress = 1\n", "run.progress", "true or false"),
    ("[memory]\nfloor_mb = 4096\nceiling_mb = 1024\n", "memory", "floor_mb"),
    ('[memory.per_category]\nx = "big"\n', "memory.per_category.x", "number"),
    ("[placement]\nmax_wait_s = -1\n", "placement", "waits"),
    ('[memory]\nenabled = "no"\n', "memory.enabled", "true or false"),
    ("[run]\nmax_library_failures = 0\n", "run", "max_library_failures"),
    ('[xcache]\norigin = "root://o:1"\n', "xcache.shards", "at least one"),
    ('[[xcache.shards]]\nrack = "A"\n', "xcache.shards[0].url", "missing"),
    ('[[xcache.shards]]\nurl = "ftp://s"\n', "xcache.shards[0].url", "root://"),
    ('[[xcache.shards]]\nurl = "root://s:1"\ncolour = "red"\n', "xcache.shards[0].colour",
     "unknown key"),
    ('[[xcache.shards]]\nurl = "root://a:1"\nname = "n"\n[[xcache.shards]]\n'
     'url = "root://b:1"\nname = "n"\n', "xcache", "unique"),
    ("[[pools]]\nworkers = 2\n", "pools[0].name", "missing"),
    ('[[pools]]\nname = "p"\nbatch = "slurm"\n', "pools[0] (p)", "batch"),
    ('[[pools]]\nname = "p"\nworkers = 2\nmin_workers = 3\n', "pools[0] (p)", "min_workers"),
    ('[[pools]]\nname = "p"\nfeatures = "gpu"\n', "pools[0].features", "list"),
    ('[[pools]]\nname = "p"\n[[pools]]\nname = "p"\n', "pools", "unique"),
    ('[[pools]]\nname = "p"\nbatch = "local"\ncondor_submit = ["x = 1"]\n', "pools[0] (p)",
     "condor"),
    ("[local_workers]\ncores = 0\n", "local_workers", "cores"),
    ('racks = ["a1"]\n', "racks", "table of racks"),
    ('[racks]\nA = "a*.box"\n', "racks.A", "list of strings"),
    ('[racks]\nA = ["a 1.box"]\n', "racks.A", "without spaces"),
    ('[racks]\nA = ["10.0.0.0/99"]\n', "racks.A", "not an address network"),
    ('[racks]\nA = ["a1.box"]\nB = ["a1.box"]\n', "racks", "in racks 'A' and 'B'"),
    ("[manager\nport = 1\n", "(file)", "not valid TOML"),
    ('[metrics]\nlisten = "0.0.0.0:http"\n', "metrics.listen", "expected PORT or ADDRESS:PORT"),
    ('[metrics]\nport = 9464\n', "metrics", "port"),
]


@pytest.mark.parametrize(("text", "key", "problem"), BAD, ids=[b[1] + "-" + b[2] for b in BAD])
def test_bad_keys_and_values_name_the_file_and_key(tmp_path: Path, text: str, key: str,
                                                   problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(FacilityError) as err:
        load_facility(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {key}")
    assert problem in message
    assert isinstance(err.value, ConfigError)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FacilityError, match=r"nope\.toml"):
        load_facility(tmp_path / "nope.toml")


def test_missing_export_root_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, '[xcache]\nexport_root = "gone"\n[[xcache.shards]]\n'
                           'url = "root://s:1"\n')
    with pytest.raises(FacilityError, match=r"xcache\.export_root.*gone"):
        load_facility(path)


# --- datavine run --facility, for real ---------------------------------------------------------
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("facility-data")
    generate_dataset(folder, 1, 20_000)
    return folder


def run_with(facility: Path, data_dir: Path, tmp_path: Path) -> dict:
    record = tmp_path / "record.json"
    code = cli.main(["run", "--facility", str(facility), "--data", str(data_dir), "--files",
                     "1", "--events", "20000", "--chunk-events", "10000", "--no-xcache",
                     "--no-progress", "--json", str(record)])
    assert code == 0
    return json.loads(record.read_text())


@pytest.mark.taskvine
def test_run_on_the_facilitys_local_workers(data_dir: Path, tmp_path: Path) -> None:
    facility = write(tmp_path, """
[manager]
run_dir = "manager"
[run]
no_worker_timeout_s = 30
timeout_s = 120
[local_workers]
workers = 2
""")
    data = run_with(facility, data_dir, tmp_path)
    assert data["events"] == 20_000 and data["chunks"] == 2
    assert data["cluster"]["kind"] == "2 local worker(s)" and data["cluster"]["workers"] == 2
    assert (tmp_path / "manager" / "vine.password").exists()  # made in the facility's run_dir


@pytest.mark.taskvine
def test_run_on_a_pool_the_facility_starts(data_dir: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pools = tmp_path / "pools"
    monkeypatch.setenv("DATAVINE_POOL_DIR", str(pools))
    facility = write(tmp_path, """
[manager]
run_dir = "manager"
workers_timeout_s = 60
[run]
no_worker_timeout_s = 30
timeout_s = 120
[[pools]]
name = "test-local"
batch = "local"
workers = 2
idle_timeout_s = 60
factory_period_s = 1
""")
    data = run_with(facility, data_dir, tmp_path)
    assert data["events"] == 20_000
    assert data["cluster"]["kind"] == "pools test-local" and data["cluster"]["workers"] == 2
    assert not (pools / "test-local.json").exists(), "the pool is stopped after the run"


def test_debug_log_is_off_unless_the_facility_asks(tmp_path: Path) -> None:
    assert load_facility(write(tmp_path, "[manager]\nhost = '127.0.0.1'\n"),
                         check_files=False).manager.debug_log is False
    on = load_facility(write(tmp_path, "[manager]\ndebug_log = true\n"), check_files=False)
    assert on.manager.debug_log is True
    with pytest.raises(FacilityError, match="debug_log"):
        load_facility(write(tmp_path, "[manager]\ndebug_log = 'yes'\n"), check_files=False)


def test_a_facility_asks_for_the_managers_metrics_listener(tmp_path: Path) -> None:
    from datavine.deploy.facility import FacilityCluster

    assert load_facility(write(tmp_path, "")).metrics_listen is None
    f = load_facility(write(tmp_path, '[metrics]\nlisten = "0.0.0.0:9464"\n'))
    assert f.metrics_listen == ("0.0.0.0", 9464)
    cluster = FacilityCluster(f)  # not started: its settings only
    assert cluster.metrics_config is not None
    assert (cluster.metrics_config.address, cluster.metrics_config.port) == ("0.0.0.0", 9464)
    assert cluster.metrics_config.needs_token  # off loopback: a scrape needs the token
