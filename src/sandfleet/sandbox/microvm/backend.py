"""The ``microvm`` backend: a QEMU microvm per sandbox, restored from a memory snapshot.

``create`` finds (or builds, once) the template for the sandbox's image and hardware
limits, then restores a fresh VM from it: restore-to-ready is QEMU start + device state load
+ one agent round trip. Operations go through the shared :class:`AgentSandbox`; this module
only does lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import sandfleet.sandbox.microvm.guest as guest
import sandfleet.sandbox.microvm.host as host
import sandfleet.sandbox.microvm.rootfs as rootfs
from sandfleet.agent.build import agent_binary
from sandfleet.agent.client import AgentClient
from sandfleet.errors import ConfigError
from sandfleet.imagestore import resolve_image
from sandfleet.sandbox import seccomp
from sandfleet.sandbox.base import AgentSandbox, Snapshot, create_many, new_id
from sandfleet.sandbox.microvm.fork import snapshot_vm
from sandfleet.sandbox.microvm.probe import probe_kvm
from sandfleet.sandbox.microvm.template import Template, ensure_template, restore
from sandfleet.sandbox.microvm.vm import Vm, VmSpec
from sandfleet.sandbox.spec import MicrovmConfig, SandboxSpec

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


class MicrovmSandbox(AgentSandbox):
    """A sandbox in its own VM. ``vm`` is the QEMU process, ``template`` where it came from."""

    backend = "microvm"

    def __init__(self, sid: str, spec: SandboxSpec, vm: Vm, client: AgentClient, tpl: Template):
        super().__init__(sid, spec, client)
        self.vm = vm
        self.template = tpl
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
            await self.vm.stop()

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
        return VmSpec(
            kernel=guest.vmlinux(self.kernel),
            initrd=guest.initramfs(self.kernel, agent_binary()),
            disk=rootfs.image_disk(resolve_image(spec.image)),
            vcpus=max(1, math.ceil(lim.cpus or 1)),
            memory_mb=memory,
            disk_mb=lim.disk_mib,
            accel=self.accel(),
            tb_size_mb=self.options.tb_size_mb,
        )

    async def template(self, spec: SandboxSpec) -> Template:
        """The memory snapshot sandboxes with this spec restore from (built on first use)."""
        vm_spec = await asyncio.to_thread(self.vm_spec, spec)
        prepare = [["mkdir", "-p", spec.workdir, "/home/agent", "/logs"], ["bash", "-c", "true"]]
        return await ensure_template(vm_spec, prepare=prepare, boot_timeout=self.options.boot_timeout_s)

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
        program = await seccomp.program_for(spec.seccomp_allow)
        vm, client = await restore(tpl, sid, meta=meta, timeout=self.options.restore_timeout_s, seccomp=program)
        return MicrovmSandbox(sid, spec, vm, client, tpl)

    async def fork(self, snapshot: Snapshot, n: int) -> list[MicrovmSandbox]:
        """``n`` sandboxes restored concurrently from one snapshot."""
        tpl = snapshot.memory_template if isinstance(snapshot, MicrovmSnapshot) else None
        if tpl is None:
            raise ConfigError(f"snapshot {snapshot.id} is not a microvm snapshot")
        return await create_many([lambda: self.restore(tpl, snapshot.spec)] * n)


class MicrovmSnapshot(Snapshot):
    """A snapshot whose memory is a template VMs restore from."""

    memory_template: Template | None = None
