"""Code that runs inside a ``vine_worker``'s library: bundles of dask tasks
(:mod:`datavine.worker.remote`), and the long-lived capped child that enforces memory caps.
Imported on workers: keep it light (no dask, no TaskVine).
"""
