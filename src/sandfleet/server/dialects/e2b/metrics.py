"""``Sandbox.get_metrics()``: a series over the sandbox's life, as E2B's (one sample every
5 s), from the sandbox's own cgroups (v1 or v2) and its disk.

A sampler (:func:`sample_loop`, started with the service) takes a sample of every E2B sandbox
every :data:`SAMPLE_S` seconds; ``get_metrics(start, end)`` answers the samples between the two
(default: the sandbox's whole life, at most :data:`KEEP` of the newest). CPU is the group's usage
(cpuacct or cpu.stat; else its processes' times in /proc) since the previous sample (the first:
since the sandbox started); memory is the group's usage, limit and page cache; disk is ``df``
of the sandbox's root, run inside it at most every :data:`DISK_EVERY_S` seconds (a sample in
between carries the last figure). A call before the first sample takes one. A sandbox without
cgroups (the process backend, a microVM) has no CPU and memory figures: the call is refused
naming why, never answered with zeros.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.server.dialects.e2b.state import Boxes
from sandfleet.server.dialects.e2b.wire import CPError, rfc3339, unsupported
from sandfleet.server.service import Entry

log = logging.getLogger(__name__)

SAMPLE_S = 5.0
"""Seconds between two samples of a sandbox (E2B's own period)."""
DISK_EVERY_S = 30.0
"""Seconds between two ``df`` runs in a sandbox (an exec: dearer than reading its cgroups)."""
KEEP = 2880
"""Samples kept per sandbox (4 hours of them, about 0.4 MB); older ones are dropped."""
SAMPLERS = 8
"""Sandboxes sampled at once."""


Sample = tuple[float, int, float, int, int, int, int, int]
"""(Unix time, CPUs, CPU %, memory used, memory in all, page cache, disk used, disk in all):
a tuple, not the answer's dict, to keep 4 hours of many sandboxes small."""


def _row(x: Sample) -> dict[str, Any]:
    t, cpus, pct, used, total, cache, disk_used, disk_total = x
    return {"timestamp": rfc3339(t), "timestampUnix": int(t), "cpuCount": cpus, "cpuUsedPct": pct,
            "memUsed": used, "memTotal": total, "memCache": cache, "diskUsed": disk_used, "diskTotal": disk_total}


@dataclass(eq=False)
class Series:
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=KEEP))
    cpu: tuple[float, int] | None = None
    """(monotonic time, CPU ns) of the last sample."""
    disk: tuple[int, int] | None = None
    """(bytes used, bytes in all) from the last df."""
    disk_at: float = 0.0


_series: dict[str, Series] = {}
"""Per sandbox (sandfleet id): its samples."""


def forget(sid: str) -> None:
    """Drop a sandbox's samples (it was killed)."""
    _series.pop(sid, None)


def _read_int(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().split()[0])
    return None


def _stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[k] = int(v)
    return out


def cgroup_figures(dirs: list[Path]) -> tuple[int | None, int | None, int | None, int | None]:
    """(CPU ns used, memory bytes used, memory limit, page cache) of a sandbox's groups."""
    cpu = used = limit = cache = None
    for d in dirs:
        if (d / "cpu.stat").exists() and (d / "memory.current").exists():  # v2: one group
            usage = _stat(d / "cpu.stat").get("usage_usec")
            cpu = usage * 1000 if usage is not None else None
            used = _read_int(d / "memory.current")
            raw = (d / "memory.max").read_text().strip() if (d / "memory.max").exists() else "max"
            limit = None if raw == "max" else int(raw)
            cache = _stat(d / "memory.stat").get("file")
        if (d / "cpuacct.usage").exists():
            cpu = _read_int(d / "cpuacct.usage")
        if (d / "memory.usage_in_bytes").exists():
            used = _read_int(d / "memory.usage_in_bytes")
            limit = _read_int(d / "memory.limit_in_bytes")
            st = _stat(d / "memory.stat")
            cache = st.get("total_cache", st.get("cache"))
    if cpu is None:
        cpu = _procs_cpu(dirs)
    return cpu, used, limit, cache


