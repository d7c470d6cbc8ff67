"""The worker registry: free slots per worker, targets for placement decisions, lost workers."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from datavine.io.column_cache import marker_name, piece_name
from datavine.io.shards import Shard
from datavine.scheduler.labels import labels_of, rack_of
from datavine.scheduler.placement import Placement, TaskInputs, Tier, decide, score
from datavine.scheduler.racks import RackMap
from datavine.scheduler.topology import (
    ANYWHERE,
    CANDIDATES_PER_GROUP,
    Target,
    Topology,
    counted_tier,
)


def two_racks() -> Topology:
    topo = Topology(bundles_per_core=2)
    for i in range(4):
        topo.announce(f"local-{i}", rack_of(i, 4, ("a", "b")), cores=1)
    return topo


def test_features_say_the_name_and_the_rack() -> None:
    assert labels_of(["gpu", "rack:A", "worker:w-1", "rack:B"]) == ("w-1", "A")
    assert labels_of(["worker:", "rack:"]) == (None, None)
    assert labels_of([]) == (None, None)


def test_workers_are_split_into_rack_blocks() -> None:
    assert [rack_of(i, 4, ("a", "b")) for i in range(4)] == ["a", "a", "b", "b"]
    assert rack_of(5, 4, ("a", "b")) in ("a", "b")  # a replacement worker still gets a rack
    assert rack_of(0, 4, ()) is None


def test_free_slots_count_bundles_sent_to_a_worker_and_its_rack() -> None:
    topo = two_racks()
    topo.sent(Target(worker="local-0"))
    topo.sent(Target(worker="local-0"))
    topo.sent(Target(rack="b"))
    free = {v.id: v.free_slots for v in topo.views()}
    assert free == {"local-0": 0, "local-1": 2, "local-2": 1, "local-3": 1}
    topo.returned(Target(worker="local-0"))
    assert {v.id: v.free_slots for v in topo.views()}["local-0"] == 1


def test_a_bundle_for_any_worker_goes_to_the_freest_connected_named_one() -> None:
    """An idle worker before one with a call out; a rack's share of rack-wide bundles
    counts; a worker only announced (not connected) is not waited for; when every slot is
    taken there is none, and none either once a worker without a name is known (only
    TaskVine can send a bundle there)."""
    topo = two_racks()
    assert topo.freest() is None  # announced, none connected yet
    for i in range(4):
        topo.learn(f"local-{i}", None, f"10.0.0.{i}:9000", ())
    assert topo.freest() == Target(worker="local-0")  # all idle: the smallest id
    topo.sent(Target(worker="local-0"))
    topo.sent(Target(rack="a"))  # local-0 and local-1 share it: one slot each
    assert topo.freest() == Target(worker="local-2")
    for i in (2, 3, 2, 3):
        topo.sent(Target(worker=f"local-{i}"))
    assert topo.freest() == Target(worker="local-1")  # one free slot: the last one
    topo.sent(Target(worker="local-1"))
    assert topo.freest() is None  # every slot taken
    topo.returned(Target(worker="local-3"))
    assert topo.freest() == Target(worker="local-3")
    topo.learn(None, "a", "10.0.0.9:9000", ())  # a worker without a name
    assert topo.freest() is None


def test_among_equally_free_workers_the_freest_is_the_one_sent_a_bundle_longest_ago() -> None:
    """Bundles that come back as fast as they go out do not all go to the same worker (the
    smallest id): its cache would hold more of the run than the others' and end it last."""
    topo = two_racks()
    for i in range(4):
        topo.learn(f"local-{i}", None, f"10.0.0.{i}:9000", ())
    got = []
    for _ in range(8):
        target = topo.freest()
        assert target is not None
        topo.sent(target)
        topo.returned(target)
        got.append(target.worker)
    assert got == ["local-0", "local-1", "local-2", "local-3"] * 2


def test_a_rack_decision_targets_the_best_named_worker() -> None:
    topo = two_racks()
    task = TaskInputs(("f1",), {"f1": "b"})
    placement = decide(task, topo.views(), waited_s=0.0)
    assert placement.action == "run" and placement.tier == Tier.RACK
    target = topo.target(placement)
    assert target.worker in ("local-2", "local-3")
    assert target.features() == [f"worker:{target.worker}"]


