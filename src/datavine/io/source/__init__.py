"""Ways of reaching an input file: one interface, one module per way (after ``uproot.source``).

- :mod:`~datavine.io.source.base`: the interface, :class:`~datavine.io.source.base.Source`
  (``open(url, opener)`` on the server that should serve the file now), the
  :class:`~datavine.io.source.base.OpenRecord` an open reports (server, rack, failovers and
  their errors), what counts as a server's failure, and the bytes a handle requested;
- :mod:`~datavine.io.source.local`: a local path, opened where it is;
- :mod:`~datavine.io.source.xrootd`: a ``root://`` URL opened as given, and the XRootD
  client's fast-failover settings (set when it is imported);
- :mod:`~datavine.io.source.xcache`: a ``root://`` URL through its XCache shard, failing over
  to the next shard in line and finally the origin;
- :mod:`~datavine.io.source.handles`: the openers, which make the handle that reads byte
  ranges (an uproot file, or an uproot source for a ``handler``);
- :mod:`~datavine.io.source.disk`: not a way but a layer in front of one: the byte ranges
  of a ``root://`` file kept on the worker's disk (:mod:`datavine.io.disk_cache`), served
  from there on a rerun (``RunConfig.input_cache_mb``).

Which way a file takes, and the accounting of every open of a bundle (bytes near and far),
is :mod:`datavine.io.reading`, the one entry point: ``open_input`` for task code,
:func:`~datavine.io.reading.open_source` for uproot handlers. The shard map itself (which
file lives on which shard, shard health, who is next in line) is pure and lives in
:mod:`datavine.io.shards`. The servers (the loopback XCache testbed) are
:mod:`datavine.io.xcache`.

Nothing is imported here, so that importing :mod:`~datavine.io.source.base` does not set the
XRootD client's environment (:mod:`~datavine.io.source.xrootd` does, on import).
"""
