"""Who runs the benchmark commands: busy sandboxes, or bare host processes for the baseline.

Both kinds run the same bash script (``mkdir -p "$T" && <command>``) from the same workload
files, with ``$T`` a private scratch directory, and time it the same way: host wall-clock
from sending the command to having its exit status (so the platform's exec path is part of a
sandbox's figure).

The bare baseline is given what a sandbox is given, so that "overhead vs bare" measures the
sandboxing and nothing else (:func:`bare_workers`):

- CPU, memory and pids limits: a cgroup per bare worker made by
  :mod:`sandfleet.sandbox.cgroups` from the sandboxes' own :class:`Limits` (under a
  throttled parent its quota is scaled as the sandboxes' are);
- a working copy on a tmpfs (the sandboxes of the baseline get a tmpfs writable layer,
  :class:`SandboxFleet` with ``layer="tmpfs"``), copied in by a process of that cgroup (as
  the sandbox launcher copies the snapshot layer into the sandbox's own);
- output: stdout and stderr both captured through pipes, each kept up to
  :data:`MAX_OUTPUT` bytes and the rest counted and dropped, as the guest agent does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sandfleet.bench.workload import Command
from sandfleet.errors import SandfleetError
from sandfleet.sandbox import cgroups, create_sandbox, fork, get_backend, make_backend, make_spec
from sandfleet.sandbox.base import BASE_ENV, DEFAULT_MAX_OUTPUT, Sandbox, Snapshot
from sandfleet.sandbox.spec import Limits, backend_config
from sandfleet.sandbox.state import mount_of

REMOTE = "/work/wl"
"""Where the workload lives inside a sandbox."""
SCRATCH = "/tmp/bench"
"""``$T`` inside a sandbox."""
COMMAND_TIMEOUT_S = 300.0
MAX_OUTPUT = DEFAULT_MAX_OUTPUT
"""Bytes of stdout and of stderr kept per command, in a sandbox (the guest agent's cap) and bare."""
BARE_PREFIX = "sandfleet-bench-bare"
"""Working copies and cgroups of bare workers: ``<prefix>-<owner pid>-<i>-<random>``."""
TMPFS_DIR = Path("/dev/shm")
TMPFS_MAGIC = "tmpfs"


@dataclass
class Sample:
    """One command run."""

    command: str
    latency_s: float
    ok: bool
    t: float
    """Start, in seconds since the phase began."""
    detail: str = ""


class Worker(Protocol):
    async def run(self, cmd: Command, t0: float) -> Sample: ...
    async def close(self) -> None: ...


def alive(w: Worker) -> bool:
    """Whether a worker can still run commands (a bare worker always can)."""
    return bool(getattr(w, "alive", True))


def bench_script(cmd: Command) -> str:
    """The script both kinds of worker run for ``cmd``."""
    return 'mkdir -p "$T" && ' + cmd.script


class SandboxWorker:
    """One busy sandbox holding a copy of the workload."""

    def __init__(self, sb: Sandbox):
        self.sb = sb

    @property
    def alive(self) -> bool:
        """False once the sandbox has died: its commands would only fail at once."""
        return bool(self.sb.alive)

    async def run(self, cmd: Command, t0: float) -> Sample:
        start = time.perf_counter()
        try:
            res = await self.sb.exec(["bash", "-c", bench_script(cmd)], cwd=REMOTE, env={"T": SCRATCH},
                                     timeout=COMMAND_TIMEOUT_S, max_output=MAX_OUTPUT)
        except Exception as e:  # a dead sandbox is a failure of the run, not a crash
            return Sample(cmd.name, time.perf_counter() - start, False, start - t0, f"{type(e).__name__}: {e}")
        lat = time.perf_counter() - start
        detail = "" if res.ok else f"exit {res.exit_code}{' (timeout)' if res.timed_out else ''}: {res.stderr[-300:]}"
        return Sample(cmd.name, lat, res.ok, start - t0, detail)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.sb.close()


async def _capture(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, int]:
    """Read a pipe to its end in 64 KiB chunks: the first ``cap`` bytes, and how many more."""
    kept = bytearray()
    dropped = 0
    if stream is None:
        return b"", 0
    while chunk := await stream.read(65536):
        keep = min(cap - len(kept), len(chunk))
        kept += chunk[:keep]
        dropped += len(chunk) - keep
    return bytes(kept), dropped


def _text(data: bytes, dropped: int) -> str:
    """Decoded as the sandbox client decodes a command's output (truncation said)."""
    text = data.decode("utf-8", "replace")
    return text + (f"\n[... {dropped} more bytes truncated by sandfleet]\n" if dropped else "")


class BareWorker:
    """The same commands as bare host processes, in a private working copy.

    ``procs``: the files the command's shell writes itself ("0") into before it runs
    anything: its cgroup's join files, one per v1 hierarchy (``tasks``: the one migration the
    kernel makes without the global threadgroup lock, as the sandboxes' launcher and guest
    agent join theirs; ``cgroup.procs`` cost each bare command up to 18 ms of waiting for an
    RCU grace period, three times, which the sandboxes never paid); ``max_output``: stdout and stderr
    are each kept up to this many bytes, the rest counted and dropped."""

    def __init__(self, root: Path, procs: list[Path] | tuple[Path, ...] = (), *, max_output: int = MAX_OUTPUT,
                 cgroup: cgroups.Cgroup | None = None):
        self.root = root
        self.procs = list(procs)
        self.max_output = max_output
        self.cgroup = cgroup
        (root / "tmp").mkdir(exist_ok=True)
        (root / "home").mkdir(exist_ok=True)
        # TMPDIR: the temporary files of gcc, pip, pytest and python's tempfile go where a
        # sandbox's go, to a tmpfs of its own (its /tmp is in its tmpfs writable layer), not to
        # the host's /tmp on disk (-16 % "overhead" at 921be35: the bare side paid a disk /tmp)
        self.env = {**BASE_ENV, "HOME": str(root / "home"), "TMPDIR": str(root / "tmp"),
                    "T": str(root / "tmp" / "bench")}
        self.last_output: tuple[str, str] = ("", "")
        """stdout and stderr of the last command, as kept (for tests and failure details)."""

    def _join(self) -> str:
        return "".join(f"echo 0 > {shlex.quote(str(p))} && " for p in self.procs)

    async def shell(self, script: str, cwd: Path, timeout: float = COMMAND_TIMEOUT_S) -> tuple[int | None, str, str]:
        """Run ``script`` under bash in this worker's cgroup; (exit code or None on timeout, stdout, stderr)."""
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", self._join() + script, cwd=cwd, env=self.env, start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(timeout):
                (out, dout), (err, derr) = await asyncio.gather(_capture(proc.stdout, self.max_output),
                                                                 _capture(proc.stderr, self.max_output))
                await proc.wait()
        except BaseException as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.shield(proc.wait())
            if not isinstance(e, TimeoutError):
                raise
            return None, "", "timeout"
        self.last_output = (_text(out, dout), _text(err, derr))
        return proc.returncode, *self.last_output

    async def run(self, cmd: Command, t0: float) -> Sample:
        start = time.perf_counter()
        code, _, err = await self.shell(bench_script(cmd), self.root / "wl")
        lat = time.perf_counter() - start
        if code is None:
            return Sample(cmd.name, lat, False, start - t0, "timeout")
        ok = code == 0
        return Sample(cmd.name, lat, ok, start - t0, "" if ok else f"exit {code}: {err[-300:]}")

    async def close(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.root, True)
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)


