#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
p = "todo.py"
s = open(p).read()
s = s.replace('a.add_argument("--priority", default=3)', 'a.add_argument("--priority", type=int, default=3)')
s = s.replace('l.add_argument("--all", action="store_false")', 'l.add_argument("--all", action="store_true")')
s = s.replace('l.add_argument("--limit")', 'l.add_argument("--limit", type=int)')
s = s.replace('d.add_argument("id")', 'd.add_argument("id", type=int)')
open(p, "w").write(s)
PY
