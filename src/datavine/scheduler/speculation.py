"""Pure decisions for backup copies: which calls out get a second copy now, and where.

When a run has nothing more to send and a core is idle, two kinds of call out are worth a
copy on that core:

- **queued**: the call waits in its worker's library behind another call (the library takes
  ``RunConfig.bundles_per_slot`` calls per core, so the next starts as one ends: TaskVine
  patch 0015). At a pass's end the other workers would idle while it waits: a tail;
- **late**: the call has run ``late_factor`` times its expected time (its tasks' categories'
  measured times), plus ``late_slack_s``: a straggler (a throttled or overloaded node, a
  failing disk, a slow shard);
- **outrun**: the call runs on a worker whose *pace* (its bundles' run time over their
  expected time, :class:`WorkerPace`) says it will end later than a copy started now on an
  idle worker, by more than ``late_slack_s``: as the LATE scheduler estimates each task's
  time left from its node's progress rate. A worker at a quarter of a core is caught
  while its call runs, not after ``late_factor`` expected times; a call on a worker of the
  common pace is never copied this way (a copy would end after it).

As MapReduce's backup tasks and Spark's speculation, the copy runs on another worker (it reads
through the next shard in line: :attr:`datavine.protocol.BundleSpec.avoid`), the first result
wins and the other copy is cancelled (:mod:`datavine.scheduler.run_state` does that; with
patch 0015 a cancelled call is skipped or stopped in its library). A call gets one copy at
most; calls whose outputs stay on their worker (temp files) are not copied.

No clock, no I/O: :class:`Lanes` keeps, per worker, its calls out in the order they were
sent, and when each began to run (the time it was sent when a core was free, else when the
call before it ended); :func:`choose` decides.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutCall:
    """A call out, as speculation sees it: its worker, whether it waits behind another call
    there, since when it runs (None: it waits), its expected run time (None: unknown), and
    the rack of its input files' shard (None: no files, or no racks)."""

    call: int
    worker: str
    queued: bool
    began: float | None
    expected_s: float | None
    rack: str | None = None
    pace: float = 1.0  # its worker's pace (WorkerPace): 2.0 runs twice the expected time
    slow_shard: bool = False  # it reads through a shard read around now for being slow


@dataclass(frozen=True, slots=True)
class IdleWorker:
    """A worker with ``cores`` idle cores (no call out uses them)."""

    worker: str
    rack: str | None
    cores: int
    pace: float = 1.0


def late(call: OutCall, now: float, late_factor: float, late_slack_s: float) -> bool:
    """Whether a running call is past ``late_factor`` x its expected time + the slack."""
    if call.queued or call.began is None or not call.expected_s:
        return False
    return now - call.began > late_factor * call.expected_s + late_slack_s


def outrun_s(call: OutCall, now: float, copy_pace: float) -> float:
    """How much sooner a copy started now on a worker of ``copy_pace`` would end than
    ``call`` on its own worker, by their paces (<= 0: it would not; 0 for a call that waits,
    or whose cost is unknown)."""
    if call.queued or call.began is None or not call.expected_s:
        return 0.0
    own_end = max(call.began + call.pace * call.expected_s, now)
    return own_end - (now + copy_pace * call.expected_s)


def copy_kind(call: OutCall, now: float, fastest_pace: float, *, late_factor: float,
              late_slack_s: float) -> str | None:
    """Why :func:`choose` may copy ``call`` with an idle worker of ``fastest_pace`` or slower
    (pure): ``"queued"`` (it waits behind another), ``"late"`` (past its bound, or reading
    through a shard found slow), ``"outrun"`` (a copy would end sooner); None: no copy."""
    if call.queued:
        return "queued"
    if call.slow_shard or late(call, now, late_factor, late_slack_s):
        return "late"
    if outrun_s(call, now, fastest_pace) > late_slack_s:
        return "outrun"
    return None


def worth_copying(call: OutCall, now: float, fastest_pace: float, *, late_factor: float,
                  late_slack_s: float) -> bool:
    """Whether :func:`choose` could copy ``call`` (:func:`copy_kind`): a look whose calls
    are none of these needs no list of the idle workers."""
    return copy_kind(call, now, fastest_pace, late_factor=late_factor,
                     late_slack_s=late_slack_s) is not None


