#!/usr/bin/env bash
# Type-check datavine with mypy, as CI does (scripts/test.sh runs it before the tests):
#
#   bash scripts/typecheck.sh [MYPY-ARGS...]        e.g.  bash scripts/typecheck.sh --no-incremental
#
# What is checked, and how strictly, is pyproject.toml's [tool.mypy]: the whole package
# (src/datavine), the scheduler, the worker code and the protocol module strictly. mypy comes
# with the test extras (scripts/setup.sh). DATAVINE_PYTHON picks the interpreter (default
# .venv/bin/python). Exits with mypy's status: 0 clean, 1 type errors, 2 a usage error.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${DATAVINE_PYTHON:-.venv/bin/python}
if ! "$PY" -c "import mypy" 2>/dev/null; then
  echo "typecheck.sh: mypy is not installed in $PY (pip install -e '.[test]')" >&2
  exit 2
fi
exec "$PY" -m mypy "$@"
