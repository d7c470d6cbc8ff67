"""The live view of a run, and the same view saved as one HTML file after it.

The run's driver writes what happens (bundles sent and done, the pool once a second, the
run's start and end) through one sink (:mod:`datavine.dashboard.events`: JSON lines
appended to a file in the cluster's run directory). A separate process
(:mod:`datavine.dashboard.server`, a Bokeh server started by
:mod:`datavine.dashboard.launch`) tails that file, folds the records into the view's
state (:mod:`datavine.dashboard.model`, pure; :mod:`datavine.dashboard.columns`, what the
figures plot) and serves the figures (:mod:`datavine.dashboard.views`) from a process of
its own: the view's work never takes the manager's CPU or GIL (and with TaskVine as
released, ``Manager.wait`` holds the GIL: a thread in the manager would starve).
:mod:`datavine.dashboard.report` renders the same figures into one self-contained HTML file,
and :mod:`datavine.dashboard.metrics` the same state as Prometheus metrics (``/metrics`` on
the view's server, or on the manager's own listener,
:mod:`datavine.dashboard.metrics_listener`).

Only :mod:`~datavine.dashboard.events` is imported by the manager during a run (standard
library and :mod:`datavine.io.shards` only); Bokeh (the ``dashboard`` extra) is imported
by the server and the report.
"""
