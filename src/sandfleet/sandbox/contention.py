"""How much a sandbox's runnable work waited for a CPU because of work outside it.

A :class:`Probe` watches one sandbox's cgroup for one phase of a rollout (the agent's, the
verifier's) and returns, on :meth:`Probe.stop`, the figures docs/rollouts.md
("Contention") defines:

- ``cpu_s`` and ``run_delay_s``: CPU time its tasks ran and time they sat runnable on a
  runqueue without running (``/proc/<tid>/schedstat`` fields 1 and 2, summed over the
  cgroup's threads, each read at every tick: a thread that exits between ticks loses at
  most its last tick). ``run_delay_s`` counts every cause of waiting: work outside the
  sandbox, the sandbox's own other threads, and its own CPU limit.
- ``throttled_s``, ``nr_throttled``: what the sandbox's own CPU limit (cfs quota) took
  (``cpu.stat`` ``throttled_time`` on v1, ``throttled_usec`` on v2). Its own doing.
- ``outside_runnable``: the mean number of runnable threads on the host outside the
  sandbox (``/proc/stat`` ``procs_running`` less the sandbox's threads in state R and the
  sampler itself) per CPU, over the ticks at which the sandbox had a runnable thread.
- ``busy_s``: the time the sandbox had a runnable thread (the ticks at which it had one,
  each worth the time since the previous tick).
- ``outside_wait_s``: the wait outside work explains, for one thread's worth of demand:
  the least of (a) the model: at each busy tick, one thread competing fairly with ``o``
  outside runnable threads on ``ncpu`` CPUs waits a fraction ``max(0, 1 - ncpu / (o + 1))``
  of the time since the previous tick, summed; (b) ``run_delay_s``, what its threads really
  waited; (c) the CPU it lacked: ``min(1, cpus, ncpu) * busy_s - cpu_s`` (at least 0), so a
  sandbox that got one thread's worth of its limit while it was busy lacked nothing. Its own
  threads never enter ``o``, its demand counts as one thread, and throttling by its own
  limit or its own threads queuing behind each other only raise ``run_delay_s`` and its CPU
  time, never (a) or (c): a sandbox can't raise this figure by loading its own CPU.
- ``outside_share``: ``outside_wait_s / (outside_wait_s + cpu_s)``, the share of the time
  the sandbox wanted a CPU that outside work took from it (a single thread slowed by a
  factor k has a share of 1 - 1/k).

Samples every :data:`TICK_S` in one daemon thread per process, shared by all probes.
Backends without a host cgroup of the sandbox's tasks (microvm, a remote service) have no
probe: their figures are null.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.sandbox.cgroups import Cgroup

TICK_S = 0.1
"""Seconds between samples."""


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _read(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 8192).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def procs_running() -> int | None:
    """Runnable threads on the host now (``/proc/stat`` ``procs_running``)."""
    try:  # /proc/stat can exceed one read's 8 KiB: read it whole
        text = Path("/proc/stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("procs_running "):
            return int(line.split()[1])
    return None


def host_psi_some_s() -> float | None:
    """The host's ``/proc/pressure/cpu`` ``some`` total in seconds (None without PSI)."""
    text = _read("/proc/pressure/cpu")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split():
                if part.startswith("total="):
                    return int(part[6:]) / 1e6
    return None


def _thread_state(tid: int) -> tuple[bool, int, int] | None:
    """(runnable, exec ns, run_delay ns) of one thread, None if it is gone."""
    stat = _read(f"/proc/{tid}/stat")
    sched = _read(f"/proc/{tid}/schedstat")
    if stat is None or sched is None:
        return None
    try:
        state = stat[stat.rindex(")") + 2]
        exec_ns, delay_ns = sched.split()[:2]
        return state == "R", int(exec_ns), int(delay_ns)
    except (ValueError, IndexError):
        return None