def layer_kind(backend: str, layer: str = "default") -> str:
    """What a sandbox's writable layer (its working copy of the workload) is on this host."""
    if backend != "bwrap":
        return f"{backend} backend's own"
    from sandfleet.sandbox import disk

    if layer == "tmpfs" or not disk.available():
        return "tmpfs"
    return "ext4 on a loop device"


class SandboxFleet:
    """Sandboxes forked from one prepared sandbox holding the workload (created lazily).

    ``layer="tmpfs"`` gives bwrap sandboxes a tmpfs writable layer (``BwrapConfig(disk=
    "tmpfs")``) whatever the host's default is: the baseline's sandboxes, so that their working
    copy is on the same kind of filesystem as the bare workers'."""

    def __init__(self, workload: Path, backend: str, *, cpus: float | None = 1.0, memory_mib: int = 2048,
                 layer: str = "default"):
        if layer not in ("default", "tmpfs"):
            raise ValueError(f"layer must be 'default' or 'tmpfs', not {layer!r}")
        self.workload = workload
        self.spec = make_spec(image="host", backend=backend, cpus=cpus, memory_mib=memory_mib,
                              disk_mib=1024, ttl_s=6 * 3600.0, labels={"bench": "run"})
        self.layer = layer
        self._snap: Snapshot | None = None
        self.backend = ""
        self._custom: Any = None
        if layer == "tmpfs" and backend == "bwrap":
            get_backend("bwrap")  # the default one reaps leftovers once per process
            self._custom = make_backend(backend_config({"kind": "bwrap", "disk": "tmpfs"}))

    @property
    def limits(self) -> Limits:
        return self.spec.limits

    async def snapshot(self) -> Snapshot:
        if self._snap is None:
            sb = await (self._custom.create(self.spec) if self._custom is not None else create_sandbox(self.spec))
            try:
                self.backend = sb.backend
                await sb.upload(self.workload, REMOTE)
                self._snap = await sb.snapshot()
            finally:
                await sb.close()
        return self._snap

    async def workers(self, n: int) -> list[SandboxWorker]:
        snap = await self.snapshot()
        boxes = await (self._custom.fork(snap, n) if self._custom is not None else fork(snap, n))
        return [SandboxWorker(sb) for sb in boxes]

    def close(self) -> None:
        if self._snap is not None:
            self._snap.delete()
            self._snap = None


