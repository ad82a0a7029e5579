"""What the chaos tests share: task folders, and the leak check they end with (not tests)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

from sandfleet.rollout.result import RolloutResult


def leaks(ids: Iterable[str | None], *, marks: Iterable[str] = (), state: Path | None = None,
          settle_s: float = 5.0) -> list[str]:
    """What is left on this host of the sandboxes ``ids``, or of anything whose command line
    names one of ``marks``: markers (finished, and ``.new-*`` ones a creator had not
    finished) and snapshot markers in the state directory, cgroups,
    processes, mounts (this host's mount namespace), loop devices backed by a file under a
    mark, and zombies among this process's children. Waits up to ``settle_s`` for what is
    already on its way out (a close in flight); empty when nothing is left."""
    from sandfleet.sandbox import cgroups
    from sandfleet.sandbox.state import state_root

    wanted = {i for i in ids if i}
    needles = [*wanted, *(str(m) for m in marks)]
    root = state or state_root()
    end = time.monotonic() + settle_s
    while True:
        found = [f"marker {i}" for i in sorted(wanted) if (root / i).exists()]
        found += [f"marker {p.name}" for p in root.glob("sf-*")] if state is not None else []
        found += [f"unfinished marker {p.name}" for p in root.glob(".new-*")
                  if state is not None or any(i in p.name for i in wanted)]
        found += [f"cgroup {parent}/{name}" for name, parent in sorted(cgroups.leftover_groups()) if name in wanted]
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == os.getpid():
                continue
            try:
                cmd = (p / "cmdline").read_bytes()
                stat = (p / "stat").read_text()
            except OSError:
                continue
            rest = stat[stat.rindex(")") + 2:].split()
            if rest[0] == "Z" and int(rest[1]) == os.getpid():
                found.append(f"zombie {p.name} {stat[stat.index('(') + 1:stat.rindex(')')]} "
                             f"(group {rest[2]}, session {rest[3]})")
            elif any(n.encode() in cmd for n in needles):
                shown = cmd.replace(b"\0", b" ")[:160].decode(errors="replace")
                found.append(f"process {p.name}: {shown}")
        mounts = Path("/proc/self/mountinfo").read_text()
        found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if any(n in line for n in needles)]
        for lo in Path("/sys/block").glob("loop*"):
            try:
                backing = (lo / "loop" / "backing_file").read_text().strip()
            except OSError:
                continue
            if any(str(m) in backing for m in marks):
                found.append(f"loop device {lo.name}: {backing}")
        if not found or time.monotonic() > end:
            return found
        time.sleep(0.1)


def one_final_each(results: list[RolloutResult], tasks: Iterable[str], n: int) -> None:
    """Nothing lost, nothing counted twice: one final result per (task, sample)."""
    got = sorted((r.task, r.sample) for r in results)
    assert got == sorted((t, i) for t in tasks for i in range(n)), got
    assert all(r.final for r in results)
