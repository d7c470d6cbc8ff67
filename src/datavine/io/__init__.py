"""Data access on both sides: XCache shards and the choice of a file's shard, reads with
failover, the XCache test bed, CMS NanoAOD samples and generated throughput data.
"""
