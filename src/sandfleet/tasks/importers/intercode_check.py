# ruff: noqa: T201, PTH115  -- a script run inside the sandbox, printing is its output
"""InterCode-Bash check, copied into each task's tests/ as check.py (stdlib only).

Rebuilds the pristine testbed under /tmp/gold, runs the gold command there from /tmp/gold
(InterCode runs it from /), then compares /testbed with the gold tree and /app/answer.txt
with the gold output. Exit status 0 = pass.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from sandfleet.settings import child_env

GOLD_ROOT = "/testbed"


def build(root, testbed):
    for d in testbed["dirs"]:
        (root / d).mkdir(parents=True, exist_ok=True)
    for path, spec in testbed["files"].items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(spec["content"])
        (root / path).chmod(spec["mode"])


def normalize_text(text, gold_dir):
    return text.replace(gold_dir, GOLD_ROOT)


def lines(text):
    out = []
    for line in text.splitlines():
        words = [w.rstrip("/") or "/" for w in line.split()]
        if words:
            out.append(" ".join(words))
    return sorted(out)


def tree(root, gold_dir):
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                entries[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[rel] = ("dir", None)
            else:
                text = path.read_bytes().decode("utf-8", "replace")
                entries[rel] = ("file", normalize_text(text, gold_dir))
    return entries


def same_content(a, b):
    return a == b or (a[0] == b[0] == "file" and lines(a[1]) == lines(b[1]))


def main():
    case = json.loads(Path("/tests/case.json").read_text())
    base = Path(tempfile.mkdtemp(prefix="gold-", dir="/tmp"))
    gold_dir = str(base / "testbed")
    build(Path(gold_dir), case["testbed"])
    command = re.sub(r"(?<![\w./])/testbed", gold_dir, case["gold"])
    run = subprocess.run(
        ["bash", "-c", command],
        cwd=base,
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env({"HOME": str(base)}),
    )
    gold_out = normalize_text(run.stdout, gold_dir)
    ok = True
    agent, gold = tree(Path(GOLD_ROOT), GOLD_ROOT), tree(Path(gold_dir), gold_dir)
    for rel in sorted(set(agent) | set(gold)):
        if rel not in agent or rel not in gold or not same_content(agent[rel], gold[rel]):
            print(
                f"/testbed/{rel}: differs from the gold result "
                f"(agent: {agent.get(rel, ('absent',))[0]}, gold: {gold.get(rel, ('absent',))[0]})"
            )
            ok = False
    if lines(gold_out):
        answer = Path("/app/answer.txt")
        got = answer.read_text(errors="replace") if answer.is_file() else None
        if got is None:
            print("/app/answer.txt: missing; the gold command prints output")
            ok = False
        elif lines(got) != lines(gold_out):
            print("/app/answer.txt: differs from the gold output")
            print("expected:\n" + gold_out)
            ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
