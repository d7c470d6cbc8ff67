"""The scale test: the AGC-style analysis on a pool, reported as the 200 Gbps challenge was.

- :mod:`~datavine.apps.scaletest.run`: dataset, optional XCache testbed, pool, graphs, timing;
- :mod:`~datavine.apps.scaletest.tasks`: what runs on workers (never raises; per-chunk records);
- :mod:`~datavine.apps.scaletest.report`: the figures and the timeline (pure);
- :mod:`~datavine.apps.scaletest.plot`: the timeline PNG (matplotlib, Agg);
- :mod:`~datavine.apps.scaletest.cli`: ``datavine scale-test`` /
  ``python -m datavine.apps.scaletest``.

The analysis itself is :func:`datavine.apps.analysis.agc.process_chunk`; scheduling is datavine's.
"""

from datavine.apps.scaletest.report import ScaleReport, Timeline, build_report
from datavine.apps.scaletest.run import ScaleTestConfig, ScaleTestError, run_scale_test

__all__ = [
    "ScaleReport",
    "ScaleTestConfig",
    "ScaleTestError",
    "Timeline",
    "build_report",
    "run_scale_test",
]
