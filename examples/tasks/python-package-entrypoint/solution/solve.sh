#!/bin/bash
set -euo pipefail
cd /app/textstats
# Break the import cycle: report.py only needs WordStats when formatting.
python3 - <<'PY'
p = "report.py"
s = open(p).read()
s = s.replace("from textstats.core import WordStats\n\n\n", "")
s = s.replace("def format_report(stats, top):\n", "def format_report(stats, top):\n    from textstats.core import WordStats\n\n")
open(p, "w").write(s)
PY
cat > __main__.py <<'PY'
import sys

from textstats.cli import main

sys.exit(main())
PY
cd /app && python3 -m textstats sample.txt --top 2
