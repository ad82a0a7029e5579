"""cgroup limits for sandboxes, on cgroup v2, v1, or the v1/v2 hybrid (detected at run time).

On a hybrid host the cpu, memory and pids controllers are v1 hierarchies while
``/sys/fs/cgroup/unified`` holds a controller-less v2 tree, so we treat it as v1.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandfleet.errors import ConfigError, HostUnsupportedError
from sandfleet.sandbox.spec import Limits
from sandfleet.settings import current as current_settings

ROOT = Path("/sys/fs/cgroup")
GROUP_DEFAULT = "sandfleet"
_THROTTLE: contextvars.ContextVar[tuple[str, float] | None] = contextvars.ContextVar("sandfleet_throttle", default=None)
"""(parent group, CPU fraction) inside :func:`throttled_parent`: per context, not per process, so
one thread's or task's throttle never leaks into another's (asyncio tasks and ``to_thread``
inherit it from where they were started)."""


def group() -> str:
    """Parent of every sandbox's cgroup: the enclosing :func:`throttled_parent`'s, else
    ``$SANDFLEET_CGROUP_PARENT``, else "sandfleet".

    Nest it under a CPU-throttled group (e.g. ``slowhost/sandfleet``) to run every sandbox
    on an emulated slower host: v1 and v2 quotas are hierarchical. A value that climbs out
    of the cgroup tree (``..``) is refused."""
    throttle = _THROTTLE.get()
    if throttle is not None:
        return throttle[0]
    value = (current_settings().cgroup_parent or GROUP_DEFAULT).strip("/") or GROUP_DEFAULT
    if any(part in ("..", ".") for part in value.split("/")) or "\x00" in value:
        raise ConfigError(f"SANDFLEET_CGROUP_PARENT must be a relative cgroup path without '..', not {value!r}")
    return value


def cpu_fraction() -> float:
    """The share of each core a sandbox's CPU quota is scaled by: the fraction of the enclosing
    :func:`throttled_parent`, else ``$SANDFLEET_CPU_FRACTION``, else 1. A bad value is a
    one-line ConfigError."""
    throttle = _THROTTLE.get()
    if throttle is not None:
        return throttle[1]
    text = (current_settings().cpu_fraction or "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"SANDFLEET_CPU_FRACTION must be a number in (0, 1], not {text!r}") from None
    if not 0 < value <= 1:
        raise ConfigError(f"SANDFLEET_CPU_FRACTION must be a number in (0, 1], not {text!r}")
    return value


def parents(layout: Layout | None = None) -> list[str]:
    """Every parent group sandboxes may live under on this host: :func:`group`, the default,
    and the ``sandfleet`` group of every throttled parent (for the reaper)."""
    lay = layout or detect()
    found = [group(), GROUP_DEFAULT]
    for root in set(lay.mounts.values()):
        with contextlib.suppress(OSError):
            found += [f"{p.name}/{GROUP_DEFAULT}" for p in root.glob("sandfleet-slowhost-*") if p.is_dir()]
    return list(dict.fromkeys(found))


def sandbox_cgroup(sid: str, limits: Limits) -> Cgroup | None:
    """The cgroup a new sandbox gets (not created yet), or None where it runs without one.

    No silent loss of limits: when cgroups are unusable (not root, no writable hierarchy, or
    ``SANDFLEET_CGROUPS=off``) a sandbox that asks for a cpu, memory or pids limit is refused
    with a HostUnsupportedError, unless ``SANDFLEET_NO_LIMITS=1`` (``--no-limits``) says to run
    it without limits."""
    lay = detect()
    settings = current_settings()
    off = settings.cgroups_off
    if lay.usable and not off:
        return Cgroup(sid, lay)
    wanted = [k for k in ("cpus", "memory_mib", "pids") if getattr(limits, k)]
    if not wanted or settings.no_limits:
        return None
    why = "SANDFLEET_CGROUPS=off" if off else (
        "no cgroup cpu/memory/pids controller" if not lay.mounts else "the cgroup tree is not writable (not root?)"
    )
    raise HostUnsupportedError(
        f"this sandbox asks for limits ({', '.join(wanted)}) but cgroups are unusable here ({why}); "
        "run as root, or pass --no-limits (SANDFLEET_NO_LIMITS=1) to run sandboxes without any limit"
    )


CONTROLLERS = ("cpu", "memory", "pids")


@dataclass(frozen=True)
class Layout:
    """Where the controllers live. ``version`` is "v2", "v1", "hybrid" or "none"."""

    version: str
    mounts: dict[str, Path]  # controller -> hierarchy root (v2: all the same)
    writable: bool

    @property
    def usable(self) -> bool:
        return self.writable and bool(self.mounts)


@functools.cache
def detect() -> Layout:
    """Read /proc/self/mountinfo once and say how this host's cgroups are laid out."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or not rfields:
            continue
        mnt, fstype = Path(fields[4]), rfields[0]
        if fstype == "cgroup2":
            v2 = mnt
        elif fstype == "cgroup" and len(rfields) >= 3:
            for opt in rfields[2].split(","):
                if opt in CONTROLLERS:
                    v1[opt] = mnt
    if v1:
        version = "hybrid" if v2 is not None else "v1"
        mounts = v1
    elif v2 is not None:
        avail = set((v2 / "cgroup.controllers").read_text().split()) if (v2 / "cgroup.controllers").exists() else set()
        version = "v2"
        mounts = {c: v2 for c in CONTROLLERS if c in avail}
    else:
        return Layout("none", {}, False)
    writable = all(os.access(p, os.W_OK) for p in set(mounts.values()))
    return Layout(version, mounts, writable)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _prepare_v2(root: Path, parent: str | None = None) -> None:
    """Enable cpu, memory and pids for children along ``root/<parent>`` (v2), for the parent
    in use: throttled and unthrottled sandboxes live under different parents, and each chain
    needs its own ``subtree_control`` (no cache: a throttled parent comes and goes, and
    reading what is already enabled costs a few sysfs reads)."""
    parent = parent or group()
    (root / parent).mkdir(parents=True, exist_ok=True)
    parts = Path(parent).parts
    chain = [root, *(root / Path(*parts[: i + 1]) for i in range(len(parts)))]
    for p in chain:
        control = p / "cgroup.subtree_control"
        try:
            if set(CONTROLLERS) <= set(control.read_text().split()):
                continue
            _write(control, " ".join(f"+{c}" for c in CONTROLLERS))
        except OSError as e:
            raise HostUnsupportedError(
                f"cgroup v2: could not enable cpu, memory and pids in {control}: {e.strerror} "
                "(a group that holds processes can't pass controllers on: choose another parent)"
            ) from None


