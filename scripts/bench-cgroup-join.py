#!/usr/bin/env python3
"""What joining a cgroup costs a bare command, the two ways: ``echo $$ > cgroup.procs``
(the whole thread group: the global threadgroup lock, an RCU grace period for its first
writer after a quiet spell) against ``echo 0 > tasks`` (v1: the thread alone, as the
sandboxes' launcher and guest agent join), for a group with the sandboxes' limits in every
v1 hierarchy it has. ``scripts/bench-cgroup-join.py [N]``: N runs of each, alternating, of
``bash -c '<joins> && true'``; prints p50 and p90 in ms. Needs root and cgroup v1."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from sandfleet.sandbox import Limits, cgroups  # noqa: E402


def main(n: int) -> None:
    cg = cgroups.sandbox_cgroup(f"sf-joincost-{uuid.uuid4().hex[:8]}", Limits())
    if cg is None or cg.layout.version == "v2":
        raise SystemExit("needs root and cgroup v1 (on v2 both ways are cgroup.procs)")
    cg.create(Limits())
    try:
        ways = {"cgroup.procs": " && ".join(f"echo $$ > {f}" for f in cg.procs_files),
                "tasks": " && ".join(f"echo 0 > {f}" for f in cg.join_files)}
        got: dict[str, list[float]] = {k: [] for k in ways}
        for i in range(n):
            for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
                t = time.perf_counter()
                subprocess.run(["bash", "-c", ways[name] + " && true"], check=True)
                got[name].append((time.perf_counter() - t) * 1e3)
        for name, ts in got.items():
            q = statistics.quantiles(ts, n=10)
            print(f"{name:13} ({len(cg.dirs)} hierarchies) p50 {statistics.median(ts):.2f} ms  "  # noqa: T201
                  f"p90 {q[8]:.2f} ms  over {n}")
    finally:
        cg.remove()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
