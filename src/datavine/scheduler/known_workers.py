"""What the manager knows of one worker (:class:`KnownWorker`), and one entry of TaskVine's
list of connected workers as placement reads it (:class:`SeenWorker`): plain records that
:class:`datavine.scheduler.topology.Topology` keeps and indexes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from datavine.scheduler.labels import labels_of


@dataclass(slots=True)
class KnownWorker:
    """One worker: ``id`` is its datavine name, else its TaskVine address; ``host`` its
    normalised host name."""

    id: str
    rack: str | None
    cores: int = 1
    named: bool = False  # has the feature worker:<id>
    addrport: str | None = None
    files_read: set[str] = field(default_factory=set)  # its views hand placement this set
    host: str | None = None


@dataclass(frozen=True)
class SeenWorker:
    """One entry of TaskVine's list of connected workers, as placement needs it.

    ``complete``: the worker reported its resources, which it does after its features (one
    ordered stream): its name and rack, if it has any, are known."""

    addrport: str
    hostname: str | None
    cores: int
    name: str | None = None
    rack: str | None = None
    complete: bool = True

    @classmethod
    def from_status(cls, entry: Mapping[str, Any]) -> SeenWorker | None:
        """From an entry of ``Manager.status("workers")``; None when it names no address.
        Its ``features`` (a list, from a TaskVine that lists them) may be missing."""
        addrport = entry.get("addrport")
        if not isinstance(addrport, str) or not addrport:
            return None
        hostname = entry.get("hostname")
        hostname = hostname if isinstance(hostname, str) and hostname != "unknown" else None
        cores = entry.get("cores_total", entry.get("ncpus", 0))
        cores = cores if isinstance(cores, int) and not isinstance(cores, bool) else 0
        features = entry.get("features")
        name, rack = labels_of(f for f in features if isinstance(f, str)) if isinstance(
            features, list) else (None, None)
        return cls(addrport, hostname, max(cores, 0), name, rack, complete=cores > 0)
