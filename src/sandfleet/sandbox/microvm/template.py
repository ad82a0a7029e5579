"""Memory snapshots ("templates"): boot a guest once to agent-ready, restore every VM from it.

A template is a directory ``<cache>/microvm/templates/<key>/`` holding

- ``mem``: the guest's RAM, written by the template VM through a shared file mapping;
- ``state``: QEMU's device state (CPU registers, virtio queues...), a few hundred KiB,
  saved with the ``x-ignore-shared`` capability so it does not repeat the RAM;
- ``spec.json``: the :class:`VmSpec` it was made for (the key hashes it).

A restored VM maps ``mem`` privately: pages it only reads stay shared with every other VM
restored from the same template (and with the page cache); pages it writes become its own.
Templates are built once per (image, kernel, agent, hardware) and reused across processes;
a file lock keeps two processes from building the same one.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sandfleet.agent.client import EXEC_GRACE, AgentClient
from sandfleet.errors import SandboxDiedError
from sandfleet.sandbox.base import new_id
from sandfleet.sandbox.microvm.host import cache_dir, qemu_version
from sandfleet.sandbox.microvm.vm import Vm, VmSpec, log_tail

_VERSION = "1"


@dataclass(frozen=True)
class Template:
    """A saved, agent-ready guest that VMs are restored from."""

    dir: Path
    spec: VmSpec

    @property
    def mem(self) -> Path:
        return self.dir / "mem"

    @property
    def state(self) -> Path:
        return self.dir / "state"


def template_key(spec: VmSpec, prepare: Sequence[Sequence[str]]) -> str:
    """A hash of everything a template depends on."""
    files = {}
    for path in (spec.kernel, spec.initrd, spec.disk):
        st = path.stat()
        files[str(path)] = [st.st_size, st.st_mtime_ns, st.st_ino]
    data = {
        "v": _VERSION,
        "spec": {k: str(v) for k, v in asdict(spec).items()},
        "files": files,
        "qemu": qemu_version(),
        "prepare": [list(a) for a in prepare],
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:20]


async def ensure_template(
    spec: VmSpec, *, prepare: Sequence[Sequence[str]] = (), boot_timeout: float = 120.0
) -> Template:
    """The template for ``spec`` (building it now if needed): boot, run ``prepare``, save."""
    root = cache_dir() / "templates"
    root.mkdir(parents=True, exist_ok=True)
    key = template_key(spec, prepare)
    done = Template(root / key, spec)
    if done.state.is_file():
        return done
    with open(root / f"{key}.lock", "w") as lock:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        if done.state.is_file():
            return done
        tmp = root / f".{key}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            await _build(Template(tmp, spec), prepare, boot_timeout)
            (tmp / "spec.json").write_text(json.dumps(asdict(spec), default=str))
            tmp.rename(done.dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return done


EMULATED_EXEC_GRACE = 60.0


def exec_grace(accel: str) -> float:
    """How long past a command's timeout the host waits for the guest to say it ended. An emulated guest (TCG:
    every instruction translated, 10-50x slower than KVM, and starved further when the host is busy) kills the
    command's tree and answers in seconds at best: with the 10 s a KVM guest gets, a busy 2-core host saw a
    timed-out verifier's guest miss it and the rollout called an infra fault where the tests' timeout decided
    (CI of stop 75: git-bisect-regression's no-op on microvm)."""
    return EMULATED_EXEC_GRACE if accel == "tcg" else EXEC_GRACE


async def _build(tpl: Template, prepare: Sequence[Sequence[str]], boot_timeout: float) -> None:
    sid = new_id("microvm-template")
    vm = await Vm.start(sid, tpl.spec, tpl.mem, share=True, save_to=tpl.state)
    client: AgentClient | None = None
    try:
        assert vm.agent is not None
        client = AgentClient(*vm.agent, name=sid)
        try:
            async with asyncio.timeout(boot_timeout):
                await client.hello()
        except (TimeoutError, SandboxDiedError) as exc:
            raise SandboxDiedError(
                f"the template VM did not reach its guest agent within {boot_timeout:.0f} s "
                f"({exc}):\n{log_tail(vm.run)}"
            ) from None
        for argv in prepare:
            res = await client.exec(list(argv), timeout=boot_timeout)
            if res.exit_code != 0:
                raise SandboxDiedError(f"template prepare step {argv} failed: {res.output}")
        await vm.save()
    finally:
        if client is not None:
            await client.close()
        await vm.stop()


async def launch(tpl: Template, sid: str, meta: dict[str, object] | None = None, *, load: bool = False,
                 timeout: float = 30.0) -> Vm:
    """A QEMU process ready to restore ``tpl``, waiting for its state (:func:`restore`); with
    ``load``, the state loaded too and the guest still paused, as it was saved: it has not run
    an instruction, and :func:`restore` only resumes it."""
    vm = await Vm.launch(sid, tpl.spec, tpl.mem, share=False, incoming=True, meta=meta)
    if load:
        try:
            async with asyncio.timeout(timeout):
                await vm.load(tpl.state)
                await vm.wait_running(resume=False)
        except BaseException:
            await vm.stop()
            raise
        vm.loaded = True
    return vm


async def restore(
    tpl: Template, sid: str, *, meta: dict[str, object] | None = None, timeout: float = 30.0,
    seccomp: bytes | None = None, vm: Vm | None = None,
) -> tuple[Vm, AgentClient]:
    """Start a VM from ``tpl`` and return it with a connected, answering agent client, whose
    later commands run under the ``seccomp`` filter program (None: unfiltered). ``vm``: one
    :func:`launch` started ahead for ``tpl`` (its id is kept; ``sid`` is then unused)."""
    if vm is None:
        vm = await launch(tpl, sid, meta)
    elif meta:
        vm.mark(meta)
    sid = vm.id
    client: AgentClient | None = None
    try:
        async with asyncio.timeout(timeout):
            if vm.loaded:
                await vm.resume()
            else:
                await vm.load(tpl.state)
                await vm.wait_running()
            assert vm.agent is not None
            client = AgentClient(*vm.agent, name=sid, exec_grace=exec_grace(tpl.spec.accel))
            # the guest clock stopped when the template was saved: hello sets it (to the ns)
            await client.hello(set_clock=True, seccomp=seccomp)
            if not client.clock_set:
                raise SandboxDiedError(f"restoring {sid}: the guest agent could not set its clock")
    except BaseException as exc:
        detail = log_tail(vm.run)
        if client is not None:
            await client.close()
        await vm.stop()
        if not isinstance(exc, Exception):
            raise
        raise SandboxDiedError(f"restoring {sid} failed ({exc!r}):\n{detail}") from exc
    return vm, client
