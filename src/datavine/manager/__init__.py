"""The manager process's shell, by job: the one module that drives TaskVine
(:mod:`datavine.manager.taskvine_port`), the datavine library's lifecycle
(:mod:`datavine.manager.library`), the workers as they come and go
(:mod:`datavine.manager.worker_watch`), composed by :mod:`datavine.manager.runtime`; the driver
of a run's state machine (:mod:`datavine.manager.execution`), which sees them only through
the port of :mod:`datavine.manager.port`; clusters, the Python environment for workers,
progress.
"""
