"""Ready a manager for a pool's named workers: start the library on each before the run, and
tell placement which worker is which (rack, cores).

``warm_pools(runtime, pools)`` asks each pool for its running workers' names
(:meth:`~datavine.deploy.pools.factory_pool.FactoryPool.worker_names`), sends one empty bundle per
core to each (``Runtime.warm_up``: the worker starts the library and imports
``RunConfig.preload``) and announces those that answered to the runtime's topology, so that
the first bundles can already go to "the worker in the file's rack" or "the worker that read
it". :class:`~datavine.deploy.facility.FacilityCluster` does it at start, and again before a run
when more workers are connected than are warm (workers that joined the pools since).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from datavine.deploy.pools.base import PoolError
from datavine.deploy.pools.factory_pool import FactoryPool

if TYPE_CHECKING:
    from datavine.manager.runtime import Runtime


@dataclass
class WarmReport:
    """Names found per pool, and the workers whose library answered."""

    names: dict[str, list[str]] = field(default_factory=dict)
    warm: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        found = sum(len(v) for v in self.names.values())
        line = f"{len(self.warm)} of {found} named pool worker(s) warm"
        return line + (f" ({'; '.join(self.errors)})" if self.errors else "")


def warm_pools(runtime: Runtime, pools: Sequence[FactoryPool], timeout_s: float) -> WarmReport:
    """Start the library on the pools' running named workers and announce them (those warm
    already answer at once; the runtime re-warms this set after a library restart)."""
    report = WarmReport()
    where: dict[str, tuple[str | None, int]] = {}
    for pool in pools:
        try:
            names = pool.worker_names()
        except PoolError as exc:
            report.errors.append(f"{pool.name}: {exc}")
            continue
        report.names[pool.name] = names
        for name in names:
            where[name] = (pool.config.rack, pool.config.cores)
    if not where:
        return report
    answered = runtime.warm_up({n: cores for n, (_, cores) in where.items()}, timeout_s)
    for worker, _pid in answered:
        if worker in where:
            rack, cores = where[worker]
            runtime.topology.announce(worker, rack, cores)
            report.warm.add(worker)
    return report