class Cgroup:
    """One sandbox's cgroups (one per v1 controller, or one v2 group)."""

    def __init__(self, name: str, layout: Layout | None = None, parent: str | None = None):
        self.layout = layout or detect()
        self.name = name
        self.parent = parent or group()
        self.dirs = sorted({root / self.parent / name for root in self.layout.mounts.values()})
        self._cpu_pending: tuple[int, int] | None = None

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    @property
    def join_files(self) -> list[Path]:
        """The files a single-threaded process writes "0" (itself) into to join the group:
        on v1 ``tasks``, since a thread moving itself is the one migration the kernel makes
        without write-locking the global cgroup_threadgroup_rwsem (its first writer after a
        quiet spell waits out an RCU grace period: 0.5-18 ms here); on v2 ``cgroup.procs``."""
        name = "cgroup.procs" if self.layout.version == "v2" else "tasks"
        return [d / name for d in self.dirs]

    def delegate(self, uid: int) -> Path | None:
        """Let host uid ``uid`` (the guest agent) make child groups, one per command, so a
        kill reaches everything a command started. Returns the group to hand over (the pids
        hierarchy on v1), or None where there is none."""
        d = self.layout.mounts.get("pids")
        if d is None:
            return None
        d = d / self.parent / self.name
        files = ["cgroup.procs"] if self.layout.version == "v2" else []  # v2 moves need the common parent
        for p in [d, *(d / f for f in files)]:
            os.chown(p, uid, uid)
        d.chmod(0o700)
        return d

    def _children(self) -> list[Path]:
        out: list[Path] = []
        for d in self.dirs:
            with contextlib.suppress(OSError), os.scandir(d) as it:  # types from getdents: no stat per file
                out += [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
        return out

    def create(self, limits: Limits, *, cpu_now: bool = True) -> None:
        """Make the groups and write the limits. ``cpu_now=False`` leaves the CPU quota to
        :meth:`limit_cpu` (the sandbox's first command, issue 46): each write of a quota walks
        every cpu cgroup on the host (the kernel's ``__cfs_schedulable``), so a host that holds
        thousands of idle sandboxes paid a walk over all of them for each new one, and an idle
        sandbox runs only its guest agent, ours. The quota is worked out here, in the creator's
        context (a :func:`throttled_parent`'s fraction), and written as it is later."""
        lay = self.layout
        # Under throttled_parent every sandbox's cores also deliver only that fraction.
        fraction = cpu_fraction()
        period = 100_000 if fraction >= 1 else 10_000
        quota = int((limits.cpus or 0) * fraction * period)
        self._cpu_pending = (quota, period) if limits.cpus else None
        if lay.version == "v2":
            _prepare_v2(lay.mounts[next(iter(lay.mounts))], self.parent)
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)
        if lay.version == "v2":
            d = self.dirs[0]
            if limits.memory_mib:
                _write(d / "memory.max", str(limits.memory_mib << 20))
                with contextlib.suppress(OSError):
                    _write(d / "memory.swap.max", "0")
            if limits.pids:
                _write(d / "pids.max", str(limits.pids))
        else:
            m = lay.mounts
            if limits.memory_mib and "memory" in m:
                d = m["memory"] / self.parent / self.name
                _write(d / "memory.limit_in_bytes", str(limits.memory_mib << 20))
                with contextlib.suppress(OSError):
                    _write(d / "memory.memsw.limit_in_bytes", str(limits.memory_mib << 20))
            if limits.pids and "pids" in m:
                _write(m["pids"] / self.parent / self.name / "pids.max", str(limits.pids))
        if cpu_now:
            self.limit_cpu()

    @property
    def cpu_pending(self) -> bool:
        """Whether the CPU quota :meth:`create` worked out is still to be written."""
        return self._cpu_pending is not None

    def limit_cpu(self) -> None:
        """Write the CPU quota :meth:`create` worked out, once (later calls do nothing); an
        OSError where the kernel refuses it, which stays pending (the next call tries again)."""
        pending = self._cpu_pending
        if pending is None:
            return
        quota, period = pending
        lay = self.layout
        if lay.version == "v2":
            _write(self.dirs[0] / "cpu.max", f"{quota} {period}")
        elif "cpu" in lay.mounts:
            d = lay.mounts["cpu"] / self.parent / self.name
            # each write of either file walks every cpu cgroup on the host (the kernel's
            # __cfs_schedulable: a cost that grows with the live sandboxes, issue 46): the
            # period only where it is not already what we want (a new group has 100 ms)
            current = None
            with contextlib.suppress(OSError, ValueError):
                current = int((d / "cpu.cfs_period_us").read_text())
            if current != period:
                _write(d / "cpu.cfs_period_us", str(period))
            _write(d / "cpu.cfs_quota_us", str(quota))
        self._cpu_pending = None

    def pids(self) -> set[int]:
        """Every process in the group, its per-command child groups included."""
        found: set[int] = set()
        for f in [*self.procs_files, *(c / "cgroup.procs" for c in self._children())]:
            with contextlib.suppress(OSError):
                found.update(int(x) for x in f.read_text().split())
        return found

    def memory_events(self) -> dict[str, int]:
        """OOM kills and peak usage where the kernel reports them."""
        out: dict[str, int] = {}
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                if (d / "memory.events").exists():
                    for line in (d / "memory.events").read_text().splitlines():
                        k, v = line.split()
                        out[k] = int(v)
                elif (d / "memory.oom_control").exists():
                    for line in (d / "memory.oom_control").read_text().splitlines():
                        k, v = line.split()
                        out[k] = int(v)
        return out

    def pids_limit_hits(self) -> int:
        """How many forks the group's pids limit refused (``pids.events`` ``max``, v1 and v2)."""
        hits = 0
        for d in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                for line in (d / "pids.events").read_text().splitlines():
                    k, v = line.split()
                    if k == "max":
                        hits = max(hits, int(v))
        return hits

    def kill_all(self, timeout: float = 2.0) -> None:
        """SIGKILL every process in the group until it is empty."""
        if self.layout.version == "v2" and self.dirs and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", "1")
        end = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < end:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what's left and remove the group directories (per-command children first)."""
        for d in [*self._children(), *self.dirs]:
            if not d.exists():
                continue
            try:
                d.rmdir()
            except OSError:
                self.kill_all()
                end = time.monotonic() + 2.0
                while d.exists() and time.monotonic() < end:
                    with contextlib.suppress(OSError):
                        d.rmdir()
                    time.sleep(0.01)


