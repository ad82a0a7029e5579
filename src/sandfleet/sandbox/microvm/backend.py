"""The ``microvm`` backend: a QEMU microvm per sandbox, restored from a memory snapshot.

``create`` finds (or builds, once) the template for the sandbox's image and hardware
limits, then restores a fresh VM from it: restore-to-ready is QEMU start + device state load
+ one agent round trip. Operations go through the shared :class:`AgentSandbox`; this module
only does lifecycle.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import sandfleet.sandbox.microvm.guest as guest
import sandfleet.sandbox.microvm.host as host
import sandfleet.sandbox.microvm.rootfs as rootfs
from sandfleet.agent.build import agent_binary
from sandfleet.agent.client import AgentClient
from sandfleet.errors import ConfigError, SandboxError
from sandfleet.imagestore import resolve_image
from sandfleet.sandbox import branching, seccomp
from sandfleet.sandbox.base import AgentSandbox, Sandbox, Snapshot, create_many, new_id
from sandfleet.sandbox.microvm.fork import snapshot_vm
from sandfleet.sandbox.microvm.probe import probe_kvm
from sandfleet.sandbox.microvm.template import Template, ensure_template, launch, restore
from sandfleet.sandbox.microvm.vm import Vm, VmSpec
from sandfleet.sandbox.spec import MicrovmConfig, SandboxSpec

log = logging.getLogger(__name__)

#: the Debian kernel panics in 64 MiB guests; below this a guest is not worth starting
MIN_MEMORY_MIB = 96


class MicrovmOptions(BaseModel):
    """Options of the microvm backend (``MicrovmConfig.options``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accel: Literal["auto", "kvm", "tcg"] = "auto"
    """"auto": KVM when a probe boot shows /dev/kvm runs the guest, else TCG."""
    tb_size_mb: int = Field(64, ge=8, le=2048)
    """TCG only: the translation cache per VM in MiB (QEMU's default 1 GiB costs density)."""
    boot_timeout_s: float = Field(180.0, gt=0)
    """Cold boot of a template VM to its guest agent (once per image and hardware)."""
    restore_timeout_s: float = Field(30.0, gt=0)
    """Restore of one sandbox from its template to an answering agent."""
    prestart: int = Field(0, ge=0, le=64)
    """QEMU processes started ahead for each template this backend restored from, waiting with
    no guest in them (``-incoming defer``): a restore then loads the state into one of them and
    skips QEMU's own start (dynamic linking and device set-up, 50-70 ms here). Each costs a
    QEMU process that waits (docs/microvm.md); :meth:`MicrovmBackend.aclose` ends them. 0: off."""


class MicrovmSandbox(AgentSandbox):
    """A sandbox in its own VM. ``vm`` is the QEMU process, ``template`` where it came from."""

    backend = "microvm"
    commands_are_root = True  # (git's safe.directory, then: sandbox/base.py, any_owner_git; issue 42)

    def __init__(self, sid: str, spec: SandboxSpec, vm: Vm, client: AgentClient, tpl: Template):
        super().__init__(sid, spec, client)
        self.vm = vm
        self.template = tpl
        self.stack: list[branching.Held] = []  # a branch's snapshot it was restored from, held until close
        self.restore: Any = None  # its backend's restore (a branch makes its children with it)
        self._ttl: asyncio.TimerHandle | None = None
        if spec.limits.ttl_s:
            self._ttl = asyncio.get_running_loop().call_later(spec.limits.ttl_s, self._expire)

    def _expire(self) -> None:
        """TTL reached: kill the VM now; the agent stream ends and the sandbox reads as dead."""
        with contextlib.suppress(ProcessLookupError):
            self.vm.proc.kill()

    async def close(self) -> None:
        """Stop the VM and remove its directory (sockets, logs, marker)."""
        if self._closed:
            return
        self._closed = True
        if self._ttl is not None:
            self._ttl.cancel()
        try:
            await self.client.close()
        finally:
            try:
                await self.vm.stop()
            finally:
                branching.drop_all(self.stack)
                self.stack = []

    async def branch(self, n: int, *, processes: Literal["error", "drop"] = "error") -> list[Sandbox]:
        """``n`` VMs restored from a snapshot of this one taken now (memory, so its processes,
        and its disk); this one resumes. Each child gets a new hostname and /etc/machine-id, and
        fresh bytes mixed into its kernel's random pool (docs/branching.md: what a process that
        holds its own random state sees)."""
        branching.check_count(n, processes)
        self._check()
        snap = await self.snapshot()
        assert isinstance(snap, MicrovmSnapshot)
        held = branching.Held(snap.delete, f"snapshot {snap.id} of {self.id}").take()
        tpl = snap.memory_template
        try:
            children: list[MicrovmSandbox] = await create_many([lambda: self.restore(tpl, self.spec)] * n)
            for c in children:
                c.stack = [held.take()]
        finally:
            held.drop()  # each child holds it now (or, failed, none does: removed)
        try:
            await asyncio.gather(*(_reseed(c) for c in children))
        except BaseException:
            await branching.close_quietly(children)
            raise
        await branching.finish_children(self, children, ["filesystem", "sessions", "memory", "processes"], [],
                                        identity=False)
        return list(children)

    async def snapshot(self) -> Snapshot:
        """Save this VM's memory and disk state; :meth:`MicrovmBackend.fork` restores it."""
        self._check()
        tpl = await snapshot_vm(self.vm, self.template.spec, self.id)
        result = MicrovmSnapshot(backend="microvm", spec=self.spec, layer=None, memory=tpl.mem,
                                 cleanup=lambda: shutil.rmtree(tpl.dir, ignore_errors=True))
        result.memory_template = tpl
        return result


class MicrovmBackend:
    """Creates microvm sandboxes. Host checks happen here, so a missing QEMU fails early."""

    name = "microvm"

    def __init__(self, config: MicrovmConfig | None = None):
        self.config = config or MicrovmConfig()
        try:
            self.options = MicrovmOptions(**self.config.options)
        except ValidationError as exc:
            raise ConfigError(f"invalid microvm options: {exc}") from None
        host.qemu_binary()
        self.kernel = host.find_kernel()
        guest.vmlinux(self.kernel)  # needs the kernel's decompressor (lz4); cached after once
        guest._busybox()
        self._accel: str | None = None
        #: vm_spec's answers; building the boot files to learn their content hashes cost
        #: ~150 ms of every create (the initramfs compressed again), now paid once per inputs
        self._specs: dict[tuple[object, ...], VmSpec] = {}
        self._templates: dict[tuple[VmSpec, tuple[tuple[str, ...], ...]], Template] = {}
        #: QEMUs started ahead (options.prestart), per template directory
        self._spares: dict[Path, _Spares] = {}

    def accel(self) -> str:
        """The accelerator VMs get ("kvm" or "tcg"), probed once."""
        if self._accel is None:
            choice = self.options.accel
            self._accel = probe_kvm().accel if choice == "auto" else choice
        return self._accel

    def vm_spec(self, spec: SandboxSpec) -> VmSpec:
        """The VM hardware and boot files for a sandbox spec (builds cached files if needed)."""
        lim = spec.limits
        if lim.network:
            raise ConfigError("microvm sandboxes have no network device (limits.network=True)")
        memory = lim.memory_mib or 1024
        if memory < MIN_MEMORY_MIB:
            raise ConfigError(f"microvm guests need at least {MIN_MEMORY_MIB} MiB of memory, not {memory}")
        image = resolve_image(spec.image)
        agent = agent_binary()
        vcpus = max(1, math.ceil(lim.cpus or 1))
        key = (image.hash, tuple(image.lowers), agent, _stamp(guest._busybox()), _stamp(self.kernel.image),
               _stamp(self.kernel.modules / "modules.dep"), vcpus, memory,
               lim.disk_mib, self.accel(), self.options.tb_size_mb)
        known = self._specs.get(key)
        if known is not None and all(p.is_file() for p in (known.kernel, known.initrd, known.disk)):
            return known
        made = VmSpec(
            kernel=guest.vmlinux(self.kernel),
            initrd=guest.initramfs(self.kernel, agent),
            disk=rootfs.image_disk(image),
            vcpus=vcpus,
            memory_mb=memory,
            disk_mb=lim.disk_mib,
            accel=self.accel(),
            tb_size_mb=self.options.tb_size_mb,
        )
        self._specs[key] = made
        return made

    async def template(self, spec: SandboxSpec) -> Template:
        """The memory snapshot sandboxes with this spec restore from (built on first use)."""
        vm_spec = await asyncio.to_thread(self.vm_spec, spec)
        prepare = (("mkdir", "-p", spec.workdir, "/home/agent", "/logs"), ("bash", "-c", "true"))
        known = self._templates.get((vm_spec, prepare))
        if known is not None and known.state.is_file():
            return known
        tpl = await ensure_template(vm_spec, prepare=prepare, boot_timeout=self.options.boot_timeout_s)
        self._templates[(vm_spec, prepare)] = tpl
        return tpl

    async def create(self, spec: SandboxSpec) -> MicrovmSandbox:
        """A fresh sandbox restored from the template of ``spec``."""
        return await self.restore(await self.template(spec), spec)

    async def restore(self, tpl: Template, spec: SandboxSpec) -> MicrovmSandbox:
        """A sandbox restored from ``tpl`` (a template or a sandbox snapshot)."""
        sid = new_id("microvm")
        meta: dict[str, object] = {
            "image": spec.image,
            "ttl_s": spec.limits.ttl_s,
            "labels": spec.labels,
        }
        program = await seccomp.program_for(spec.seccomp_allow, protect_init=True)  # the agent is pid 1
        spare = await self._take_spare(tpl)
        try:
            vm, client = await restore(tpl, sid, meta=meta, timeout=self.options.restore_timeout_s,
                                       seccomp=program, vm=spare)
        finally:
            if self.options.prestart:
                self._refill(tpl)  # after the restore: a QEMU starting would compete with it
        box = MicrovmSandbox(vm.id, spec, vm, client, tpl)
        box.restore = self.restore
        return box

    async def _take_spare(self, tpl: Template) -> Vm | None:
        """A QEMU started ahead for ``tpl`` in this event loop and still alive, or None."""
        spares = self._spares.get(tpl.dir)
        if spares is None or not spares.serves(asyncio.get_running_loop()):
            return None
        return await spares.take()

    def _refill(self, tpl: Template) -> None:
        spares = self._spares.get(tpl.dir)
        if spares is None or not spares.serves(asyncio.get_running_loop()):
            # (one of a finished loop ended its QEMUs when that loop cancelled its tasks)
            spares = self._spares[tpl.dir] = _Spares(tpl, self.options)
        spares.wake.set()

    async def aclose(self) -> None:
        """End the QEMUs started ahead (``prestart``); sandboxes already made are untouched.
        (``asyncio.run`` ending its loop ends them too: it cancels the task that keeps them.)"""
        loop = asyncio.get_running_loop()
        mine = [s for s in self._spares.values() if s.serves(loop)]
        self._spares = {k: s for k, s in self._spares.items() if s not in mine}
        for spares in mine:
            spares.task.cancel()
        await asyncio.gather(*(s.task for s in mine), return_exceptions=True)

    async def fork(self, snapshot: Snapshot, n: int) -> list[MicrovmSandbox]:
        """``n`` sandboxes restored concurrently from one snapshot."""
        tpl = snapshot.memory_template if isinstance(snapshot, MicrovmSnapshot) else None
        if tpl is None:
            raise ConfigError(f"snapshot {snapshot.id} is not a microvm snapshot")
        return await create_many([lambda: self.restore(tpl, snapshot.spec)] * n)


async def _reseed(child: MicrovmSandbox) -> None:
    """A new identity for a restored child: /etc/machine-id, and 64 fresh bytes written to
    /dev/urandom (mixed into the kernel's pool, so the children's kernel random streams part;
    no vmgenid device: docs/branching.md). The hostname stays the guest's: commands can't
    change it (no CAP_SYS_ADMIN over the guest's UTS namespace)."""
    script = 'printf "%s\\n" "$2" > /etc/machine-id && printf "%s" "$3" | base64 -d > /dev/urandom'
    res = await child.exec(["sh", "-c", script, "sh", child.id, uuid.uuid4().hex,
                            base64.b64encode(os.urandom(64)).decode()], user="root", cwd="/", timeout=60)
    if res.exit_code != 0:
        raise SandboxError(f"branch child {child.id}: its new identity failed: {res.output.strip()[:300]}")


class _Spares:
    """The QEMUs started ahead for one template in one event loop, kept by a task of that loop:
    it starts them (state loaded, guest paused) up to ``prestart`` whenever woken, and when it is
    cancelled (``aclose``, or ``asyncio.run`` ending the loop) it stops them all."""

    def __init__(self, tpl: Template, options: MicrovmOptions):
        self.tpl, self.options = tpl, options
        self.vms: list[Vm] = []
        self.wake = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self.task = self.loop.create_task(self._keep(), name=f"sandfleet-microvm-prestart-{tpl.dir.name}")

    def serves(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self.loop is loop and not self.task.done()

    async def take(self) -> Vm | None:
        while self.vms:
            vm = self.vms.pop(0)
            if vm.alive():
                return vm
            await vm.stop()
        return None

    async def _keep(self) -> None:
        try:
            while True:
                await self.wake.wait()
                self.wake.clear()
                while len(self.vms) < self.options.prestart:
                    try:
                        vm = await launch(self.tpl, new_id("microvm"), load=True,
                                          timeout=self.options.restore_timeout_s)
                    except Exception as e:  # (restores start their own QEMU meanwhile)
                        log.warning("starting a QEMU ahead for template %s failed: %s", self.tpl.dir.name, e)
                        break
                    self.vms.append(vm)
        finally:
            vms, self.vms = self.vms, []
            await asyncio.gather(*(vm.stop() for vm in vms), return_exceptions=True)


def _stamp(path: Path) -> tuple[int, int, int]:
    """(size, mtime, inode) of a file the boot files are made from: a changed one is a new key."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


class MicrovmSnapshot(Snapshot):
    """A snapshot whose memory is a template VMs restore from."""

    memory_template: Template | None = None
