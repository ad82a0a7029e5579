#!/bin/bash
set -euo pipefail
cat > /app/logreport.py <<'PY'
"""Summarise a combined-format access log as JSON."""
import json
import re
import sys
from collections import Counter

LINE = re.compile(r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) (\S+)" (\d{3}) (\d+|-) "[^"]*" "[^"]*"$')


def report(lines):
    total = malformed = bytes_sent = 0
    ips, status, paths = set(), Counter(), Counter()
    for line in lines:
        line = line.rstrip("\n")
        if line == "":
            continue
        m = LINE.match(line)
        if not m:
            malformed += 1
            continue
        total += 1
        ips.add(m.group(1))
        status[m.group(6)] += 1
        paths[m.group(4).split("?", 1)[0]] += 1
        if m.group(7) != "-":
            bytes_sent += int(m.group(7))
    top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return {
        "total_requests": total,
        "malformed_lines": malformed,
        "unique_ips": len(ips),
        "status_counts": dict(status),
        "top_paths": [[p, c] for p, c in top],
        "bytes_sent": bytes_sent,
        "server_errors": sum(c for s, c in status.items() if s.startswith("5")),
    }


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        print(json.dumps(report(f), indent=2))
PY
python3 /app/logreport.py /app/logs/access.log
