"""The scale test from a script: ``datavine scale-test`` with the same options.

    .venv/bin/python examples/scaling_test.py --files 16 --events-per-file 100000 --workers 2

Generates NanoAOD-like files (once; reused later), runs the AGC-style analysis on local
TaskVine workers and writes ``runs/scaletest/scaletest.json`` (Gbps, kHz per core, files
processed and failed, peak memory per worker) and ``runs/scaletest/timeline.png``. See
``--help`` for the pool (``--pool external|condor``), ``--fileset`` and ``--xcache`` options.
"""

from __future__ import annotations

import sys

from datavine.apps.scaletest.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
