#!/usr/bin/env bash
# A/B of the service path: `sandfleet bench service --json` on a base commit and on this checkout,
# alternately, N rounds each, in one sitting (same machine state for both sides).
#   scripts/bench-ab-service.sh [BASE_REV=3c3005a] [ROUNDS=3] [bench service flags...]
#     -> prints one line per run (default flags: --backend bwrap -n 20 --rtt-n 100 --concurrency 16 --seconds 2)
# As scripts/bench-ab.sh: the base runs from a temporary git worktree with this venv (PYTHONPATH puts its src/
# first; the service the bench starts inherits it), each side with its own state, cache and cgroup parent.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-3c3005a}; rounds=${2:-3}; shift $(( $# < 2 ? $# : 2 ))
flags=("$@"); [ ${#flags[@]} -gt 0 ] || flags=(--backend bwrap -n 20 --rtt-n 100 --concurrency 16 --seconds 2)
wt=$(mktemp -d /tmp/sandfleet-ab-service.XXXXXX); out=$wt/out; mkdir -p "$out"
git worktree add -f -q "$wt/base" "$base"
trap 'git worktree remove --force "$wt/base"; rm -rf "$wt"' EXIT
for i in $(seq "$rounds"); do
  for side in base head; do
    if [ "$side" = base ]; then pp=$wt/base/src; else pp=$PWD/src; fi
    env SANDFLEET_STATE=/run/sf-abs-$side SANDFLEET_CGROUP_PARENT=sf-abs-$side SANDFLEET_CACHE=/var/tmp/sf-abs-cache-$side \
      PYTHONPATH=$pp .venv/bin/python -c "from sandfleet.cli import main; main()" bench service --json "${flags[@]}" \
      > "$out/$side-$i.json"
  done
done
for f in "$out"/*.json; do
  .venv/bin/python - "$f" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
rate = {k.rsplit("_", 1)[1]: v for k, v in d.items() if k.startswith("execs_per_s_")}
print(f"{os.path.basename(sys.argv[1]):12} load {d['load_average'][0]:5.1f}  "
      f"create_exec_close_p50_ms remote {d['create_exec_close_p50_ms_remote']:6.1f} local {d['create_exec_close_p50_ms_local']:6.1f}  "
      f"exec_rtt_p50_ms remote {d['exec_rtt_p50_ms_remote']:5.2f} local {d['exec_rtt_p50_ms_local']:5.2f}  "
      f"execs_per_s remote {rate['remote']:5.0f} local {rate['local']:5.0f}")
PY
done
