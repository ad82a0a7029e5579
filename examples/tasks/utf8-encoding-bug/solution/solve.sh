#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
p = "table.py"
s = open(p).read()
s = s.replace('with open(path, encoding="latin-1") as f:', 'with open(path, encoding="utf-8-sig", newline="") as f:')
s = s.replace('len(r["name"].encode())', 'len(r["name"])')
s = s.replace('len(r["city"].encode())', 'len(r["city"])')
s = s.replace('r["name"].encode()))', 'r["name"]))')
s = s.replace('if __name__ == "__main__":\n    print(', 'if __name__ == "__main__":\n    sys.stdout.reconfigure(encoding="utf-8")\n    print(')
open(p, "w").write(s)
PY
python3 table.py data/payments.csv