@dataclass
class Probe:
    """One sandbox's contention over one phase; :meth:`stop` gives the figures."""

    cgroup: Cgroup
    cpus: float | None = None
    """The sandbox's CPU limit (None: none), recorded beside the figures."""
    ncpu: int = field(default_factory=host_cpus)
    start_mono: float = field(default_factory=time.monotonic)
    _tids: dict[int, tuple[int, int]] = field(default_factory=dict)
    cpu_ns: int = 0
    delay_ns: int = 0
    modelled_wait_s: float = 0.0
    busy_s: float = 0.0
    busy_ticks: int = 0
    ticks: int = 0
    outside_sum: float = 0.0
    _last_tick: float | None = None
    _throttle0: tuple[int, int] | None = None
    _psi0: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._cpu_dir = self._cpu_dir_of(self.cgroup)
        self._throttle0 = self._throttled()
        self._psi0 = host_psi_some_s()
        self._threads_file = "tasks" if self.cgroup.layout.version != "v2" else "cgroup.threads"

    @staticmethod
    def _cpu_dir_of(cg: Cgroup) -> Path | None:
        root = cg.layout.mounts.get("cpu")
        return None if root is None else root / cg.parent / cg.name

    def _throttled(self) -> tuple[int, int] | None:
        """(throttled ns, nr_throttled) from the sandbox's ``cpu.stat``."""
        if self._cpu_dir is None:
            return None
        text = _read(str(self._cpu_dir / "cpu.stat"))
        if text is None:
            return None
        vals = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
        with contextlib.suppress(KeyError, ValueError):
            if "throttled_usec" in vals:
                return int(vals["throttled_usec"]) * 1000, int(vals.get("nr_throttled", 0))
            return int(vals["throttled_time"]), int(vals.get("nr_throttled", 0))
        return None

    def _list_tids(self) -> list[int]:
        if self._cpu_dir is None:
            return []
        dirs = [self._cpu_dir]
        with contextlib.suppress(OSError):
            dirs += [Path(e.path) for e in os.scandir(self._cpu_dir) if e.is_dir(follow_symlinks=False)]
        out: list[int] = []
        for d in dirs:
            text = None
            with contextlib.suppress(OSError):
                text = (d / self._threads_file).read_text()
            if text:
                out += [int(x) for x in text.split()]
        return out

    def tick(self, running: int | None) -> None:
        """One sample: the sandbox's threads, and ``running`` (the host's runnable threads)."""
        now = time.monotonic()
        with self._lock:
            dt = now - (self._last_tick if self._last_tick is not None else self.start_mono)
            self._last_tick = now
            own_r = 0
            seen: dict[int, tuple[int, int]] = {}
            for tid in self._list_tids():
                st = _thread_state(tid)
                if st is None:
                    continue
                runnable, exec_ns, delay_ns = st
                own_r += runnable
                prev = self._tids.get(tid)
                if prev is not None:  # a thread first seen counts from here (its past is not this phase's)
                    self.cpu_ns += max(0, exec_ns - prev[0])
                    self.delay_ns += max(0, delay_ns - prev[1])
                seen[tid] = (exec_ns, delay_ns)
            # threads born since the last tick: their whole life is this phase's
            for tid, (exec_ns, delay_ns) in seen.items():
                if tid not in self._tids and self.ticks > 0:
                    self.cpu_ns += exec_ns
                    self.delay_ns += delay_ns
            self._tids = seen
            self.ticks += 1
            if running is None or own_r == 0:
                return
            outside = max(0, running - own_r - 1)  # less the sampler itself
            self.busy_ticks += 1
            self.busy_s += dt
            self.outside_sum += outside / self.ncpu
            self.modelled_wait_s += dt * max(0.0, 1.0 - self.ncpu / (outside + 1))

    def stop(self) -> dict[str, Any]:
        """The phase's figures (docs/rollouts.md, "Contention")."""
        _SAMPLER.remove(self)
        self.tick(procs_running())
        with self._lock:
            wall = time.monotonic() - self.start_mono
            t0, t1 = self._throttle0, self._throttled()
            psi0, psi1 = self._psi0, host_psi_some_s()
            cpu_s, delay_s = self.cpu_ns / 1e9, self.delay_ns / 1e9
            one = min(1.0, self.cpus or float(self.ncpu), float(self.ncpu))  # one thread's worth of its limit
            deficit = max(0.0, one * self.busy_s - cpu_s)
            outside = min(self.modelled_wait_s, delay_s, deficit)
            return {
                "wall_s": round(wall, 4),
                "cpu_s": round(cpu_s, 4),
                "run_delay_s": round(delay_s, 4),
                "throttled_s": None if t0 is None or t1 is None else round((t1[0] - t0[0]) / 1e9, 4),
                "nr_throttled": None if t0 is None or t1 is None else t1[1] - t0[1],
                "outside_runnable": round(self.outside_sum / self.busy_ticks, 3) if self.busy_ticks else 0.0,
                "busy_s": round(self.busy_s, 4),
                "outside_wait_s": round(outside, 4),
                "outside_share": round(outside / (outside + cpu_s), 4) if outside + cpu_s > 0 else 0.0,
                "host_psi_some_s": None if psi0 is None or psi1 is None else round(psi1 - psi0, 4),
                "cpus": self.cpus, "host_cpus": self.ncpu, "samples": self.ticks,
            }  # fmt: skip


class _Sampler:
    """The one thread that ticks every live probe every :data:`TICK_S`."""

    def __init__(self) -> None:
        self._probes: list[Probe] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, probe: Probe) -> None:
        with self._lock:
            self._probes.append(probe)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="sandfleet-contention", daemon=True)
                self._thread.start()

    def remove(self, probe: Probe) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._probes.remove(probe)

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            with self._lock:
                probes = list(self._probes)
                if not probes:
                    self._thread = None
                    return
            running = procs_running()
            for p in probes:
                with contextlib.suppress(Exception):  # a probe must never take the sampler down
                    p.tick(running)


_SAMPLER = _Sampler()


def start_probe(sandbox: object) -> Probe | None:
    """A running probe of ``sandbox``'s cgroup, or None where its tasks are not in a host
    cgroup this process can read (microvm, remote, no cgroups): figures are then null."""
    cg = getattr(sandbox, "cgroup", None)
    if not isinstance(cg, Cgroup) or "cpu" not in cg.layout.mounts:
        return None
    spec = getattr(sandbox, "spec", None)
    limits = getattr(spec, "limits", None)
    probe = Probe(cg, cpus=getattr(limits, "cpus", None))
    probe.tick(procs_running())  # the baseline: threads alive now count from here
    _SAMPLER.add(probe)
    return probe
