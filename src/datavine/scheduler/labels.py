"""How a worker says who and where it is: TaskVine features and environment variables.

A worker started by datavine carries its rack as the feature ``rack:<name>`` (so that a
task can be sent to that rack) and, where datavine names its workers itself (local
workers), its name as ``worker:<id>`` (so that a task can be sent to that worker). The
same labels are in the worker's environment (``DATAVINE_RACK``, ``DATAVINE_WORKER_ID``),
which the library processes it starts inherit: a bundle's result says where it ran. The
manager reads the features back from TaskVine's list of workers (:func:`labels_of`) when a
worker connects, before any result.

Imported on workers: no imports beyond the standard library.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

RACK_FEATURE_PREFIX = "rack:"
WORKER_FEATURE_PREFIX = "worker:"
ENV_RACK = "DATAVINE_RACK"
ENV_WORKER = "DATAVINE_WORKER_ID"


def rack_feature(rack: str) -> str:
    return f"{RACK_FEATURE_PREFIX}{rack}"


def worker_feature(worker_id: str) -> str:
    return f"{WORKER_FEATURE_PREFIX}{worker_id}"


def labels_of(features: Iterable[str]) -> tuple[str | None, str | None]:
    """(worker id, rack) a worker's features say (``worker:<id>``, ``rack:<name>``), None
    for each it does not say; the first of each wins."""
    worker = rack = None
    for feature in features:
        if worker is None and feature.startswith(WORKER_FEATURE_PREFIX):
            worker = feature[len(WORKER_FEATURE_PREFIX):] or None
        elif rack is None and feature.startswith(RACK_FEATURE_PREFIX):
            rack = feature[len(RACK_FEATURE_PREFIX):] or None
    return worker, rack


def rack_of(index: int, n_workers: int, racks: tuple[str, ...]) -> str | None:
    """Rack of worker ``index`` of ``n_workers``: equal blocks of workers per rack."""
    if not racks:
        return None
    return racks[(index * len(racks) // max(1, n_workers)) % len(racks)]


def here() -> tuple[str | None, str | None]:
    """(worker id, rack) of the worker this process runs under, from its environment."""
    return os.environ.get(ENV_WORKER) or None, os.environ.get(ENV_RACK) or None
