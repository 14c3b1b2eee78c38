#!/usr/bin/env bash
# The main job on embedded defaults: install what is missing, then run the local demo fleet.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec python3 -m fleetlet demo "$@"
