#!/usr/bin/env bash
# Fetch coffea's real CMS NanoAOD test samples (tests/samples/*.root of coffea's sdist)
# into build/samples/coffea/. Idempotent: a second run does nothing.
#   scripts/fetch_samples.sh [--version 2026.9.0] [--dest DIR]
# PYTHON overrides the interpreter (default: the checkout's .venv); its pip downloads.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m datavine.io.samples "$@"
