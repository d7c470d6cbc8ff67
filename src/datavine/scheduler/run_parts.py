"""What the parts of the run's state machine share (:class:`RunParts`): the state every part
reads, declared once. :class:`datavine.scheduler.run_state.RunState` holds it; its parts
(:mod:`datavine.scheduler.run_copies`, :mod:`datavine.scheduler.run_failures`,
:mod:`datavine.scheduler.run_pool`) declare here what they read of it, and each declares
the rest it needs (and the methods of the others it calls) itself.
"""

from __future__ import annotations

from collections.abc import Hashable

from datavine.config import RunConfig
from datavine.scheduler import graph as graphs
from datavine.scheduler.dispatch import Dispatcher
from datavine.scheduler.inflight import Inflight
from datavine.scheduler.intermediates import Intermediates
from datavine.scheduler.learned import Learned
from datavine.scheduler.lifecycle import Lifecycle
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
