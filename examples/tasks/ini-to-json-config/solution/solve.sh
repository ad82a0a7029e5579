#!/bin/bash
set -euo pipefail
cat > /app/convert_config.py <<'PY'
"""Convert an INI file to JSON: python3 convert_config.py INPUT.ini OUTPUT.json"""
import configparser
import json
import re
import sys

INT = re.compile(r"[+-]?\d+")
FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|[+-]?\d+[eE][+-]?\d+")
TRUE, FALSE = {"true", "yes", "on"}, {"false", "no", "off"}


def quoted(v):
    return len(v) >= 2 and v[0] == v[-1] == '"'


def scalar(v):
    v = v.strip()
    if v == "":
        return None
    if quoted(v):
        return v[1:-1]
    if v.lower() in TRUE:
        return True
    if v.lower() in FALSE:
        return False
    if INT.fullmatch(v):
        return int(v)
    if FLOAT.fullmatch(v):
        return float(v)
    return v


def value(v):
    v = v.strip()
    if "," in v and not quoted(v):
        return [scalar(x) for x in v.split(",")]
    return scalar(v)


def main(src, dst):
    cp = configparser.ConfigParser(interpolation=None)
    with open(src, encoding="utf-8") as f:
        cp.read_file(f)
    out = {}
    for section in cp.sections():
        node = out
        for part in section.split("."):
            node = node.setdefault(part, {})
        for key, raw in cp.items(section):
            node[key] = value(raw)
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
PY
python3 /app/convert_config.py /app/legacy/app.ini /app/config.json
cat /app/config.json
