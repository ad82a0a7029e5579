#!/usr/bin/env python3
# ruff: noqa: T201
"""How the whole suite's time was spent, from a run with SANDFLEET_TEST_TIMELINE=DIR
(tests/conftest.py: each pytest process appends each test's start and end to DIR).

    SANDFLEET_TEST_TIMELINE=/tmp/tl scripts/test.sh
    scripts/test-timeline.py /tmp/tl                 # per process: span, busy, idle tail, CPU
    scripts/test-timeline.py /tmp/tl --write         # and tests/module_seconds.json

A pass's processes (its workers, its waits lane, its serial part) are told apart by pid. The
tail of a worker is how long it sat idle at the end of its pass while another worker of the
same pass still ran: what ordering the modules longest first (tests/conftest.py) cuts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(folder: Path) -> list[dict]:
    rows = []
    for f in sorted(folder.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row.get("start") is not None:
                rows.append(row)
    if not rows:
        sys.exit(f"no test timings under {folder} (run the suite with SANDFLEET_TEST_TIMELINE={folder})")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--write", action="store_true", help="write tests/module_seconds.json from this run")
    args = ap.parse_args()
    rows = load(args.folder)
    t0 = min(r["start"] for r in rows)
    procs: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        procs[r["pid"]].append(r)
    spans = []
    for pid, rs in procs.items():
        start, end = min(r["start"] for r in rs), max(r["end"] for r in rs)
        busy = sum(r["end"] - r["start"] for r in rs)
        spans.append({"pid": pid, "worker": rs[0]["worker"], "start": start - t0, "end": end - t0, "busy": busy,
                      "tests": len(rs), "last": max(rs, key=lambda r: r["end"])["nodeid"]})
    spans.sort(key=lambda s: s["start"])
    # a pass: the workers (gw*) whose spans overlap
    print(f"{'process':>12} {'from s':>8} {'to s':>8} {'busy s':>8} {'tests':>6} {'idle tail s':>11}  last test")
    workers = [s for s in spans if s["worker"].startswith("gw")]
    for s in spans:
        peers = [w for w in workers if w is not s and w["start"] < s["end"] and s["start"] < w["end"]]
        tail = max((w["end"] for w in peers), default=s["end"]) - s["end"] if s in workers else 0.0
        print(f"{s['worker'] + ':' + str(s['pid']):>12} {s['start']:8.1f} {s['end']:8.1f} {s['busy']:8.1f} "
              f"{s['tests']:6d} {max(0.0, tail):11.1f}  {s['last']}")
    print(f"whole: {max(s['end'] for s in spans):.1f} s from the first test to the last")
    modules: dict[str, float] = defaultdict(float)
    for r in rows:
        modules[r["nodeid"].split("::", 1)[0]] += r["end"] - r["start"]
    top = sorted(modules.items(), key=lambda kv: -kv[1])[:15]
    print("longest modules: " + ", ".join(f"{m} {v:.0f} s" for m, v in top))
    # what each process's tests burned (their own CPU and their reaped children's) and how busy the host's
    # CPUs were meanwhile: a pass whose host stays near 1.0 is CPU-bound (only less work makes it shorter),
    # one well under it waits (more workers, or its tests in the waits lane, use the rest)
    timed = [r for r in rows if r.get("host_busy") is not None]
    if timed:
        print(f"\n{'process':>12} {'cpu s':>8} {'host busy':>9}")
        for s in spans:
            rs = [r for r in procs[s["pid"]] if r.get("host_busy") is not None]
            wall = sum(r["end"] - r["start"] for r in rs)
            if rs and wall > 0:
                busy = sum(r["host_busy"] * (r["end"] - r["start"]) for r in rs) / wall
                print(f"{s['worker'] + ':' + str(s['pid']):>12} {sum(r['cpu_s'] for r in rs):8.1f} {busy:9.2f}")
    if args.write:
        out = ROOT / "tests" / "module_seconds.json"
        out.write_text(json.dumps({"about": "seconds per test module in the whole suite (scripts/test-timeline.py "
                                            "--write); the xdist workers take the modules longest first",
                                   "modules": {m: round(v, 1) for m, v in sorted(modules.items())}},
                                  indent=1) + "\n")
        print(f"wrote {out} ({len(modules)} modules)")


if __name__ == "__main__":
    main()
