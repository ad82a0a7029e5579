"""``Sandbox.get_metrics()`` from the sandbox's own cgroups (v1 or v2) and its disk.

CPU is the group's usage (cpuacct or cpu.stat; else its processes' times in /proc) between
two samples (the last call's, or one taken 100 ms before);
memory is the group's usage, limit and page cache; disk is ``df`` of the sandbox's root, run
inside it. A sandbox without cgroups (the process backend, a microVM) has no CPU and memory
figures: the call is refused naming why, never answered with zeros.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

from sandfleet.server.e2b.wire import CPError, rfc3339, unsupported
from sandfleet.server.service import Entry

_last: dict[str, tuple[float, int]] = {}
"""Per sandbox: (monotonic time, CPU ns) of its last sample."""


def forget(sid: str) -> None:
    """Drop a sandbox's last sample (it was killed)."""
    _last.pop(sid, None)


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


async def metrics(e: Entry) -> list[dict[str, Any]]:
    cg = getattr(e.sb, "cgroup", None)
    dirs: list[Path] = list(getattr(cg, "dirs", []) or [])
    if not dirs:
        raise unsupported("get_metrics", f"the {e.sb.backend} sandbox {e.sb.id} has no cgroups to read them from")
    cpu, used, limit, cache = cgroup_figures(dirs)
    if cpu is None or used is None:
        raise unsupported("get_metrics", f"the cgroups of sandbox {e.sb.id} report no CPU or memory usage")
    now = time.monotonic()
    last = _last.get(e.sb.id)
    if last is None or now - last[0] < 0.05:
        await asyncio.sleep(0.1)
        last = (now, cpu)
        now = time.monotonic()
        cpu = cgroup_figures(dirs)[0] or cpu
    _last[e.sb.id] = (now, cpu)
    cpus = e.spec.limits.cpus or (os.cpu_count() or 1)
    pct = max(0.0, (cpu - last[1]) / 1e9 / max(now - last[0], 1e-6) / cpus * 100)
    total = limit if limit is not None and limit < (1 << 60) else _mem_total()
    try:
        df = await e.sb.exec(["df", "-P", "-B1", "/"], cwd="/", user="root", timeout=10)
        size, used_disk = (int(x) for x in df.stdout.splitlines()[-1].split()[1:3])
    except Exception as err:  # a sandbox without df, or one that died: the figure is unknown, not 0
        raise CPError(500, f"get_metrics: df in sandbox {e.sb.id} failed: {err}") from None
    t = time.time()
    return [{"timestamp": rfc3339(t), "timestampUnix": int(t), "cpuCount": max(1, round(cpus)),
             "cpuUsedPct": round(pct, 2), "memUsed": used, "memTotal": total, "memCache": cache or 0,
             "diskUsed": used_disk, "diskTotal": size}]