def fs_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/self/mountinfo)."""
    found = mount_of(path)
    return found[0] if found else "unknown"


def tmpfs_dir() -> tuple[Path, str]:
    """Where bare working copies go: /dev/shm when it is a tmpfs, else the temp directory;
    and that directory's filesystem type."""
    import tempfile

    if TMPFS_DIR.is_dir() and fs_type(TMPFS_DIR) == TMPFS_MAGIC and os.access(TMPFS_DIR, os.W_OK):
        return TMPFS_DIR, TMPFS_MAGIC
    tmp = Path(tempfile.gettempdir())
    return tmp, fs_type(tmp)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_bare() -> list[str]:
    """Remove the working copies and cgroups of bare workers whose owner process is gone."""
    gone = []
    base, _ = tmpfs_dir()
    lay = cgroups.detect()
    places = [base, *(root / cgroups.group() for root in set(lay.mounts.values()))]
    for place in places:
        with contextlib.suppress(OSError):
            for p in place.glob(f"{BARE_PREFIX}-*"):
                parts = p.name[len(BARE_PREFIX) + 1:].split("-")
                if not parts[0].isdigit() or _pid_alive(int(parts[0])):
                    continue
                if place == base:
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    cgroups.Cgroup(p.name, lay, parent=cgroups.group()).remove()
                gone.append(str(p))
    return gone


def cpu_quota(cg: cgroups.Cgroup | None) -> dict[str, Any]:
    """The CPU quota a cgroup really has, read back from its files."""
    if cg is None:
        return {"cpu_quota_us": None, "cpu_period_us": None, "cpus": None}
    lay = cg.layout
    d = lay.mounts.get("cpu")
    if d is None:
        return {"cpu_quota_us": None, "cpu_period_us": None, "cpus": None}
    d = d / cg.parent / cg.name
    try:
        if lay.version == "v2":
            q, p = (d / "cpu.max").read_text().split()
            quota = None if q == "max" else int(q)
            period = int(p)
        else:
            quota = int((d / "cpu.cfs_quota_us").read_text())
            quota = None if quota < 0 else quota
            period = int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return {"cpu_quota_us": None, "cpu_period_us": None, "cpus": None}
    return {"cpu_quota_us": quota, "cpu_period_us": period,
            "cpus": None if quota is None else round(quota / period, 4)}


async def bare_workers(workload: Path, n: int, limits: Limits | None = None) -> list[BareWorker]:
    """``n`` bare workers, each with a cgroup of ``limits`` (the sandboxes'; none where
    cgroups are unusable and ``SANDFLEET_NO_LIMITS`` allows it, as for sandboxes) and a private
    copy of the workload on a tmpfs, made by a process of that cgroup."""
    limits = limits or Limits()
    await asyncio.to_thread(reap_bare)
    base, _ = tmpfs_dir()
    out: list[BareWorker] = []
    try:
        for i in range(n):
            name = f"{BARE_PREFIX}-{os.getpid()}-{i}-{uuid.uuid4().hex[:8]}"
            root = base / name
            root.mkdir(mode=0o700)
            cg = cgroups.sandbox_cgroup(name, limits)  # refused without cgroups, as a sandbox is
            try:
                if cg is not None:
                    cg.create(limits)
                w = BareWorker(root, cg.join_files if cg is not None else (), cgroup=cg)
            except BaseException:
                shutil.rmtree(root, ignore_errors=True)
                if cg is not None:
                    cg.remove()
                raise
            out.append(w)
            code, _, err = await w.shell(f"cp -a {shlex.quote(str(workload))} wl", root, timeout=600)
            if code != 0:
                raise SandfleetError(f"could not copy the workload for bare worker {i}: {err.strip()[-300:]}")
    except BaseException:
        await close_all(out)
        raise
    return out


async def close_all(workers: list[Worker] | list[SandboxWorker] | list[BareWorker]) -> None:
    """Close workers even while being cancelled."""
    await asyncio.shield(asyncio.gather(*(w.close() for w in workers), return_exceptions=True))
