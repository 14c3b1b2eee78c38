#!/usr/bin/env bash
# The test command: static checks, the documentation site, then the whole suite against real
# components in two tiers (every test runs in one of them):
#
#   default tier  everything not marked slow, soak or image, on FLEETLET_TEST_WORKERS pytest-xdist
#                 workers (4 by default: the tests mostly wait on control planes; docs/testing.md
#                 has what was measured), each test file whole on one worker (--dist loadfile)
#   long tier     the long scenarios (slow), the soak and the image builds, on
#                 FLEETLET_LONG_WORKERS workers (2 by default), --dist loadfile with the demo's
#                 files together and the podman ones together (tests/conftest.py, SHARED_SCOPES)
#
# With arguments, runs only `pytest <arguments>` after the checks (one invocation, serial
# unless the arguments say -n), for a file or a selection.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m ruff check .
python3 -m ruff format --check .
python3 -m mypy
lint-imports
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
# The documentation site: a broken link or anchor fails the build (mkdocs.yml).
if ! NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --site-dir "$site" 2>&1 | { grep -v '^INFO' || true; }; then
  echo "[test] mkdocs build --strict failed" >&2
  exit 1
fi

# pytest exits 5 when it collected no tests: that is a failure here, never a silent pass.
run() {
  local rc=0 start
  start=$(date +%s)
  python3 -m pytest "$@" || rc=$?
  echo "[test] pytest $* took $(( $(date +%s) - start )) s (exit $rc)" >&2
  if [ "$rc" -eq 5 ]; then echo "[test] no tests ran" >&2; return 1; fi
  return "$rc"
}

if [ $# -gt 0 ]; then
  run "$@"
  exit $?
fi

LONG="slow or soak or image"
rc=0
run -n "${FLEETLET_TEST_WORKERS:-4}" --dist loadfile -m "not ($LONG)" || rc=$?
run -n "${FLEETLET_LONG_WORKERS:-2}" --dist loadfile -m "$LONG" || rc=$?
exit "$rc"
