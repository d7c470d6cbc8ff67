"""Where room or nearness was gained, as a log that readers follow with a cursor.

:class:`datavine.scheduler.topology.Topology` adds a wake key (``(kind, name)``, see
:meth:`Topology.wake_keys`) whenever room is gained: a worker's slot returned (the worker,
its rack, its host), a rack-wide bundle returned or a worker joined (its rack, and its rack's
share), a file read by one more worker (the file). The dispatcher
(:mod:`datavine.scheduler.dispatch`) reads what was added since its last look, so that it
looks again only at the held bundles waiting there.
"""

from __future__ import annotations

WakeKey = tuple[str, str]
GAINS_KEPT = 1 << 16  # gains kept for a reader that does not come (see GainLog.since)


class GainLog:
    """Wake keys in the order they were gained; old ones are dropped past
    :data:`GAINS_KEPT` (a topology that no run reads)."""

    def __init__(self) -> None:
        self._keys: list[WakeKey] = []
        self._base = 0  # the position of the first key kept

    def add(self, *keys: WakeKey) -> None:
        keys_kept = self._keys
        keys_kept.extend(keys)
        if len(keys_kept) > GAINS_KEPT:  # nobody reads them (no run): keep the newest half
            half = len(keys_kept) // 2
            del keys_kept[:half]
            self._base += half

    @property
    def end(self) -> int:
        """Where the next key will be written (a cursor for :meth:`since`)."""
        return self._base + len(self._keys)

    def since(self, cursor: int) -> list[WakeKey] | None:
        """The keys gained since ``cursor`` (an :attr:`end`); None when some were dropped
        (too many since): take everything as changed, as after a change of the topology's
        ``epoch``."""
        if cursor < self._base:
            return None
        return self._keys[cursor - self._base:]
