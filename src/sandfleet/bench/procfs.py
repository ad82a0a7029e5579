"""/proc and PSS helpers for the benchmarks: memory, process trees, file-descriptor limit."""

from __future__ import annotations

import resource
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandfleet.sandbox.base import Sandbox


def raise_nofile() -> None:
    """Raise this process's open-file limit to its hard limit (many sandboxes, many fds)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def pss_kib(pid: int) -> int:
    """Proportional set size of one process in KiB (0 when it is gone or unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children_map() -> dict[int, list[int]]:
    """ppid -> child pids, read once from /proc."""
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p.name))
    return kids


def process_tree(pid: int, kids: dict[int, list[int]]) -> list[int]:
    """``pid`` and all its descendants, from a :func:`children_map`."""
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo.extend(kids.get(q, []))
    return out


def sandbox_pss_kib(sandboxes: list[Sandbox]) -> float:
    """Mean PSS of each sandbox's process tree (launcher/bwrap/agent or VMM)."""
    roots = [getattr(getattr(sb, "agent", None), "proc", None) for sb in sandboxes]
    pids = [p.pid for p in roots if p is not None]
    if not pids:
        return 0.0
    kids = children_map()
    return sum(pss_kib(q) for pid in pids for q in process_tree(pid, kids)) / len(pids)


def meminfo() -> dict[str, int]:
    """``/proc/meminfo`` as name -> kB."""
    d = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        k, v = line.split(":", 1)
        d[k] = int(v.split()[0])
    return d
