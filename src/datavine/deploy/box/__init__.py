"""A facility in a box: hosts, racks and a shaped inter-rack link on one Linux machine.

Every host of the box is a network namespace with a hostname of its own: a manager host
(the TaskVine manager, the origin xrootd, HTCondor's central manager and schedd), and racks,
each a Linux bridge behind a router of its own, whose hosts run workers and one XCache shard
per rack. The racks reach each other only through a spine whose links are shaped with
``tc tbf``; the kernel's byte counters on those links are the ground truth for "bytes
across racks". Names resolve from a hosts file in every namespace, never through a lookup
that waits.

Rooms:

- :mod:`.plan`: pure: a :class:`~.plan.BoxSpec` becomes the hosts, addresses, links, routes
  and hosts file of the box, and the ``ip``/``tc`` commands that make it (tested as text);
- :mod:`.net`: the shell around it: makes and removes the namespaces, runs commands on a
  host, reads counters, cuts and shapes paths;
- :mod:`.services`: the XCache origin and shards on the box's hosts;
- :mod:`.condor`: HTCondor across the box (central manager on the manager host, a startd
  per rack host) from the project's one trixie chroot;
- :mod:`.slowdown`: stragglers made from outside: a CPU quota on a host's processes
  (cgroup v1), a token bucket on a host's cable (``benchmarks/stragglers.py``);
- :mod:`.cli`: ``datavine box up|down|status|exec|cut|restore|shape``.

Needs root with CAP_NET_ADMIN (``ip netns add``); :func:`.net.box_missing` says why not.
"""
