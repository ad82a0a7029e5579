"""The ``process`` backend: the guest agent as a plain subprocess in a private directory.

It isolates nothing (commands see the whole host); it exists for development on hosts
without bubblewrap, and says so once. Sandbox paths map into the private directory, and
file operations refuse paths or symlinks that lead out of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path

from sandfleet.agent.build import agent_binary
from sandfleet.errors import HostUnsupportedError, SandboxPathError
from sandfleet.sandbox import cgroups
from sandfleet.sandbox._spawn import AgentProcess, LocalSandbox
from sandfleet.sandbox.base import Snapshot, create_many, new_id, sandbox_path
from sandfleet.sandbox.spec import ProcessConfig, SandboxSpec
from sandfleet.sandbox.state import new_sandbox_dir, new_snapshot_dir

log = logging.getLogger(__name__)
_warned = False
SANDBOX_ENV = "SANDFLEET_SANDBOX_ID"
"""Set in every command's environment: how close() finds the sandbox's orphans without a cgroup."""


class ProcessSandbox(LocalSandbox):
    backend = "process"

    def __init__(self, sid: str, spec: SandboxSpec, agent: AgentProcess, root: Path, cg: cgroups.Cgroup | None):
        super().__init__(sid, spec, agent, root.parent, cg)
        self.root = root
        self.env.update(HOME=str(root / "home/agent"), TMPDIR=str(root / "tmp"), **{SANDBOX_ENV: sid})

    def _path(self, path: str) -> str:
        inner = sandbox_path(path, self.spec.workdir)
        host = os.path.realpath(self.root / inner.lstrip("/"))
        root = os.path.realpath(self.root)
        if host != root and not host.startswith(root + os.sep):
            raise SandboxPathError(f"path {path!r} leads outside the sandbox (to {host})")
        return host

    async def snapshot(self) -> Snapshot:
        self._check()
        snap = new_snapshot_dir()  # marked with its owner: reaped if the owner dies
        layer = snap / "layer"
        try:
            await asyncio.to_thread(shutil.copytree, self.root, layer, symlinks=True)
        except BaseException:
            shutil.rmtree(snap, ignore_errors=True)
            raise
        return Snapshot(backend=self.backend, spec=self.spec, layer=layer,
                        cleanup=lambda: shutil.rmtree(snap, ignore_errors=True))

    async def close(self) -> None:
        """Close, and without a cgroup also kill every process the sandbox started: there is
        no pid namespace, so ``cmd &`` orphans would outlive the agent otherwise."""
        if self._closed:
            return
        try:
            if self.cgroup is None:
                await asyncio.to_thread(kill_sandbox_processes, self.id, self.root, self.agent.proc.pid)
        finally:
            try:
                await super().close()
            finally:
                if self.cgroup is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.agent.proc.pid, signal.SIGKILL)  # its process group
                    await asyncio.to_thread(kill_sandbox_processes, self.id, self.root, None)


def sandbox_processes(sid: str, root: Path, spare: int | None = None) -> set[int]:
    """This user's processes that belong to sandbox ``sid``: its marker is in their
    environment, or their working directory is inside the sandbox."""
    marker = f"{SANDBOX_ENV}={sid}".encode() + b"\0"
    inside = str(root)
    found: set[int] = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in (me, spare):
            continue
        pid = int(entry.name)
        try:
            if entry.stat().st_uid != os.geteuid():
                continue
            env = Path(f"/proc/{pid}/environ").read_bytes()
            cwd = str(Path(f"/proc/{pid}/cwd").readlink())
        except OSError:
            continue
        if (b"\0" + env).find(b"\0" + marker) >= 0 or cwd == inside or cwd.startswith(inside + "/"):
            found.add(pid)
    return found


def kill_sandbox_processes(sid: str, root: Path, spare: int | None, timeout: float = 2.0) -> None:
    """SIGKILL every process of the sandbox (but ``spare``) until none is left."""
    end = time.monotonic() + timeout
    while (pids := sandbox_processes(sid, root, spare)) and time.monotonic() < end:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


class ProcessBackend:
    name = "process"

    def __init__(self, config: ProcessConfig | None = None):
        self.config = config or ProcessConfig()

    async def create(self, spec: SandboxSpec, *, layer: Path | None = None) -> ProcessSandbox:
        global _warned
        if not _warned:
            log.warning("the process backend isolates nothing: use it for development only")
            _warned = True
        if spec.image != "host":
            from sandfleet.errors import ConfigError

            raise ConfigError(f"the process backend runs only the 'host' image, not {spec.image!r}")
        sid = new_id("process")
        cg = cgroups.sandbox_cgroup(sid, spec.limits)  # refuses limits it can't enforce
        meta = {"id": sid, "backend": "process", "image": "host", "ttl_s": spec.limits.ttl_s,
                "cgroup": cg is not None, "labels": spec.labels}
        sdir = new_sandbox_dir(sid, meta)  # the marker names its owner before there is anything to reap
        root = sdir / "root"
        try:
            if layer is not None:
                await asyncio.to_thread(shutil.copytree, layer, root, symlinks=True)
            for d in ("tmp", "home/agent", spec.workdir.lstrip("/"), *(w.lstrip("/") for w in spec.writable_dirs)):
                (root / d).mkdir(parents=True, exist_ok=True)
            argv = [str(agent_binary())]
            if spec.limits.ttl_s:
                argv += ["--ttl", str(spec.limits.ttl_s)]
            if cg is not None:
                try:
                    cg.create(spec.limits)
                except OSError as e:
                    raise HostUnsupportedError(
                        f"could not create the cgroup of sandbox {sid} under {cgroups.group()!r}: {e}; "
                        "check SANDFLEET_CGROUP_PARENT, or pass --no-limits (SANDFLEET_NO_LIMITS=1)"
                    ) from None
                launch = [str(agent_binary()), "launch"]
                for f in cg.procs_files:
                    launch += ["--cgroup", str(f)]
                argv = [*launch, "--pdeathsig", str(os.getpid()), "--", *argv]
            agent = await AgentProcess.start(argv, sid=sid, sandbox_dir=sdir, meta=meta,
                                             cwd=str(root / spec.workdir.lstrip("/")), new_session=True)
        except BaseException:
            if cg is not None:
                cg.remove()
            shutil.rmtree(sdir, ignore_errors=True)
            raise
        return ProcessSandbox(sid, spec, agent, root, cg)

    async def fork(self, snapshot: Snapshot, n: int) -> list[ProcessSandbox]:
        return await create_many([lambda: self.create(snapshot.spec, layer=snapshot.layer)] * n)
