"""What the run's state machine (:mod:`datavine.scheduler.run_state`) takes in and hands out.

Events, from the driver (:mod:`datavine.manager.execution`) to :meth:`RunState.handle`:
:class:`Tick` (the loop turned; the pool's size), :class:`PoolSample` (the calls' TaskVine
states, calls TaskVine requeued by itself, workers that left), :class:`CallDone` (a call's
:class:`datavine.protocol.BundleResult`, or why there is none) and :class:`CallWithdrawn` (a
call cancelled before a worker took it, as asked). Instructions, back to the driver:
:class:`Submit` (a :class:`datavine.protocol.BundleSpec`), :class:`Withdraw` (cancel if not
dispatched yet), :class:`DropTemp`, :class:`Deliver` (values for progress and the result
hook), :class:`Network` (TaskVine's settings for the network) and :class:`Fail` (the run
cannot succeed: raise this). Plain frozen records: no decision here.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datavine.protocol import BundleResult, BundleSpec, ProtocolError
from datavine.scheduler.network import LibraryState
from datavine.scheduler.topology import Target

Key = Hashable


# --- events -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tick:
    """The loop turned at ``now``, with this many workers and cores connected."""

    now: float
    workers: int
    cores: int


@dataclass(frozen=True)
class PoolSample:
    """A look at the pool (about once a second): TaskVine's state of the calls it was asked
    about (those not known to be on a worker: a call missing here is where ``where`` says),
    calls TaskVine put back in its queue by itself, named workers that left, addresses that
    disconnected; each worker's library (by address) and the address of each call a worker
    took, of which ``moved`` are new since the last look (None: all of them). A look that
    is not ``full`` (at a run's tail, many a second) says no more than where calls run."""

    now: float
    workers: int
    cores: int
    states: Mapping[int, str]
    requeued: frozenset[int] = frozenset()
    gone: frozenset[str] = frozenset()
    lost_addr: frozenset[str] = frozenset()
    libraries: Mapping[str, LibraryState] = field(default_factory=dict)
    where: Mapping[int, str] = field(default_factory=dict)
    moved: frozenset[int] | None = None
    full: bool = True  # False: a look at a run's tail, at where calls run and nothing else


@dataclass(frozen=True)
class CallDone:
    """A call came back: the library's result, or ``None`` and why (``failure``: its worker
    or library died under it; ``unreadable``: it came back in a form this datavine does not
    read, and the run fails with that error)."""

    call: int
    result: BundleResult | None
    addrport: str | None
    now: float
    failure: str = ""
    unreadable: ProtocolError | None = None

    @classmethod
    def received(cls, call: int, data: Mapping[str, Any] | None, addrport: str | None,
                 now: float, failure: str = "") -> CallDone:
        """A call's result as it came over the wire (an encoded
        :class:`datavine.protocol.BundleResult`, or None), decoded here."""
        if data is None:
            return cls(call, None, addrport, now, failure)
        try:
            return cls(call, BundleResult.decode(data, addrport), addrport, now)
        except ProtocolError as exc:
            return cls(call, None, addrport, now, str(exc), unreadable=exc)


@dataclass(frozen=True)
class CallWithdrawn:
    """A call this state asked to withdraw was cancelled before any worker ran it."""

    call: int


Event = Tick | PoolSample | CallDone | CallWithdrawn


# --- instructions -------------------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    """Send a bundle as call ``call``: ``fetch``/``store`` map sandbox file names to temp
    numbers (a number not seen before is a new temp to declare)."""

    call: int
    spec: BundleSpec
    cap_mb: float | None
    preload: tuple[str, ...]
    limit_s: float | None
    target: Target
    fetch: dict[str, int]
    store: dict[str, int]

    @property
    def keys(self) -> list[Key]:
        return self.spec.keys

    @property
    def features(self) -> tuple[str, ...]:
        """TaskVine features that pin the call to its worker or rack (none: anywhere)."""
        return tuple(self.target.features())


@dataclass(frozen=True)
class Withdraw:
    """Cancel ``call`` if no worker took it yet, and answer :class:`CallWithdrawn`; a call
    already running is left to finish, unless ``running``: its worker's library never
    started, so nothing runs it."""

    call: int
    running: bool = False


@dataclass(frozen=True)
class DropTemp:
    """Temp ``temp`` is not needed any more: undeclare it (workers delete it)."""

    temp: int


@dataclass(frozen=True)
class Deliver:
    """Tasks finished: ``values`` are those that came back to the manager (each still a
    :class:`datavine.protocol.Pickled`: :func:`~datavine.protocol.loaded` gives it);
    ``again``: those of ``keys`` delivered before in this run (made again after their kept
    value was lost with a worker): a count of tasks done must not count them twice."""

    keys: list[Key]
    values: dict[Key, Any]
    again: frozenset[Key] = frozenset()


@dataclass(frozen=True)
class Network:
    """Change TaskVine for the network (:mod:`datavine.scheduler.network`): block hosts,
    unblock others, turn peer transfers off."""

    block: tuple[str, ...] = ()
    unblock: tuple[str, ...] = ()
    peers_off: bool = False


@dataclass(frozen=True)
class Fail:
    """The run cannot succeed: raise ``error``."""

    error: BaseException


Instruction = Submit | Withdraw | DropTemp | Deliver | Network | Fail
