"""The manager process's shell: the one module that drives TaskVine
(:mod:`datavine.manager.runtime`), the driver of a run's state machine
(:mod:`datavine.manager.execution`), clusters, the Python environment for workers, progress.
"""
