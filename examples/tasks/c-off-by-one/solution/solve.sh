#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
p = "rollavg.c"
s = open(p).read()
s = s.replace("while (n <= MAX_VALUES && scanf", "while (n < MAX_VALUES && scanf")
s = s.replace("for (int i = k; i < n; i++) {", "for (int i = k - 1; i < n; i++) {")
s = s.replace("for (int j = i - k; j < i; j++)", "for (int j = i - k + 1; j <= i; j++)")
open(p, "w").write(s)
PY
gcc -O2 -Wall -o rollavg rollavg.c
printf '1 2 3 4\n' | ./rollavg 2
