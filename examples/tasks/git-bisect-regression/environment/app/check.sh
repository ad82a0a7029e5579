#!/bin/bash
# Regression check: run from inside /app/repo (any checkout). Exit 0 = good, 1 = bad.
python3 - <<'PY'
import sys
sys.path.insert(0, ".")
from slugify import slugify
ok = slugify("Top 10 Tips for 2024") == "top-10-tips-for-2024"
sys.exit(0 if ok else 1)
PY
