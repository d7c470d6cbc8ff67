"""What a manager learns across runs and hands to each (:class:`Learned`).

Task costs per category (:mod:`datavine.scheduler.bundling`), memory peaks and caps
(:mod:`datavine.scheduler.memory`), the workers and racks seen
(:mod:`datavine.scheduler.topology`), shards seen failing, workers dropped for the network
(:mod:`datavine.scheduler.network`) and the largest output per kind of task
(:mod:`datavine.scheduler.intermediates`). One run's state
(:class:`datavine.scheduler.run_state.RunState`) reads and updates it; nothing else of a run
outlives the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from datavine.config import RunConfig
from datavine.io.shards import ShardHealth
from datavine.scheduler.bundling import CostModel
from datavine.scheduler.hit_saving import HitSaving
from datavine.scheduler.memory import MemoryState
from datavine.scheduler.network import NetworkWatch
from datavine.scheduler.shard_pace import ShardPace
from datavine.scheduler.speculation import WorkerPace
from datavine.scheduler.topology import Topology


@dataclass
class Learned:
    """What a manager learns across runs and hands to each: task costs per category, memory
    peaks and caps, the workers it has seen (and their racks), shards seen failing, workers
    dropped for the network (:mod:`datavine.scheduler.network`), and the largest output
    seen per kind of task (category and function, ``TaskGraph.output_kind``: a kind whose
    outputs came back small makes no temp file in the next run's first bundles either,
    :mod:`datavine.scheduler.intermediates`), and what a read from a worker's memory saves
    over a read from the file (:mod:`datavine.scheduler.hit_saving`: how long a held task
    waits for that worker)."""

    costs: CostModel
    memory: MemoryState | None
    topology: Topology
    shard_health: ShardHealth
    network: NetworkWatch = field(default_factory=NetworkWatch)
    shard_pace: ShardPace = field(default_factory=ShardPace)
    worker_pace: WorkerPace = field(default_factory=WorkerPace)
    largest_output: dict[str, int] = field(default_factory=dict)
    hit_saving: HitSaving = field(default_factory=HitSaving)

    @classmethod
    def fresh(cls, run: RunConfig, here: str = "localhost") -> Learned:
        """Nothing learned yet; ``here``: the manager's host name (what loopback means)."""
        return cls(CostModel(), MemoryState(run.memory) if run.memory is not None else None,
                   Topology(run.bundles_per_slot, racks=run.racks, here=here), ShardHealth())