def leftover_names(layout: Layout | None = None) -> set[str]:
    """Names of sandfleet cgroups present on the host (for the reaper), under every parent
    in :func:`parents`; see :func:`leftover_groups` for where each is."""
    return {name for name, _ in leftover_groups(layout)}


def leftover_groups(layout: Layout | None = None) -> set[tuple[str, str]]:
    """(name, parent) of every sandbox cgroup on the host, throttled parents included."""
    lay = layout or detect()
    found: set[tuple[str, str]] = set()
    for parent in parents(lay):
        for root in set(lay.mounts.values()):
            with contextlib.suppress(OSError):
                found.update((p.name, parent) for p in (root / parent).iterdir()
                             if p.is_dir() and p.name.startswith("sf-"))
    return found


@contextlib.contextmanager
def throttled_parent(fraction: float, threads: int | None = None) -> Iterator[str]:
    """Run every sandbox created inside the block as on a host whose cores deliver
    ``fraction`` of this one's: all sandboxes share one cgroup with a quota of
    fraction x threads CPUs, and each sandbox's own quota is scaled by ``fraction``, both
    with a 10 ms period (so short commands feel it too).

    The parent and the fraction hold for the current context only (see :data:`_THROTTLE`):
    sandboxes created in this thread or task, or in tasks and ``asyncio.to_thread`` calls
    started from it inside the block; the process environment is left alone."""
    if not 0 < fraction <= 1:
        raise ValueError(f"CPU fraction must be in (0, 1], not {fraction}")
    lay = detect()
    if not lay.usable or "cpu" not in lay.mounts:
        raise HostUnsupportedError("emulating a slower host needs a writable cgroup cpu controller (root)")
    top = f"sandfleet-slowhost-{os.getpid()}"
    threads = threads or os.cpu_count() or 1
    quota = max(1000, int(fraction * threads * 10_000))
    cpu_dir = lay.mounts["cpu"] / top
    cpu_dir.mkdir(parents=True, exist_ok=True)
    if lay.version == "v2":
        _prepare_v2(lay.mounts["cpu"], f"{top}/{GROUP_DEFAULT}")  # the chain root -> top -> top/sandfleet
        _write(cpu_dir / "cpu.max", f"{quota} 10000")
    else:
        _write(cpu_dir / "cpu.cfs_period_us", "10000")
        _write(cpu_dir / "cpu.cfs_quota_us", str(quota))
    token = _THROTTLE.set((f"{top}/{GROUP_DEFAULT}", fraction))
    try:
        yield top
    finally:
        _THROTTLE.reset(token)
        for root in set(lay.mounts.values()):
            for d in (root / top / GROUP_DEFAULT, root / top):
                with contextlib.suppress(OSError):
                    d.rmdir()
