"""Named pool workers: each worker a pool starts carries a unique name the manager can target.

``vine_factory`` starts every worker with the same command line, so the name is made where
the worker starts: vine_factory runs each worker through a small wrapper script
(``--wrapper``, shipped with ``--wrapper-input``) that derives a name from the batch job
and starts ``vine_worker`` with the feature ``worker:<name>`` and ``DATAVINE_WORKER_ID``
in its environment (the library reports it with every result, as local workers do):

- HTCondor: ``<pool>-<ClusterId>.<ProcId>`` from the job's ClassAd (``$_CONDOR_JOB_AD``);
- anywhere else: ``<pool>-<host>-<pid>``, the pid being vine_worker's own (the wrapper
  execs it).

The pool can compute the same names from outside (:func:`condor_name`, :func:`local_name`)
from ``condor_q`` or its process group, so the manager can announce the workers, with their
rack and cores, and start their library before the first bundle (:mod:`.warm`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from datavine.scheduler.labels import ENV_WORKER

WRAPPER_NAME = "datavine_worker.sh"
ENV_POOL = "DATAVINE_POOL_NAME"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

WRAPPER = f"""#!/bin/sh
# datavine: name this vine_worker so that the manager can send it work (worker:<name>).
# Started by vine_factory as: {WRAPPER_NAME} ./vine_worker ARGS...
job=""
if [ -n "$_CONDOR_JOB_AD" ] && [ -r "$_CONDOR_JOB_AD" ]; then
    cluster=$(sed -n 's/^ClusterId *= *//p' "$_CONDOR_JOB_AD" | head -n 1)
    proc=$(sed -n 's/^ProcId *= *//p' "$_CONDOR_JOB_AD" | head -n 1)
    [ -n "$cluster" ] && job="$cluster.${{proc:-0}}"
fi
[ -n "$job" ] || job="$(uname -n | cut -d. -f1)-$$"
name=$(printf '%s-%s' "${{{ENV_POOL}:-pool}}" "$job" | tr -c 'A-Za-z0-9_.\\n-' '_')
{ENV_WORKER}="$name"
export {ENV_WORKER}
exec "$@" --feature "worker:$name"
"""


def _clean(text: str) -> str:
    return _UNSAFE.sub("_", text)


def condor_name(pool: str, cluster: int | str, proc: int | str) -> str:
    """The name the wrapper gives the worker of HTCondor job ``cluster.proc``."""
    return _clean(f"{pool}-{cluster}.{proc}")


def local_name(pool: str, pid: int, host: str | None = None) -> str:
    """The name the wrapper gives a worker that is process ``pid`` on ``host`` (this one)."""
    host = (host or os.uname().nodename).split(".", 1)[0]
    return _clean(f"{pool}-{host}-{pid}")


def write_wrapper(directory: Path) -> Path:
    """Write the wrapper into ``directory`` (not the factory's scratch folder itself:
    vine_factory copies wrapper inputs into it) and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    path = directory / WRAPPER_NAME
    path.write_text(WRAPPER)
    path.chmod(0o755)
    return path
