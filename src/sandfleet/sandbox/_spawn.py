"""Start a guest agent as a local process (under bwrap or bare) and connect to it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Mapping
from pathlib import Path

from sandfleet.agent.client import AgentClient
from sandfleet.errors import SandboxDiedError
from sandfleet.sandbox.base import AgentSandbox
from sandfleet.sandbox.cgroups import Cgroup
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.sandbox.state import proc_start_time, write_meta


class AgentProcess:
    """A local process that runs (or wraps) the guest agent, with its stream and marker."""

    def __init__(self, proc: asyncio.subprocess.Process, client: AgentClient, log: Path):
        self.proc = proc
        self.client = client
        self.log = log

    @classmethod
    async def start(
        cls, argv: list[str], *, sid: str, sandbox_dir: Path, meta: Mapping[str, object],
        cwd: str | None = None, env: dict[str, str] | None = None, new_session: bool = False,
        ready_timeout: float = 30.0, pass_fds: tuple[int, ...] = (),
    ) -> AgentProcess:
        log = sandbox_dir / "agent.log"
        with open(log, "wb") as errf:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errf,
                cwd=cwd,
                # never the caller's PATH: the root launcher runs only absolute paths anyway
                env=env if env is not None else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                start_new_session=new_session,
                pass_fds=pass_fds,
                limit=1 << 20,
            )
        write_meta(sandbox_dir, {**meta, "pids": [proc.pid], "pid_starts": {str(proc.pid): proc_start_time(proc.pid)}})
        assert proc.stdout is not None and proc.stdin is not None
        ttl = meta.get("ttl_s")  # bounds the host's wait on an exec without a timeout
        client = AgentClient(proc.stdout, proc.stdin, name=sid, ttl=ttl if isinstance(ttl, int | float) else None)
        self = cls(proc, client, log)
        try:
            async with asyncio.timeout(ready_timeout):
                await client.hello()
        except BaseException as e:
            await self.stop()
            detail = log.read_text(errors="replace").strip()[-2000:] if log.exists() else ""
            if isinstance(e, asyncio.CancelledError):
                raise
            raise SandboxDiedError(
                f"sandbox {sid} failed to start: {detail or type(e).__name__ + ': ' + str(e)}"
            ) from None
        return self

    async def stop(self, grace: float = 2.0) -> None:
        """Close the agent's stream (it kills its commands and exits), then make sure."""
        await self.client.close()
        if self.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self.proc.wait()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()


class LocalSandbox(AgentSandbox):
    """A sandbox whose agent is a local process: it owns that process, its cgroups and its
    marker directory, and close() removes all three."""

    def __init__(self, sid: str, spec: SandboxSpec, agent: AgentProcess, sdir: Path, cg: Cgroup | None):
        super().__init__(sid, spec, agent.client)
        self.agent = agent
        self.dir = sdir
        self.cgroup = cg

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.agent.stop()
        finally:
            if self.agent.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.agent.proc.pid, signal.SIGKILL)
            await _off_loop(self._remove)

    def _remove(self) -> None:
        """Remove the cgroups and the marker directory (blocking: rmdir, kill loops)."""
        if self.cgroup is not None:
            self.cgroup.remove()
        shutil.rmtree(self.dir, ignore_errors=True)


_CLEANUP = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="sandfleet-cleanup")


async def _off_loop(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a worker thread so the event loop (a service answering other requests)
    is not held while the filesystem and cgroups take their time. It runs to the end
    whatever happens: cancelled (asyncio.run cancels every task at exit, shielded ones too),
    this waits for it synchronously, as a plain call would; with no thread to be had (the
    interpreter is shutting down), it runs here."""
    try:
        fut = _CLEANUP.submit(fn)
    except RuntimeError:
        fn()
        return
    try:
        await asyncio.shield(asyncio.wrap_future(fut))  # (shielded: a cancel must not drop it from the queue)
    except asyncio.CancelledError:
        fut.result()
        raise
