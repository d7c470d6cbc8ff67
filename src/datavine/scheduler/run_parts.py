"""What the parts of the run's state machine share (:class:`RunParts`): the state every part
reads, and the methods of RunState and BackupCopies that more than one part calls, declared
once. :class:`datavine.scheduler.run_state.RunState` holds it; its parts
(:mod:`datavine.scheduler.run_copies`, :mod:`datavine.scheduler.run_failures`,
:mod:`datavine.scheduler.run_pool`, :mod:`datavine.scheduler.run_shards`) declare here what
they read of it, and each declares the rest it needs (and the other methods it calls)
itself.
"""

from __future__ import annotations

from collections.abc import Hashable

from datavine.config import RunConfig
from datavine.scheduler import graph as graphs
from datavine.scheduler.bundling import Bundle
from datavine.scheduler.dispatch import Dispatcher
from datavine.scheduler.inflight import Again, Inflight
from datavine.scheduler.intermediates import Intermediates
from datavine.scheduler.learned import Learned
from datavine.scheduler.lifecycle import Lifecycle, Phase, Reason
from datavine.scheduler.summary import RunSummary

Key = Hashable


class RunParts:
    """The state shared by the run's parts (see the module docstring)."""

    graph: graphs.TaskGraph
    cfg: RunConfig
    learned: Learned
    now: float
    summary: RunSummary
    dispatch: Dispatcher
    kept: Intermediates
    life: Lifecycle
    inflight: dict[int, Inflight]  # call -> its record
    backups: dict[int, Inflight]  # backup copy -> its record
    copied_from: dict[int, int]  # copy -> the call it copies

    # RunState's and BackupCopies', called by more than one part
    def _move(self, bundle: Bundle, to: Phase, *, call: int | None = None,
              reason: Reason | None = None, detail: str = "") -> None:
        raise NotImplementedError

    def _withdraw(self, call: int, again: Again, *, running: bool = False) -> None:
        raise NotImplementedError

    def _cancel_copy(self, call: int, why: str) -> None:
        raise NotImplementedError