def test_files_read_make_a_worker_the_cached_choice() -> None:
    topo = two_racks()
    topo.learn("local-3", "b", "127.0.0.1:9003", ["f1"])
    placement = decide(TaskInputs(("f1",), {"f1": "b"}), topo.views(), waited_s=0.0)
    assert placement.tier == Tier.CACHED and topo.target(placement) == Target(worker="local-3")


def test_unnamed_pool_workers_are_targeted_through_their_rack() -> None:
    topo = Topology()
    known = topo.learn(None, "b", "10.0.0.7:9123", ["f1"])
    assert known is not None and known.id == "10.0.0.7:9123" and not known.named
    placement = decide(TaskInputs(("f1",), {"f1": "b"}), topo.views(), waited_s=0.0)
    assert topo.target(placement) == Target(rack="b")
    assert topo.target(Placement("run", Tier.FAR)) == ANYWHERE
    assert ANYWHERE.features() == []


def test_workers_that_left_are_forgotten() -> None:
    topo = two_racks()
    topo.learn("local-1", "a", "127.0.0.1:9001")
    topo.learn("local-2", "b", "127.0.0.1:9002")
    assert topo.forget_missing({"127.0.0.1:9002"}) == ["local-1"]
    assert "local-1" not in topo.workers and "local-0" in topo.workers  # no address yet: kept


# --- workers learned at connect, from TaskVine's list of workers ----------------------------
def entry(addrport: str, hostname: str, cores: int = 1,
          features: list[str] | None = None) -> dict[str, Any]:
    """An entry of ``Manager.status("workers")``; ``features`` only from a TaskVine that
    lists them (datavine's build)."""
    out: dict[str, Any] = {"hostname": hostname, "addrport": addrport, "cores_total": cores,
                           "ncpus": cores}
    if features is not None:
        out["features"] = features
    return out


BOX_RACKS = RackMap.of({"A": ["a*.box"], "B": ["198.18.12.*"]})


def test_a_worker_that_says_its_name_and_rack_is_known_at_connect() -> None:
    topo = Topology(racks=BOX_RACKS, here="mgr.box")
    assert topo.see([entry("198.18.11.11:40001", "a1.box", 2,
                           ["worker:rack-a-7.0", "rack:B", "gpu"])]) == 0
    known = topo.workers["rack-a-7.0"]
    assert (known.named, known.rack, known.host, known.cores) == (True, "B", "a1.box", 2)
    assert known.addrport == "198.18.11.11:40001"  # its own rack wins over the map


def test_without_features_the_map_names_the_rack_by_host_or_address() -> None:
    topo = Topology(racks=BOX_RACKS, here="mgr.box")
    topo.see([entry("198.18.11.11:40001", "A1.box."), entry("198.18.12.11:40002", "b1"),
              entry("198.18.0.2:40003", "mgr.box")])
    assert {w.id: (w.rack, w.host, w.named) for w in topo.workers.values()} == {
        "198.18.11.11:40001": ("A", "a1.box", False),
        "198.18.12.11:40002": ("B", "b1", False),
        "198.18.0.2:40003": (None, "mgr.box", False)}
    # without a map and without features: host only; the rack comes with the first result
    bare = Topology(here="mgr.box")
    bare.see([entry("198.18.11.11:40001", "a1.box")])
    known = bare.learn(None, "A", "198.18.11.11:40001", ["/f"])
    assert known is not None and (known.rack, known.host) == ("A", "a1.box")
    assert list(bare.workers) == ["198.18.11.11:40001"]


def test_an_incomplete_entry_is_learned_and_looked_at_again() -> None:
    topo = Topology(racks=BOX_RACKS, here="mgr.box")
    # hello seen, features and resources not yet: host and mapped rack now, the rest later
    assert topo.see([entry("198.18.11.12:40001", "a2.box", cores=0, features=[])]) == 1
    assert topo.workers["198.18.11.12:40001"].rack == "A"
    assert topo.see([entry("198.18.11.12:40001", "a2.box", 4, ["worker:w-a2"])]) == 0
    assert list(topo.workers) == ["w-a2"]  # the address entry took the worker's name
    w = topo.workers["w-a2"]
    assert (w.named, w.rack, w.host, w.cores) == (True, "A", "a2.box", 4)
    assert topo.see([entry("198.18.11.12:40001", "a2.box", 4, ["worker:w-a2"])]) == 0


