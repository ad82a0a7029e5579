#!/usr/bin/env bash
# A/B of the sandbox layer: `sandfleet bench micro --json` on a base commit and on this
# checkout, alternately, N rounds each, in one sitting (same machine state for both sides).
#   scripts/bench-ab.sh [BASE_REV=490e57a] [ROUNDS=3]    -> prints one line per run
# The base runs from a temporary git worktree with this venv (PYTHONPATH puts its src/ first);
# each side gets its own state and cache directory and its own cgroup parent (another state
# root's reaper, on older code, sweeps markerless cgroups under its parent: live sandboxes).
# HEAD also runs with SANDFLEET_DISK=tmpfs. Runs rotate and wait for a settled host (below).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-490e57a}; rounds=${2:-3}
wt=$(mktemp -d /tmp/sandfleet-ab.XXXXXX); out=$wt/out; mkdir -p "$out"
git worktree add -f -q "$wt/base" "$base"
trap 'git worktree remove --force "$wt/base"; rm -rf "$wt"' EXIT
# Before each run the host settles: at most 2 runnable tasks in 3 readings 0.5 s apart (60 s
# at most). A run ends by closing its 256 idle sandboxes, and the kernel tears their loop
# devices down after it has exited (load 30 here): without the wait, whichever side runs next
# pays for it. The order rotates each round (base, head, head-tmpfs; then head, head-tmpfs,
# base; ...), so no side always follows the same one.
settle() {
  local calm=0 t=0
  while [ $calm -lt 3 ] && [ $t -lt 120 ]; do
    r=$(cut -d' ' -f4 /proc/loadavg); r=${r%/*}
    if [ "$r" -le 3 ]; then calm=$((calm + 1)); else calm=0; fi   # (this shell's own cut counts)
    sleep 0.5; t=$((t + 1))
  done
}
sides=(base head head-tmpfs)
for i in $(seq "$rounds"); do
  k=$(( (i - 1) % 3 ))
  for side in "${sides[@]:$k}" "${sides[@]:0:$k}"; do
    settle
    if [ "$side" = base ]; then pp=$wt/base/src; else pp=$PWD/src; fi
    st=${side%-tmpfs}
    env SANDFLEET_DISK=$([ "$side" = head-tmpfs ] && echo tmpfs || echo ext4) \
      SANDFLEET_STATE=/run/sf-ab-$st SANDFLEET_CGROUP_PARENT=sf-ab-$st SANDFLEET_CACHE=/var/tmp/sf-ab-cache-$st PYTHONPATH=$pp \
      .venv/bin/python -c "from sandfleet.cli import main; main()" bench micro --backend bwrap --json \
      > "$out/$side-$i.json"
  done
done
for f in "$out"/*.json; do
  .venv/bin/python - "$f" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))
print(f"{os.path.basename(sys.argv[1]):18} create_exec_close_p50_ms {d['create_exec_close_p50_ms']:6.2f}  "
      f"exec_rtt_p50_ms {d['exec_rtt_p50_ms']:.3f}  exec_rtt_ratio {d['exec_rtt_ratio']:.2f}  "
      f"idle_pss_mib {d['idle_pss_mib']:.3f}  exec_per_s_64 {d['exec_per_s_64']:.0f}")
PY
done
