"""Data access on both sides: reading inputs, the shard map, the XCache servers, datasets.

- reading, one layer: :mod:`~datavine.io.reading` is the entry point (``open_input``, the
  per-bundle accounting of bytes near and far), :mod:`~datavine.io.source` the ways of
  reaching a file (local path, ``root://`` as given, ``root://`` through XCache shards with
  failover);
- :mod:`~datavine.io.shards`: which shard holds which file, shard health, who is next in
  line (pure: the scheduler places tasks with it too);
- :mod:`~datavine.io.xcache`: the XCache test bed (real servers), their config and statistics;
- :mod:`~datavine.io.samples`, :mod:`~datavine.io.datagen`: CMS NanoAOD samples and generated
  throughput data; :mod:`~datavine.io.tail`: files read as they grow.
"""