def test_an_address_entry_and_a_named_result_are_one_worker() -> None:
    topo = Topology(here="mgr.box")
    topo.announce("pool-1.0", "A", 1)  # named by the pool, not connected yet
    topo.see([entry("198.18.11.11:40001", "a1.box")])  # an unpatched TaskVine: no features
    assert len(topo.workers) == 2
    topo.learn("pool-1.0", "A", "198.18.11.11:40001", ["/f"], host="a1.box")
    assert list(topo.workers) == ["pool-1.0"]
    w = topo.workers["pool-1.0"]
    assert (w.host, w.addrport, w.files_read) == ("a1.box", "198.18.11.11:40001", {"/f"})
    topo.see([entry("198.18.11.11:40001", "a1.box")])  # seen again (listed again): no copy
    assert list(topo.workers) == ["pool-1.0"]
    assert topo.forget_missing(set()) == ["pool-1.0"] and not topo.workers


def test_a_worker_connected_over_loopback_is_on_this_host() -> None:
    topo = Topology(here="Mgr.Box")
    topo.see([entry("127.0.0.1:9001", "laptop.local", features=["worker:local-0", "rack:A"])])
    assert topo.workers["local-0"].host == "mgr.box"
    assert topo.shard_host(Shard("root://localhost:1094", "A")) == "mgr.box"


def test_a_shard_given_by_address_is_on_the_host_that_connected_from_it() -> None:
    topo = Topology(here="mgr.box")
    shard = Shard("root://198.18.11.11:1094", "A")
    assert topo.shard_host(shard) == "198.18.11.11"
    topo.see([entry("198.18.11.11:40001", "a1.box", features=["worker:w1", "rack:A"])])
    assert topo.shard_host(shard) == "a1.box"
    task = TaskInputs(("/f",), {"/f": "A"}, {"/f": topo.shard_host(shard)})
    placement = decide(task, topo.near(task), waited_s=0.0)
    assert placement.tier == Tier.HOST and topo.target(placement) == Target(worker="w1")
    assert counted_tier(placement, topo.target(placement)) == "host"


def test_counted_tiers() -> None:
    host = Placement("run", Tier.HOST, workers=("x",), rack="A")
    assert counted_tier(host, Target(worker="x")) == "host"
    assert counted_tier(host, Target(rack="A")) == "rack"  # any worker of the rack runs it
    assert counted_tier(Placement("run", Tier.CACHED, ("x",)), ANYWHERE) == "anywhere"
    assert counted_tier(Placement("run", Tier.RACK, ("x",), "A"), Target(rack="A")) == "rack"


def test_a_worker_no_feature_can_reach_is_not_a_candidate() -> None:
    topo = Topology(here="mgr.box")
    topo.announce("local-0", "A", 1)  # named, not linked to its address yet
    topo.see([entry("127.0.0.1:9001", "mgr.box")])  # it, through an unpatched TaskVine
    task = TaskInputs(("/f",), {"/f": "A"}, {"/f": "mgr.box"})
    assert [v.id for v in topo.near(task)] == ["local-0"]  # the address entry: no name, rack
    placement = decide(task, topo.near(task), waited_s=0.0)
    assert topo.target(placement) == Target(worker="local-0")


def test_entries_without_an_address_are_skipped() -> None:
    topo = Topology()
    assert topo.see([{"hostname": "a1.box"}, "junk", {"addrport": ""}]) == 0  # type: ignore[list-item]
    assert not topo.workers


# --- decisions score only the workers that can be near -------------------------------------
NAMES = [f"w{i}" for i in range(10)]
FILES = [f"/f{i}" for i in range(5)]
worker_st = st.tuples(st.sampled_from(NAMES), st.sampled_from(["A", "B", None]),
                      st.sampled_from(["h1", "h2", "h3"]), st.integers(1, 3),
                      st.frozensets(st.sampled_from(FILES), max_size=2))
task_st = st.lists(st.tuples(st.sampled_from(FILES), st.sampled_from(["A", "B", None]),
                             st.sampled_from(["h1", "h2", "h3", None])),
                   min_size=1, max_size=3, unique_by=lambda t: t[0])


