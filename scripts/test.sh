#!/usr/bin/env bash
# The test command: static checks, then the whole suite against real components.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
lint-imports
set +e
python3 -m pytest "$@"
rc=$?
set -e
# pytest exits 5 when it collected no tests: that is a failure here, never a silent pass.
if [ "$rc" -eq 5 ]; then echo "[test] no tests ran" >&2; exit 1; fi
exit "$rc"
