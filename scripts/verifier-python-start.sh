#!/bin/bash
# scripts/verifier-python-start.sh [BACKEND] [RUNS]: what a Python costs inside the verifier (the tests' environment:
# the guard first on PYTHONPATH, the seal preloaded), as the tests see it. Runs a no-op rollout of a task whose
# test script times `python3 -c pass` (20 times) and `python3 -m pytest --version` (10 times) and prints the mean
# of each in ms, RUNS times (default 3). BACKEND: bwrap (default), gvisor or microvm (under TCG: 2 and 1 times).
# The image is examples/tasks/git-bisect-regression's (Debian bookworm's Python 3.11, pytest 8.3).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
backend=${1:-bwrap}
runs=${2:-3}
n1=20; n2=10
if [ "$backend" = microvm ]; then n1=2; n2=1; fi
work=$(mktemp -d -t sandfleet-pystart.XXXXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$here/examples/tasks/git-bisect-regression" "$work/task"
cat > "$work/task/tests/test.sh" <<SH
#!/bin/bash
mkdir -p /logs/verifier
cd /app
export PYTHONDONTWRITEBYTECODE=1
python3 -c pass; python3 -m pytest --version >/dev/null 2>&1
s=\$(date +%s%N); for i in \$(seq $n1); do python3 -c pass; done; e=\$(date +%s%N)
s2=\$(date +%s%N); for i in \$(seq $n2); do python3 -m pytest --version >/dev/null 2>&1; done; e2=\$(date +%s%N)
echo "TIMES python_c_pass_ms=\$(( (e-s)/($n1*1000000) )) pytest_version_ms=\$(( (e2-s2)/($n2*1000000) ))"
echo 0 > /logs/verifier/reward.txt
SH
py="$here/.venv/bin/python"
for i in $(seq "$runs"); do
  rm -rf "$work/out"
  "$py" -m sandfleet run --tasks "$work" --agent noop --backend "$backend" -n 1 --out "$work/out" >/dev/null 2>&1
  "$py" -c "
import json, sys
r = json.loads(open(sys.argv[1]).readline())
line = [x for x in (r.get('verifier_output') or '').splitlines() if x.startswith('TIMES ')]
print('$backend run $i:', line[0][6:] if line else 'no figure (%s)' % r.get('reason'))" "$work/out/rollouts.jsonl"
done