@settings(max_examples=200, deadline=None)
@given(workers=st.lists(worker_st, max_size=8, unique_by=lambda w: w[0]), files=task_st,
       sent=st.lists(st.sampled_from([*NAMES, "A", "B"]), max_size=6),
       waited=st.floats(0, 8))
def test_deciding_on_the_near_workers_is_deciding_on_all(
        workers: list[tuple[str, str | None, str, int, frozenset[str]]],
        files: list[tuple[str, str | None, str | None]], sent: list[str],
        waited: float) -> None:
    topo = Topology(bundles_per_core=1, here="mgr.box")
    for name, rack, host, cores, read in workers:
        topo.see([entry(f"10.0.0.{NAMES.index(name)}:9000", host, cores,
                        [f"worker:{name}"] + ([f"rack:{rack}"] if rack else []))])
        topo.learn(name, rack, None, read)
    for s in sent:
        topo.sent(Target(worker=s) if s.startswith("w") else Target(rack=s))
    task = TaskInputs(tuple(f for f, _, _ in files), {f: r for f, r, _ in files},
                      {f: h for f, _, h in files})
    near = topo.near(task)
    every = topo.views()  # every worker here is named: each can be targeted
    assert {v.id for v in near} <= {v.id for v in every}
    assert all(score(task, v).tier == Tier.FAR for v in every if v not in near)
    on_near, on_all = decide(task, near, waited), decide(task, every, waited)
    assert (on_near.action, on_near.tier, on_near.workers, on_near.rack) == (
        on_all.action, on_all.tier, on_all.workers, on_all.rack)


# A crowd: more workers per rack and host than a decision is shown, named or not (those
# without a name are targeted through their rack; those with neither are not candidates).
crowd_st = st.lists(st.tuples(st.booleans(), st.sampled_from(["A", "B", None]),
                              st.sampled_from(["h1", "h2", "h3"]), st.integers(1, 2),
                              st.frozensets(st.sampled_from(FILES), max_size=2)),
                    max_size=20)


@settings(max_examples=300, deadline=None)
@given(workers=crowd_st, files=task_st,
       sent=st.lists(st.tuples(st.integers(0, 19) | st.integers(0, 3), st.booleans()),
                     max_size=40),
       back=st.lists(st.integers(0, 39), max_size=8), waited=st.floats(0, 8))
def test_deciding_on_the_candidates_is_deciding_on_every_near_worker(
        workers: list[tuple[bool, str | None, str, int, frozenset[str]]],
        files: list[tuple[str, str | None, str | None]], sent: list[tuple[int, bool]],
        back: list[int], waited: float) -> None:
    """The indexed choice (a few candidates per group of alike workers) is the exhaustive
    one: same action, tier, rack, wait and reason, the same first workers (the rest a
    subsequence of them), the same TaskVine target."""
    topo = Topology(bundles_per_core=1, here="mgr.box")
    ids = []
    for i, (named, rack, host, cores, read) in enumerate(workers):
        addr = f"10.0.0.{i}:9000"
        features = ([f"worker:n{i}"] if named else []) + ([f"rack:{rack}"] if rack else [])
        topo.see([entry(addr, host, cores, features)])
        known = topo.learn(f"n{i}" if named else None, rack, addr, read)
        assert known is not None
        ids.append(known)
    targets = [Target(worker=ids[i].id) if to_worker and ids[i].named else
               Target(rack=ids[i].rack) for i, to_worker in sent if i < len(ids)]
    for target in targets:
        topo.sent(target)
    for j in back:  # some came back
        if j < len(targets):
            topo.returned(targets[j])
    task = TaskInputs(tuple(f for f, _, _ in files), {f: r for f, r, _ in files},
                      {f: h for f, _, h in files})
    near, candidates = topo.near(task), topo.candidates(task)
    assert {v.id for v in candidates} <= {v.id for v in near}
    full, fast = decide(task, near, waited), decide(task, candidates, waited)
    assert (fast.action, fast.tier, fast.rack, fast.retry_after_s, fast.reason) == (
        full.action, full.tier, full.rack, full.retry_after_s, full.reason)
    first = min(len(full.workers), CANDIDATES_PER_GROUP)
    assert fast.workers[:first] == full.workers[:first]
    rest = iter(full.workers)
    assert all(w in rest for w in fast.workers)  # a subsequence, best first
    assert topo.target(fast) == topo.target(full)


