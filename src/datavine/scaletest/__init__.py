"""The scale test: the AGC-style analysis on a pool, reported as the 200 Gbps challenge was.

- :mod:`~datavine.scaletest.run`: dataset, optional XCache testbed, pool, graphs, timing;
- :mod:`~datavine.scaletest.tasks`: what runs on workers (never raises; per-chunk records);
- :mod:`~datavine.scaletest.report`: the figures and the timeline (pure);
- :mod:`~datavine.scaletest.plot`: the timeline PNG (matplotlib, Agg);
- :mod:`~datavine.scaletest.cli`: ``datavine scale-test`` / ``python -m datavine.scaletest``.

The analysis itself is :func:`datavine.analysis.agc.process_chunk`; scheduling is datavine's.
"""

from datavine.scaletest.report import ScaleReport, Timeline, build_report
from datavine.scaletest.run import ScaleTestConfig, ScaleTestError, run_scale_test

__all__ = [
    "ScaleReport",
    "ScaleTestConfig",
    "ScaleTestError",
    "Timeline",
    "build_report",
    "run_scale_test",
]
