#!/bin/bash
set -euo pipefail
cat > /app/extract.py <<'PY'
"""Extract e-mail addresses and US phone numbers from a text file."""
import json
import re
import sys

EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![A-Za-z0-9-])")
PHONE = re.compile(r"(?<!\d)(?:\+1[ -])?(?:\((\d{3})\) |(\d{3})[-. ])(\d{3})[-. ](\d{4})(?!\d)")


def extract(text):
    emails = {m.group(0).lower() for m in EMAIL.finditer(text)}
    phones = {f"+1-{m.group(1) or m.group(2)}-{m.group(3)}-{m.group(4)}" for m in PHONE.finditer(text)}
    return {"emails": sorted(emails), "phones": sorted(phones)}


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print(json.dumps(extract(f.read()), indent=2))
PY
python3 /app/extract.py /app/data/inbox.txt