def choose(out: Iterable[OutCall], idle: Sequence[IdleWorker], now: float, *,
           late_factor: float, late_slack_s: float) -> list[tuple[OutCall, str]]:
    """Copies to start now: (call, the worker to run its copy), at most one per idle core.

    Queued calls first (the longest expected first: the longest wait an idle core can save),
    then late ones and those reading through a shard found slow since they were sent (the
    latest first, by how many expected times they have run), then those
    an idle worker would outrun by more than ``late_slack_s`` (the most first); each copy
    goes to an idle worker other than its call's, one in its files' rack when there is one
    (for an outrun call, the one whose copy would end first)."""
    free = {w.worker: w.cores for w in idle if w.cores > 0}
    if not free:
        return []
    racks = {w.worker: w.rack for w in idle}
    paces = {w.worker: w.pace for w in idle}
    fastest = min(paces.values())
    kinds: dict[str, list[OutCall]] = {"queued": [], "late": [], "outrun": []}
    for c in out:
        kind = copy_kind(c, now, fastest, late_factor=late_factor, late_slack_s=late_slack_s)
        if kind is not None:
            kinds[kind].append(c)
    queued = sorted(kinds["queued"], key=lambda c: (-(c.expected_s or 0.0), c.call))
    stragglers = sorted(kinds["late"],
                        key=lambda c: (-(now - (c.began or now)) / (c.expected_s or 1.0),
                                       c.call))
    outrun = sorted(kinds["outrun"], key=lambda c: (-outrun_s(c, now, fastest), c.call))
    chosen: list[tuple[OutCall, str]] = []
    for kind, calls in (("queued", queued), ("late", stragglers), ("outrun", outrun)):
        for call in calls:
            others = [w for w, n in free.items() if n > 0 and w != call.worker]
            if kind == "outrun":
                others = [w for w in others if outrun_s(call, now, paces[w]) > late_slack_s]
            if not others:
                continue
            near = [w for w in others if call.rack is not None and racks.get(w) == call.rack]
            if kind == "outrun":
                worker = max(near or others, key=lambda w: (-paces[w], free[w], w))
            else:
                worker = max(near or others, key=lambda w: (free[w], w))
            free[worker] -= 1
            chosen.append((call, worker))
    return chosen


class WorkerPace:
    """Each worker's pace: the median of its last ``keep`` bundles' run time over their
    expected time, from ``min_samples`` bundles on; 1.0 (the common pace) before, and for a
    worker not seen. A median, so that one slow bundle (the first after a library starts
    and imports the analysis) does not make a worker look slow. Workers that share cores
    with others, or run at a quarter of a core, show it here."""

    def __init__(self, keep: int = 5, min_samples: int = 3) -> None:
        self.keep = keep
        self.min_samples = min_samples
        self._ratios: dict[str, deque[float]] = {}
        # each worker's pace, worked out as a bundle comes back: a look for backup copies
        # asks for every worker's, several times a second
        self._paces: dict[str, float] = {}

    def observe(self, worker: str, ran_s: float, expected_s: float | None) -> None:
        """A bundle expected to take ``expected_s`` ran ``ran_s`` on ``worker``."""
        if not expected_s or expected_s <= 0 or ran_s <= 0:
            return
        ratios = self._ratios.get(worker)
        if ratios is None:
            ratios = self._ratios[worker] = deque(maxlen=self.keep)
        ratios.append(ran_s / expected_s)
        if len(ratios) >= self.min_samples:
            self._paces[worker] = statistics.median(ratios)

    def of(self, worker: str) -> float:
        return self._paces.get(worker, 1.0)

    def fastest(self) -> float:
        """The fastest pace of any worker (1.0 for one not measured yet): no idle worker's
        copy can be faster."""
        return min(1.0, min(self._paces.values(), default=1.0))


class Lanes:
    """Each worker's calls out, in the order they were sent, and when each began to run.

    A worker of ``cores_of(worker)`` cores runs its first that many calls; the others wait
    in its library. A call whose worker is not known yet (sent to a rack or anywhere) joins
    a lane when a look at the pool says where it is (:meth:`place` again moves it)."""

    def __init__(self, cores_of: Callable[[str], int]) -> None:
        self.cores_of = cores_of
        self.lane: dict[str, list[int]] = {}  # worker -> its calls out, oldest first
        self.on: dict[int, str] = {}  # call -> its worker
        self.began: dict[int, float] = {}  # call -> when it began to run

    def place(self, call: int, worker: str, now: float) -> None:
        """``call`` is out on ``worker``: it runs now if a core is free there."""
        if self.on.get(call) == worker:
            return
        self.remove(call, now)
        lane = self.lane.setdefault(worker, [])
        lane.append(call)
        self.on[call] = worker
        if len(lane) <= self.cores_of(worker):
            self.began[call] = now

    def remove(self, call: int, now: float) -> None:
        """``call`` is no longer out (done, cancelled, moved): the next in its lane runs."""
        worker = self.on.pop(call, None)
        self.began.pop(call, None)
        if worker is None:
            return
        lane = self.lane[worker]
        lane.remove(call)
        for waiting in lane[:self.cores_of(worker)]:
            self.began.setdefault(waiting, now)
        if not lane:
            del self.lane[worker]

    def queued(self, call: int) -> bool:
        return call in self.on and call not in self.began

    def busy(self, worker: str) -> int:
        return len(self.lane.get(worker, ()))

    def idle(self, workers: Mapping[str, str | None],
             pace: Callable[[str], float] = lambda worker: 1.0) -> list[IdleWorker]:
        """The workers (``{worker: rack}``) with cores that no call out uses, each with its
        ``pace``."""
        out = []
        for worker, rack in workers.items():
            free = self.cores_of(worker) - self.busy(worker)
            if free > 0:
                out.append(IdleWorker(worker, rack, free, pace(worker)))
        return out
