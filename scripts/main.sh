#!/usr/bin/env bash
# The main job on the embedded default: every bundled task, the oracle agent, bwrap sandboxes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out=${1:-runs/main}
exec .venv/bin/sandfleet run --tasks examples/tasks --agent oracle -n 2 --concurrency 4 --out "$out"
