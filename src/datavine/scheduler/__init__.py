"""Manager-side decisions, pure: the graph, bundles, placement, memory caps, values kept on
workers, and the state machine of one run (:mod:`datavine.scheduler.run_state`). No TaskVine,
no clocks, no I/O here.
"""
