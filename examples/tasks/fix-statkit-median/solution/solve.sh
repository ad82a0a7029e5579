#!/bin/bash
# Reference solution: sort before taking the median, use both middle values,
# and divide the sample variance by n - 1.
set -euo pipefail
cd /app
python3 - <<'PY'
import re
p = "statkit/stats.py"
s = open(p).read()
s = s.replace("""    data = _require_data(values)
    n = len(data)
    mid = n // 2""", """    data = sorted(_require_data(values))
    n = len(data)
    mid = n // 2""")
s = s.replace("return (data[mid] + data[mid + 1]) / 2", "return (data[mid - 1] + data[mid]) / 2")
s = s.replace("return sum((x - m) ** 2 for x in data) / len(data)",
              "return sum((x - m) ** 2 for x in data) / (len(data) - 1)")
open(p, "w").write(s)
PY
python3 -m pytest -q -p no:cacheprovider tests
