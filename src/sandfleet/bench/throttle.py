"""Slower-host emulation for the benchmark process itself.

Sandboxes, and the bare baseline's workers (whose cgroups are made by the same
:mod:`sandfleet.sandbox.cgroups` from the sandboxes' limits), are throttled by
:func:`sandfleet.sandbox.cgroups.throttled_parent` (one parent group with f x T CPUs, every
group's own quota scaled by f). This module does the same for this process: with
``fraction`` f on a host of T hardware threads, a group ``sandfleet-bench/run-<pid>`` gets
f x T CPUs, and the benchmark's own process a child with f CPUs (:meth:`Throttle.child` makes
more such children). The period is short (10 ms) so a 50 ms command feels it.
The group lives outside the sandbox groups, so the reaper leaves it alone;
:meth:`Throttle.close` removes it.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox import cgroups, spawner

PERIOD_US = 10_000
TOP = "sandfleet-bench"


class Throttle:
    """A CPU-throttled cgroup tree for one benchmark run."""

    def __init__(self, fraction: float, threads: int | None = None):
        if not 0 < fraction <= 1:
            raise ValueError(f"throttle fraction must be in (0, 1], not {fraction}")
        lay = cgroups.detect()
        if not lay.usable or "cpu" not in lay.mounts:
            raise HostUnsupportedError("CPU throttling needs a writable cgroup cpu controller (root)")
        self.fraction = fraction
        self.threads = threads or os.cpu_count() or 1
        self.v2 = lay.version == "v2"
        self.root = lay.mounts["cpu"] / TOP / f"run-{os.getpid()}"
        self._home = self._own_group()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.v2:
            for d in (self.root.parent, self.root):
                with contextlib.suppress(OSError):
                    (d / "cgroup.subtree_control").write_text("+cpu +memory +pids")
        self._quota(self.root, fraction * self.threads)
        self.child("self", [os.getpid()])
        spawner.reset()  # the sandboxes' processes start in the spawner's group: ours from now on

    def _own_group(self) -> Path:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if (self.v2 and ctrls == "") or "cpu" in ctrls.split(","):
                return cgroups.detect().mounts["cpu"] / path.lstrip("/")
        return cgroups.detect().mounts["cpu"]

    def _quota(self, d: Path, cpus: float) -> None:
        quota = max(1000, int(cpus * PERIOD_US))
        if self.v2:
            (d / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (d / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (d / "cpu.cfs_quota_us").write_text(str(quota))

    def child(self, name: str, pids: tuple[int, ...] | list[int] = ()) -> Path:
        """A child group with one slower thread's quota, holding ``pids``."""
        d = self.root / name
        d.mkdir(exist_ok=True)
        self._quota(d, self.fraction)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (d / "cgroup.procs").write_text(str(pid))
        return d

    def procs_file(self, name: str) -> Path:
        """The file a bare worker's shell writes itself ("0") into: v1's ``tasks`` (no global
        threadgroup lock, as the sandboxes join theirs), else ``cgroup.procs``."""
        d = self.child(name)
        return d / "tasks" if (d / "tasks").exists() else d / "cgroup.procs"

    def close(self) -> None:
        """Move this process home and remove the (emptied) groups."""
        with contextlib.suppress(OSError):
            (self._home / "cgroup.procs").write_text(str(os.getpid()))
        spawner.reset()  # (one left in our group would keep it from being removed)
        for d in sorted((p for p in self.root.iterdir() if p.is_dir()), reverse=True):
            self._rmdir(d)
        self._rmdir(self.root)
        with contextlib.suppress(OSError):  # the shared top group, once no run uses it
            self.root.parent.rmdir()

    @staticmethod
    def _rmdir(d: Path) -> None:
        end = time.monotonic() + 5
        while d.exists():
            try:
                d.rmdir()
                return
            except OSError:
                if time.monotonic() > end:
                    return
                time.sleep(0.05)
