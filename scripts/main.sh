#!/usr/bin/env bash
# The main job on the embedded default: every bundled task, the oracle agent, bwrap sandboxes.
# Each run writes to a new directory (runs/main-<timestamp>) unless one is given; an earlier
# run's results are never replaced (resume one with: sandfleet run ... --out DIR --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
out=${1:-runs/main-$(date +%Y%m%d-%H%M%S)}
exec .venv/bin/sandfleet run --tasks examples/tasks --agent oracle -n 2 --concurrency 4 --out "$out"
