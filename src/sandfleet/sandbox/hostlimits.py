"""The host limits that bound how many sandboxes one owner and one host hold at once: the
owner's open files, the host's tasks (``kernel.pid_max``, ``kernel.threads-max``).

An idle bwrap sandbox costs its owner about :data:`FDS_PER_IDLE` descriptors (the agent's
stdin and stdout, pidfds of the launcher and of its child, the uid slot's lock, and the loop disk's
file, mount and mount namespace) and the host about :data:`TASKS_PER_IDLE` tasks (the launcher (or bwrap), the
guest agent as the pid namespace's init, the loop device's kernel thread): measured on this host with
``sandfleet bench micro`` (docs/bench.md, "Density"). ``sandfleet doctor`` reports them.
"""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path
from typing import Any

FDS_PER_IDLE = 8
TASKS_PER_IDLE = 3
FD_RESERVE = 256
"""Descriptors an owner keeps free for everything else (its event loop, logs, exec pipes)."""
TASK_RESERVE = 2048
"""Tasks left free under the host's ceiling for the rest of the host (a shell must still fork)."""
PID_MAX_HINT = 4_194_304
"""The largest ``kernel.pid_max`` on 64-bit Linux: what to raise it to for many sandboxes."""


def open_fds() -> int:
    """Descriptors this process has open now."""
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


def nofile_soft() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 30


def host_tasks() -> int:
    """Tasks (threads) on the host now: /proc/loadavg's 'running/total'."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])


def task_limit() -> tuple[int, str]:
    """The host's task ceiling and the sysctl that sets it (the lower of pid_max and threads-max)."""
    limits = []
    for name in ("pid_max", "threads-max"):
        with contextlib.suppress(OSError, ValueError):
            limits.append((int(Path(f"/proc/sys/kernel/{name}").read_text()), f"kernel.{name}"))
    return min(limits) if limits else (PID_MAX_HINT, "kernel.pid_max")


def raise_to(cap: int) -> int:
    """A value to raise a task ceiling of ``cap`` to."""
    return PID_MAX_HINT if cap < PID_MAX_HINT else cap * 2


def report() -> dict[str, Any]:
    """The limits and how many idle bwrap sandboxes each allows (``sandfleet doctor``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap, name = task_limit()
    tasks = host_tasks()
    by_tasks = max(0, (cap - TASK_RESERVE - tasks) // TASKS_PER_IDLE)
    per_process = max(0, (nofile_soft() - FD_RESERVE) // FDS_PER_IDLE)
    hint = (f"{name} {cap} holds about {by_tasks} more idle sandboxes at ~{TASKS_PER_IDLE} tasks each; "
            f"for more: sysctl -w {name}={raise_to(cap)}")
    return {"open_files": {"soft": soft, "hard": hard}, "idle_per_process_by_open_files": per_process,
            "task_limit": {"name": name, "value": cap, "tasks_now": tasks}, "idle_by_tasks": by_tasks,
            "hint": hint}
