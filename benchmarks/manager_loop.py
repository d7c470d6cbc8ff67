"""Benchmark: datavine's own loop per bundle, without TaskVine, warm and after a pause.

The graph of ``benchmarks/workers.py`` (``--tasks`` tasks that name a ``.root`` path each,
so each is a bundle of its own and goes through placement, then one task collecting them;
here they sleep 0 s) is run by the manager's loop (:class:`datavine.manager.execution.
GraphRun`: the run's state machine, placement, encoding, decoding, the live view writing its
records to a file) on the fake port of ``tests/fake_runtime.py`` with ``--workers`` fake
workers: no TaskVine, no processes, each bundle run in this process. The fake's submit and
wait (where it runs the bundles and hands their results over) are left out; its other
answers (where the calls are, the pool's size) are a few microseconds and stay in. What is
counted is this thread's CPU time in datavine's code, per bundle: the figure ``workers.py``
measures with TaskVine and 256 real workers, less TaskVine.

Back to back (``pause 0``) the loop runs with its code and data in the core's caches. With a
pause before each result (``--pause-ms``: the thread sleeps, as the manager does between
the results of real workers), the same work runs after the core did something else: the
ratio of the two says how much of the manager's CPU per bundle in ``workers.py`` is the
code's work and how much is that work done cold, which depends on the host (its other
processes and, on a virtual machine, its other tenants) more than on datavine.

    .venv/bin/python benchmarks/manager_loop.py [--tasks 768] [--workers 256] [--repeat 5]
        [--pause-ms 0 2 20] [--pause-tasks 256] [--no-view]

Last line: ``us_per_bundle_pause_<ms>=...`` per pause (the best of the repeats) and
``cold_ratio_<ms>=...`` (that against pause 0).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
from workers import make_graph

sys.path.insert(0, str(common.REPO))  # tests.fake_runtime: the fake port the run-loop tests use

from tests.fake_runtime import FakeRuntime

from datavine.config import RunConfig
from datavine.dashboard.events import NO_SINK, EventSink, NullSink
from datavine.manager.execution import GraphRun
from datavine.scheduler import graph as graphs


class TimedPort(FakeRuntime):
    """The fake port, its own CPU time counted apart (``fake_s``) and a pause before each
    result it hands over (``pause_s``: a sleep, which takes no CPU time)."""

    def __init__(self, cfg: RunConfig, workers: int) -> None:
        super().__init__(cfg, workers=workers)
        self.fake_s = 0.0
        self.pause_s = 0.0

    def _fake(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call``, its CPU time added to ``fake_s``."""
        started = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            self.fake_s += time.thread_time() - started

    def submit_bundle(self, *args: Any, **kwargs: Any) -> Any:
        return self._fake(super().submit_bundle, *args, **kwargs)

    def wait(self, timeout_s: int) -> Any:
        if self.pause_s:
            time.sleep(self.pause_s)
        return self._fake(super().wait, timeout_s)


def us_per_bundle(port: TimedPort, tasks: int, run: int, sink: NullSink,
                  cfg: RunConfig) -> float:
    """One run of the graph: datavine's CPU time per bundle, in microseconds."""
    graph = make_graph(tasks, 0.0, run=run)
    port.fake_s = 0.0
    started = time.thread_time()
    task_graph = graphs.build(dict(graph.__dask_graph__()), [graph.key])
    GraphRun(port, task_graph, cfg, sink=sink).execute()
    return 1e6 * (time.thread_time() - started - port.fake_s) / (tasks + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=768,
                        help="tasks of a run without a pause")
    parser.add_argument("--pause-tasks", type=int, default=256,
                        help="tasks of a run with a pause (each pause is a sleep)")
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pause-ms", type=float, nargs="+", default=[0.0, 2.0, 20.0])
    parser.add_argument("--no-view", dest="view", action="store_false",
                        help="no live view (its records are written by default, as in a "
                             "cluster)")
    args = parser.parse_args()
    print(f"# {common.machine_info()}")
    cfg = RunConfig(memory=None, progress=False)
    port = TimedPort(cfg, args.workers)
    best: dict[float, float] = {}
    run = 0
    with tempfile.TemporaryDirectory(prefix="datavine-manager-loop-") as scratch:
        sink = EventSink(Path(scratch) / "events.jsonl") if args.view else NO_SINK
        # a first run outside the count: imports, the encoder's first pickles
        us_per_bundle(port, min(args.tasks, 64), -1, sink, cfg)
        for pause in args.pause_ms:
            port.pause_s = pause / 1e3
            tasks = args.tasks if pause == 0 else args.pause_tasks
            runs = []
            for _ in range(args.repeat):
                runs.append(us_per_bundle(port, tasks, run, sink, cfg))
                run += 1
            best[pause] = min(runs)
            print(f"pause {pause:g} ms before each result, {tasks} tasks: "
                  + " ".join(f"{x:.0f}" for x in runs) + f" us a bundle (best {best[pause]:.0f})",
                  flush=True)
        sink.close()
    pairs: dict[str, Any] = {f"us_per_bundle_pause_{p:g}": round(v) for p, v in best.items()}
    warm = best.get(0.0)
    if warm:
        pairs.update({f"cold_ratio_{p:g}": round(v / warm, 2) for p, v in best.items() if p})
    print(common.kv_line(pairs))


if __name__ == "__main__":
    main()