def test_the_best_named_worker_is_a_candidate_behind_unnamed_ones() -> None:
    """A rack decision targets its best named worker; unnamed pool workers that rank
    before it (their addresses sort first) do not hide it."""
    topo = Topology(bundles_per_core=1, here="mgr.box")
    for i in range(CANDIDATES_PER_GROUP + 2):
        topo.learn(None, "A", f"10.0.0.{i}:9000", host=f"a{i}.box")
    topo.announce("w-a", "A", 1, host="a9.box")
    task = TaskInputs(("/f",), {"/f": "A"})
    full, fast = decide(task, topo.near(task), 0.0), decide(task, topo.candidates(task), 0.0)
    assert full.workers[-1] == "w-a" and len(fast.workers) < len(full.workers)
    assert topo.target(fast) == topo.target(full) == Target(worker="w-a")


def test_a_busy_group_still_says_its_tier_is_worth_waiting_for() -> None:
    topo = Topology(bundles_per_core=1, here="mgr.box")
    topo.announce("w-a", "A", 1)
    topo.announce("w-b", "B", 1)
    topo.sent(Target(worker="w-a"))
    task = TaskInputs(("/f",), {"/f": "A"})
    assert [v.id for v in topo.candidates(task)] == ["w-a"]  # busy, but there
    assert decide(task, topo.candidates(task), 0.0).action == "hold"
    assert not topo.has_room(("rack", "A")) and topo.has_room(("rack", "B"))
    topo.returned(Target(worker="w-a"))
    assert topo.has_room(("rack", "A"))
    assert topo.gains.since(0) is not None and ("rack", "A") in (topo.gains.since(0) or [])


def test_a_worker_that_left_is_named_once() -> None:
    topo = Topology(here="mgr.box")
    topo.announce("w-a1", "A", 1)
    topo.learn("w-a1", "A", "198.18.11.11:4000")
    assert topo.forget_missing(set()) == ["w-a1"]
    # the run reports the name, whether it learned of the departure by name or by address
    assert {"w-a1"} | {topo.who_left("198.18.11.11:4000")} == {"w-a1"}
    assert topo.who_left("198.18.11.11:4000") == "198.18.11.11:4000"  # reported already


def test_a_piece_sent_to_a_worker_counts_as_held_there_until_its_result_says_otherwise(
) -> None:
    topo = two_racks()
    piece = piece_name("/store/f.root", 0, 100)
    task = TaskInputs(("/store/f.root",), {"/store/f.root": "b"}, pieces=(piece,))
    assert topo.holder([piece]) is None
    expected = topo.expect("local-3", [piece])
    assert set(expected) == {piece, "/store/f.root", marker_name("/store/f.root")}
    # the next copy of the piece goes to the worker that will hold it, before any result:
    # the planner groups it for that worker, and placement finds that worker among the
    # file's candidates (it had read nothing of the file before)
    assert topo.holder([piece]) == "local-3"
    assert "local-3" in {v.id for v in topo.candidates(task)}
    placement = decide(task, topo.candidates(task), waited_s=0.0)
    assert placement.tier == Tier.CACHED and placement.workers == ("local-3",)
    assert topo.expect("local-3", [piece]) == ()  # counted once: a second copy adds nothing
    # its result says the cache holds it: it stays
    topo.expected_back("local-3", expected, [{"lfn": n} for n in expected])
    assert topo.holder([piece]) == "local-3"


def test_a_piece_whose_call_failed_or_was_not_kept_stops_counting_as_held() -> None:
    topo = two_racks()
    kept, refused = piece_name("/store/f.root", 0, 100), piece_name("/store/f.root", 100, 200)
    first = topo.expect("local-0", [kept])
    topo.expected_back("local-0", first, [{"lfn": n} for n in first])
    second = topo.expect("local-0", [refused])
    assert second == (refused,)  # the file and its marker held before: not the call's to take
    topo.expected_back("local-0", second, [])  # failed, or its cache did not keep the piece
    assert topo.holder([refused]) is None and topo.holder([kept]) == "local-0"
    # a worker the registry does not know is expected to hold nothing
    assert topo.expect("gone", [kept]) == ()
