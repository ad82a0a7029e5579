"""Who runs the benchmark commands: busy sandboxes, or bare host processes for the baseline.

Both kinds run the same bash script from the same workload files, with ``$T`` a private
scratch directory, and time it the same way: host wall-clock from sending the command to
having its exit status (so the platform's exec path is part of a sandbox's figure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sandfleet.bench.throttle import Throttle
from sandfleet.bench.workload import Command
from sandfleet.sandbox import create_sandbox, fork, make_spec
from sandfleet.sandbox.base import BASE_ENV, Sandbox, Snapshot

REMOTE = "/work/wl"
"""Where the workload lives inside a sandbox."""
COMMAND_TIMEOUT_S = 300.0


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


class SandboxWorker:
    """One busy sandbox holding a copy of the workload."""

    def __init__(self, sb: Sandbox):
        self.sb = sb

    async def run(self, cmd: Command, t0: float) -> Sample:
        start = time.perf_counter()
        try:
            res = await self.sb.exec(["bash", "-c", 'mkdir -p "$T" && ' + cmd.script], cwd=REMOTE,
                                     env={"T": "/tmp/bench"}, timeout=COMMAND_TIMEOUT_S)
        except Exception as e:  # a dead sandbox is a failure of the run, not a crash
            return Sample(cmd.name, time.perf_counter() - start, False, start - t0, f"{type(e).__name__}: {e}")
        lat = time.perf_counter() - start
        detail = "" if res.ok else f"exit {res.exit_code}{' (timeout)' if res.timed_out else ''}: {res.stderr[-300:]}"
        return Sample(cmd.name, lat, res.ok, start - t0, detail)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.sb.close()


class BareWorker:
    """The same commands as bare host processes, in a private copy of the workload."""

    def __init__(self, root: Path, procs: Path | None = None):
        self.root = root
        self.procs = procs
        (root / "tmp").mkdir(exist_ok=True)
        self.env = {**BASE_ENV, "HOME": str(root / "home"), "T": str(root / "tmp")}
        (root / "home").mkdir(exist_ok=True)

    async def run(self, cmd: Command, t0: float) -> Sample:
        script = cmd.script if self.procs is None else f"echo $$ > {self.procs} && {cmd.script}"
        start = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", script, cwd=self.root / "wl", env=self.env, start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                _, err = await proc.communicate()
        except BaseException as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.shield(proc.wait())
            if not isinstance(e, TimeoutError):
                raise
            return Sample(cmd.name, time.perf_counter() - start, False, start - t0, "timeout")
        lat = time.perf_counter() - start
        ok = proc.returncode == 0
        return Sample(cmd.name, lat, ok, start - t0, "" if ok else f"exit {proc.returncode}: {err.decode()[-300:]}")

    async def close(self) -> None:
        await asyncio.to_thread(shutil.rmtree, self.root, True)


class SandboxFleet:
    """Sandboxes forked from one prepared sandbox holding the workload (created lazily)."""

    def __init__(self, workload: Path, backend: str, *, cpus: float | None = 1.0, memory_mib: int = 2048):
        self.workload = workload
        self.spec = make_spec(image="host", backend=backend, cpus=cpus, memory_mib=memory_mib,
                              disk_mib=1024, ttl_s=6 * 3600.0, labels={"bench": "run"})
        self._snap: Snapshot | None = None
        self.backend = ""

    async def snapshot(self) -> Snapshot:
        if self._snap is None:
            sb = await create_sandbox(self.spec)
            try:
                self.backend = sb.backend
                await sb.upload(self.workload, REMOTE)
                self._snap = await sb.snapshot()
            finally:
                await sb.close()
        return self._snap

    async def workers(self, n: int) -> list[SandboxWorker]:
        boxes = await fork(await self.snapshot(), n)
        return [SandboxWorker(sb) for sb in boxes]

    def close(self) -> None:
        if self._snap is not None:
            self._snap.delete()
            self._snap = None


def bare_workers(workload: Path, n: int, throttle: Throttle | None = None) -> list[BareWorker]:
    """``n`` private copies of the workload in a temporary directory each."""
    out = []
    for i in range(n):
        root = Path(tempfile.mkdtemp(prefix=f"sandfleet-bench-bare{i}-"))
        shutil.copytree(workload, root / "wl", symlinks=True)
        out.append(BareWorker(root, throttle.procs_file(f"bare-{i}") if throttle else None))
    return out


async def close_all(workers: list[Worker] | list[SandboxWorker] | list[BareWorker]) -> None:
    """Close workers even while being cancelled."""
    await asyncio.shield(asyncio.gather(*(w.close() for w in workers), return_exceptions=True))