def _procs_cpu(dirs: list[Path]) -> int | None:
    """CPU ns of the group's processes from /proc (their own time and their reaped children's):
    for a v1 host whose sandboxes have a cpu group but no cpuacct one."""
    pids: set[int] = set()
    for d in dirs:
        for f in [d / "cgroup.procs", *d.glob("*/cgroup.procs")]:
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in f.read_text().split())
    if not pids:
        return None
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks * 1_000_000_000 // (os.sysconf("SC_CLK_TCK") or 100)


def _mem_total() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def _dirs(e: Entry) -> list[Path]:
    cg = getattr(e.sb, "cgroup", None)
    return list(getattr(cg, "dirs", []) or [])


async def take(e: Entry) -> dict[str, Any]:
    """One sample of the sandbox, appended to its series."""
    dirs = _dirs(e)
    if not dirs:
        raise unsupported("get_metrics", f"the {e.sb.backend} sandbox {e.sb.id} has no cgroups to read them from")
    cpu, used, limit, cache = cgroup_figures(dirs)
    if cpu is None or used is None:
        raise unsupported("get_metrics", f"the cgroups of sandbox {e.sb.id} report no CPU or memory usage")
    s = _series.setdefault(e.sb.id, Series())
    now = time.monotonic()
    if s.cpu is None:  # the first sample: the average since the sandbox started
        spent, took = cpu, time.time() - e.created
    else:
        spent, took = cpu - s.cpu[1], now - s.cpu[0]
    s.cpu = (now, cpu)
    cpus = e.spec.limits.cpus or (os.cpu_count() or 1)
    pct = max(0.0, spent / 1e9 / max(took, 1e-3) / cpus * 100)
    total = limit if limit is not None and limit < (1 << 60) else _mem_total()
    if s.disk is None or now - s.disk_at >= DISK_EVERY_S:
        try:
            df = await e.sb.exec(["df", "-P", "-B1", "/"], cwd="/", user="root", timeout=10)
            size, used_disk = (int(x) for x in df.stdout.splitlines()[-1].split()[1:3])
        except Exception as err:  # a sandbox without df, or one that died: the figure is unknown, not 0
            raise CPError(500, f"get_metrics: df in sandbox {e.sb.id} failed: {err}") from None
        s.disk, s.disk_at = (used_disk, size), now
    x: Sample = (time.time(), max(1, round(cpus)), round(pct, 2), used, total, cache or 0, *s.disk)
    s.samples.append(x)
    return _row(x)


async def metrics(e: Entry, start: int | None = None, end: int | None = None) -> list[dict[str, Any]]:
    """The sandbox's samples with ``start <= timestampUnix <= end`` (Unix seconds; None: open)."""
    s = _series.get(e.sb.id)
    if s is None or not s.samples:
        await take(e)
        s = _series[e.sb.id]
    return [_row(x) for x in s.samples if (start is None or int(x[0]) >= start) and (end is None or int(x[0]) <= end)]


async def sample_loop(e2b: Boxes) -> None:
    """Every SAMPLE_S seconds, a sample of each live E2B sandbox that has cgroups."""
    gate = asyncio.Semaphore(SAMPLERS)

    async def one(e: Entry) -> None:
        async with gate:
            try:
                await take(e)
            except Exception as err:  # dying, or its cgroups went: the next round tries again
                log.debug("e2b metrics: sample of %s: %s", e.sb.id, err)

    due = time.monotonic()
    while True:
        due += SAMPLE_S
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        due = max(due, time.monotonic() - SAMPLE_S)  # a slow round does not make a burst after it
        live = [e for sid in list(e2b.boxes) if (e := e2b.service.live.get(sid)) is not None
                and e.sb.alive and _dirs(e)]
        await asyncio.gather(*(one(e) for e in live))
