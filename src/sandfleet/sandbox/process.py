"""The ``process`` backend: the guest agent as a plain subprocess in a private directory.

It isolates nothing (commands see the whole host); it exists for development on hosts
without bubblewrap, and says so once. Sandbox paths map into the private directory, and
file operations refuse paths or symlinks that lead out of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

from sandfleet.agent.build import agent_binary
from sandfleet.errors import SandboxPathError
from sandfleet.sandbox import cgroups
from sandfleet.sandbox._spawn import AgentProcess, LocalSandbox
from sandfleet.sandbox.base import Snapshot, create_many, new_id, sandbox_path
from sandfleet.sandbox.spec import ProcessConfig, SandboxSpec
from sandfleet.sandbox.state import state_root, write_meta

log = logging.getLogger(__name__)
_warned = False


class ProcessSandbox(LocalSandbox):
    backend = "process"

    def __init__(self, sid: str, spec: SandboxSpec, agent: AgentProcess, root: Path, cg: cgroups.Cgroup | None):
        super().__init__(sid, spec, agent, root.parent, cg)
        self.root = root
        self.env.update(HOME=str(root / "home/agent"), TMPDIR=str(root / "tmp"))

    def _path(self, path: str) -> str:
        inner = sandbox_path(path, self.spec.workdir)
        host = os.path.realpath(self.root / inner.lstrip("/"))
        root = os.path.realpath(self.root)
        if host != root and not host.startswith(root + os.sep):
            raise SandboxPathError(f"path {path!r} leads outside the sandbox (to {host})")
        return host

    async def snapshot(self) -> Snapshot:
        self._check()
        snap_dir = state_root() / "snapshots" / new_id("snap")
        await asyncio.to_thread(shutil.copytree, self.root, snap_dir, symlinks=True)
        return Snapshot(backend=self.backend, spec=self.spec, layer=snap_dir,
                        cleanup=lambda: shutil.rmtree(snap_dir, ignore_errors=True))


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
        sdir = state_root() / sid
        root = sdir / "root"
        sdir.mkdir(parents=True)
        if layer is not None:
            await asyncio.to_thread(shutil.copytree, layer, root, symlinks=True)
        for d in ("tmp", "home/agent", spec.workdir.lstrip("/"), *(w.lstrip("/") for w in spec.writable_dirs)):
            (root / d).mkdir(parents=True, exist_ok=True)
        lay = cgroups.detect()
        cg = cgroups.Cgroup(sid, lay) if lay.usable else None
        meta = {"id": sid, "backend": "process", "image": "host", "ttl_s": spec.limits.ttl_s,
                "cgroup": cg is not None, "labels": spec.labels}
        write_meta(sdir, meta)  # the marker names its owner before there is anything to reap
        argv = [str(agent_binary())]
        if spec.limits.ttl_s:
            argv += ["--ttl", str(spec.limits.ttl_s)]
        if cg is not None:
            cg.create(spec.limits)
            launch = [str(agent_binary()), "launch"]
            for f in cg.procs_files:
                launch += ["--cgroup", str(f)]
            argv = [*launch, "--pdeathsig", "--", *argv]
        try:
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
