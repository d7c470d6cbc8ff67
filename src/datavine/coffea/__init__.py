"""coffea integration: :class:`DatavineExecutor`, a ``processor.Runner`` executor on TaskVine.

Client side:

- :mod:`~datavine.coffea.executor`: the executor: graph, cluster, results;
- :mod:`~datavine.coffea.prepare`: paths made absolute, missing files, code sent by value;
- :mod:`~datavine.coffea.session`: the embedded cluster an executor and its copies share;
- :mod:`~datavine.coffea.splitting`: items over the memory ceiling split in halves (pure);
- :mod:`~datavine.coffea.progress`: counts in events, and what finished (for Ctrl-C);
- :mod:`~datavine.coffea.report`: what each call did.

Worker side:

- :mod:`~datavine.coffea.tasks`: one item (retries, shard failover), merges;
- :mod:`~datavine.coffea.source`: :class:`DatavineSource`, the uproot handler reading through
  the XCache shards (also for coffea's dask path);
- :mod:`~datavine.coffea.badfiles`: which exceptions mean a bad file, which are permanent (pure).

What does not belong here: scheduling (:mod:`datavine.manager.runtime`) and the analysis itself.
Importing this package imports coffea (the ``coffea`` extra).
"""

from datavine.coffea.badfiles import Verdict, classify, exception_chain
from datavine.coffea.executor import DatavineExecutor
from datavine.coffea.report import (
    BadFilesSkippedWarning,
    CallRecord,
    ExecutionReport,
    PartialResultWarning,
)
from datavine.coffea.source import DatavineSource
from datavine.coffea.tasks import ItemFailedError, ItemFailure, WorkerImportError

__all__ = [
    "BadFilesSkippedWarning",
    "CallRecord",
    "DatavineExecutor",
    "DatavineSource",
    "ExecutionReport",
    "ItemFailedError",
    "ItemFailure",
    "PartialResultWarning",
    "Verdict",
    "WorkerImportError",
    "classify",
    "exception_chain",
]
