"""Network faults found during a run, and what the run does about them (pure).

TaskVine ships a file a worker needs from a peer that already holds it (the packed
environment, values kept on workers, and by its default the library's own files). A worker
that cannot reach that peer (a firewall that drops: racks cut from each other) waits for
TCP's connect timeout, about 130 s, with its library "sent" and never started, and every
call TaskVine gives it waits too. Nothing in TaskVine says so.

:class:`NetworkWatch` is told, about once a second, each connected worker's library state
(:class:`LibraryState`, from TaskVine's transactions log) and, with each result, the worker's
reads. It decides:

- a worker whose library has not started within ``RunConfig.library_start_timeout_s`` of
  being sent is **dropped**: its host is blocked (unless a worker with a running library
  shares it), the calls waiting on it are re-sent to other workers, and it is taken back
  once its library starts or ends (TaskVine then sends a new one);
- peer transfers are turned **off** after the first such worker (every file then comes
  from the manager, so the dropped worker's next library starts), once no value is kept on
  a worker (those can only travel from peer to peer; none is kept from then on);
- a worker whose reads from a shard failed over ``shard_failures`` times, with none served
  by that shard, **cannot reach** it: said, its reads keep failing over.

Each decision is a :class:`Finding` (which worker, what failed, what was done) for the run
summary and the log. The watch lives in :class:`datavine.scheduler.learned.Learned`: what
it blocked and turned off stays so in the manager across runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datavine.scheduler.summary import network_line

LIBRARY_SENT = "sent"  # the worker was sent the library; its files are on their way
LIBRARY_STARTED = "started"
LIBRARY_ENDED = "ended"  # the instance exited or was removed (TaskVine may send another)
ALL_WORKERS = "all workers"


@dataclass(frozen=True)
class LibraryState:
    """One worker's library instance as TaskVine's log tells it: ``state`` (sent, started,
    ended), ``since`` (the run's clock when it got there) and the worker's host name."""

    state: str
    since: float
    host: str = ""


@dataclass(frozen=True)
class Finding:
    """A network fault and the run's answer: ``worker`` (datavine name or TaskVine address,
    or :data:`ALL_WORKERS`), its ``host``, what ``failed``, what was ``done``, and when
    (``at_s``, seconds since the run started)."""

    worker: str
    host: str
    failed: str
    done: str
    at_s: float

    def line(self) -> str:
        return network_line(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "host": self.host, "failed": self.failed,
                "done": self.done, "at_s": self.at_s}


@dataclass(frozen=True)
class NetworkActions:
    """What one look decided: addresses whose calls run elsewhere now (``stalled``), hosts
    to block and unblock, whether to turn peer transfers off, and what to say."""

    stalled: frozenset[str] = frozenset()
    block: tuple[str, ...] = ()
    unblock: tuple[str, ...] = ()
    peers_off: bool = False
    findings: tuple[Finding, ...] = ()

    @property
    def for_runtime(self) -> bool:
        """Whether TaskVine is to be changed (a host blocked or unblocked, peers off)."""
        return bool(self.block or self.unblock or self.peers_off)


def overdue(libraries: Mapping[str, LibraryState], now: float, bound_s: float) -> set[str]:
    """Addresses of workers whose library was sent more than ``bound_s`` ago and has not
    started (pure)."""
    return {addr for addr, lib in libraries.items()
            if lib.state == LIBRARY_SENT and now - lib.since > bound_s}


@dataclass
class NetworkWatch:
    """Workers dropped for the network, whether peer transfers are off, shards not reached.

    ``dropped``: address -> host of each worker taken out of the run (its host blocked, or
    ``""`` when it shares the host with a healthy worker and only its calls were moved);
    ``leaving_peers``: a worker was dropped and peer transfers go off as soon as no value is
    kept on a worker (no new value is kept meanwhile); ``peers_off``: they are off."""

    shard_failures: int = 2
    dropped: dict[str, str] = field(default_factory=dict)
    leaving_peers: bool = False
    peers_off: bool = False
    failed_reads: Counter[tuple[str, str]] = field(default_factory=Counter)
    served: set[tuple[str, str]] = field(default_factory=set)
    unreachable: set[tuple[str, str]] = field(default_factory=set)
    # dropped workers taken out of placement: address -> (worker id, rack) (RunState's)
    out_of_placement: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    # the libraries' mapping last seen all started (held, so that its id is not reused)
    _all_started: Mapping[str, LibraryState] | None = field(default=None, repr=False)

    @property
    def keep_on_workers(self) -> bool:
        """Whether new values may stay on workers (they travel only between peers)."""
        return not (self.leaving_peers or self.peers_off)

    def quiet(self, libraries: Mapping[str, LibraryState]) -> bool:
        """Whether a look at ``libraries`` (:meth:`libraries`) would find nothing to do: the
        same mapping as a look that saw every library started (a runtime hands the same one
        until a library changes), no worker dropped, peer transfers not going off. A look a
        second over every library, for nothing, was a fifth of an idle manager's CPU at 256
        workers."""
        if self.dropped or self.leaving_peers or self.out_of_placement:
            return False
        if libraries is self._all_started:
            return True
        if all(lib.state == LIBRARY_STARTED for lib in libraries.values()):
            self._all_started = libraries
        return False

    def libraries(self, libraries: Mapping[str, LibraryState], now: float, bound_s: float,
                  names: Mapping[str, str], values_kept: int, start: float = 0.0,
                  calls_on: Mapping[str, int] | None = None) -> NetworkActions:
        """One look at the workers' libraries (``names``: address -> datavine name;
        ``values_kept``: values on workers now; ``calls_on``: calls each address holds)."""
        late = overdue(libraries, now, bound_s)
        at = round(now - start, 1)
        healthy_hosts = {lib.host for addr, lib in libraries.items()
                         if lib.state == LIBRARY_STARTED and lib.host}
        blocked_hosts = {h for h in self.dropped.values() if h}
        block: list[str] = []
        findings: list[Finding] = []
        for addr in sorted(late - self.dropped.keys()):
            lib = libraries[addr]
            host = lib.host if lib.host and lib.host not in healthy_hosts else ""
            if host and host not in blocked_hosts:
                block.append(host)
                blocked_hosts.add(host)
            self.dropped[addr] = host
            moved = (calls_on or {}).get(addr, 0)
            findings.append(Finding(
                names.get(addr, addr), lib.host or addr,
                f"its library did not start within {bound_s:.0f} s of being sent "
                "(RunConfig.library_start_timeout_s): its files come from a peer it "
                "cannot reach, or too slowly",
                ("dropped: its host blocked" if host else
                 "not blocked (a worker with a running library shares its host)")
                + f", {moved} call(s) re-sent to other workers", at))
        unblock: list[str] = []
        for addr in sorted(self.dropped.keys() - late):
            host = self.dropped.pop(addr)
            now_lib = libraries.get(addr)
            if host and host not in self.dropped.values():
                unblock.append(host)
            back = ("its library started" if now_lib is not None
                    and now_lib.state == LIBRARY_STARTED
                    else "it left" if now_lib is None else "its library ended")
            findings.append(Finding(names.get(addr, addr), host or addr, back,
                                    "taken back into the run" if now_lib is not None
                                    else "forgotten", at))
        peers_off = False
        if late and not self.peers_off:
            self.leaving_peers = True
        if self.leaving_peers and not self.peers_off and values_kept == 0:
            self.peers_off, self.leaving_peers, peers_off = True, False, True
            findings.append(Finding(
                ALL_WORKERS, "", "a worker could not start its library from peers' files",
                "peer transfers off: every file now comes from the manager, and values "
                "come back to it instead of staying on workers", at))
        return NetworkActions(frozenset(late), tuple(block), tuple(unblock), peers_off,
                              tuple(findings))

    def reads(self, worker: str, host: str, records: Iterable[Mapping[str, Any]],
              now: float, start: float = 0.0) -> list[Finding]:
        """A bundle's read records (:class:`datavine.io.reading.ReadRecord` as dicts) on
        ``worker``: shards it failed to read from, every time, ``shard_failures`` times."""
        findings = []
        for record in records:
            served = str(record.get("server"))
            self.served.add((worker, served))
            for server, error in record.get("errors", ()):
                pair = (worker, str(server))
                self.failed_reads[pair] += 1
                if (pair not in self.unreachable and pair not in self.served
                        and self.failed_reads[pair] >= self.shard_failures):
                    self.unreachable.add(pair)
                    findings.append(Finding(
                        worker, host,
                        f"cannot reach {server}: {self.failed_reads[pair]} reads failed over "
                        f"(last: {error})",
                        f"its reads go to the next shard or the origin ({served} served "
                        "this one)", round(now - start, 1)))
        return findings
