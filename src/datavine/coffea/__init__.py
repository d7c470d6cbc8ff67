"""coffea integration: :class:`DatavineExecutor`, a ``processor.Runner`` executor on TaskVine.

- :mod:`~datavine.coffea.executor`: the executor (client side): graph, cluster, results;
- :mod:`~datavine.coffea.tasks`: what runs on workers: one item, merges (never raises);
- :mod:`~datavine.coffea.badfiles`: which exceptions mean a bad file (pure).

What does not belong here: scheduling (:mod:`datavine.runtime`) and the analysis itself.
Importing this package imports coffea (the ``coffea`` extra).
"""

from datavine.coffea.badfiles import Verdict, classify, exception_chain
from datavine.coffea.executor import (
    BadFilesSkippedWarning,
    CallRecord,
    DatavineExecutor,
    ExecutionReport,
)
from datavine.coffea.tasks import ItemFailedError, ItemFailure

__all__ = [
    "BadFilesSkippedWarning",
    "CallRecord",
    "DatavineExecutor",
    "ExecutionReport",
    "ItemFailedError",
    "ItemFailure",
    "Verdict",
    "classify",
    "exception_chain",
]
