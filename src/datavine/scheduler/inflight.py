"""A call out, as the run's state machine keeps it (:class:`Inflight`), and what to do with
it once withdrawn (:class:`Again`): plain records shared by
:mod:`datavine.scheduler.run_state` and its backup copies (:mod:`datavine.scheduler.run_copies`).
"""

from __future__ import annotations

from dataclasses import dataclass

from datavine.scheduler.bundling import Bundle
from datavine.scheduler.intermediates import Plan
from datavine.scheduler.lifecycle import Reason
from datavine.scheduler.topology import Target


@dataclass(frozen=True)
class Again:
    """What to do with a call once withdrawn: retry it (counting an attempt) or requeue it."""

    why: Reason
    reason: str = ""
    retry: bool = True
    anywhere: bool = False  # requeued (not retried) to run on any worker


@dataclass
class Inflight:
    """A call out: its bundle and where, under what cap, which temps it reads and makes;
    ``again``: what to do once it is withdrawn (set while its bundle is withdrawing)."""

    bundle: Bundle
    target: Target
    category: str
    cap_mb: float | None
    plan: Plan
    again: Again | None = None
    sent: float = 0.0  # when it was sent
    shard: str | None = None  # the one shard its files are read through, when one
    # pieces (and markers) counted as held by its worker from its sending on, until its
    # result confirms them (Topology.expect)
    expected: tuple[str, ...] = ()
