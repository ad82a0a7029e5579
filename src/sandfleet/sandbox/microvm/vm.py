"""One QEMU ``microvm`` process: its command line, run directory, start and teardown.

Each VM lives in a private directory under sandfleet's state root holding its QMP and
agent sockets, its serial console log and the shared ``meta.json`` marker (owner pid, QEMU
pid, TTL). Nothing outlives its owner: QEMU is started under ``setpriv --pdeathsig KILL``
(the kernel kills it when the owning process dies), and :func:`state.reap_leftovers`
removes whatever a killed owner still left (directory, QEMU process).
Memory is a file-backed RAM block: the template VM of a snapshot writes its RAM through a
shared mapping into the snapshot's memory file; restored VMs map that file privately, so
their untouched pages stay shared in the host page cache (copy-on-write).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from sandfleet.errors import SandboxDiedError
from sandfleet.sandbox.microvm.guest import AGENT_PORT
from sandfleet.sandbox.microvm.host import qemu_binary, tsc_khz
from sandfleet.sandbox.microvm.qmp import Qmp
from sandfleet.sandbox.state import new_sandbox_dir, proc_start_time, remove_sandbox_dir, write_meta


@dataclass(frozen=True)
class VmSpec:
    """Everything that shapes a VM's hardware; a snapshot is only valid for an equal spec."""

    kernel: Path
    initrd: Path
    disk: Path
    vcpus: int = 1
    memory_mb: int = 256
    disk_mb: int = 1024
    accel: str = "tcg"
    tb_size_mb: int = 64

    def argv(self, run: Path, mem_path: Path, *, share: bool) -> list[str]:
        """The QEMU command line; only ``run``, ``mem_path`` and ``share`` vary per VM."""
        accel = (
            ["-accel", "kvm", "-cpu", "host"]
            if self.accel == "kvm"
            else ["-accel", f"tcg,tb-size={self.tb_size_mb}", "-cpu", "max"]
        )
        cmdline = (
            f"console=ttyS0 quiet loglevel=3 panic=-1 reboot=t tsc_early_khz={tsc_khz()} "
            f"8250.nr_uarts=1 i8042.noaux i8042.nopnp sandfleet.disk={self.disk_mb}m"
        )
        mem = (
            f"memory-backend-file,id=mem,size={self.memory_mb}M,mem-path={mem_path},"
            f"share={'on' if share else 'off'},prealloc=off"
        )
        return [
            str(qemu_binary()),
            "-name", f"sandfleet,process=sandfleet-vm:{run.name}",
            "-M", "microvm,x-option-roms=off,rtc=on,memory-backend=mem",
            *accel,
            "-m", f"{self.memory_mb}M", "-smp", str(self.vcpus),
            "-object", mem,
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            "-kernel", str(self.kernel), "-initrd", str(self.initrd), "-append", cmdline,
            "-chardev", f"file,id=console,path={run / 'console.log'}",
            "-serial", "chardev:console",
            "-drive", f"id=root,file={self.disk},format=raw,if=none,readonly=on",
            "-device", "virtio-blk-device,drive=root",
            "-device", "virtio-serial-device,max_ports=2",
            "-chardev", f"socket,id=agent,path={run / 'agent.sock'},server=on,wait=off",
            "-device", f"virtserialport,chardev=agent,name={AGENT_PORT}",
            "-qmp", f"unix:{run / 'qmp.sock'},server=on,wait=off",
        ]  # fmt: skip


class Vm:
    """A running QEMU process. Start with :meth:`start`; always finish with :meth:`stop`."""

    def __init__(self, run: Path, proc: asyncio.subprocess.Process, qmp: Qmp | None):
        self.run = run
        self.proc = proc
        self.qmp = qmp
        #: the guest state is loaded (paused, not yet resumed): see template.launch
        self.loaded = False
        #: the marker's fields (meta.json)
        self.meta: dict[str, object] = {}
        #: the byte stream to the guest agent, opened by :meth:`start`
        self.agent: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    @classmethod
    async def start(
        cls,
        sid: str,
        spec: VmSpec,
        mem_path: Path,
        *,
        share: bool,
        meta: dict[str, object] | None = None,
        incoming: Path | None = None,
        save_to: Path | None = None,
        ignore_shared: bool = True,
    ) -> Vm:
        """Launch QEMU.

        With ``incoming``, restore the device state saved in that file (RAM comes from
        ``mem_path``). With ``save_to``, QEMU holds that file open for :meth:`save`.
        ``ignore_shared=False`` loads a full stream (RAM included) into a shared mapping.
        """
        vm = await cls.launch(sid, spec, mem_path, share=share, meta=meta, incoming=incoming is not None,
                              ignore_shared=ignore_shared)
        try:
            if incoming is not None:
                await vm.load(incoming)
            elif save_to is not None:
                await vm._send_file("save", save_to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except BaseException:
            await vm.stop()
            raise
        return vm

    @classmethod
    async def launch(
        cls, sid: str, spec: VmSpec, mem_path: Path, *, share: bool, meta: dict[str, object] | None = None,
        incoming: bool = False, ignore_shared: bool = True,
    ) -> Vm:
        """Start the QEMU process, connected over QMP and to the agent's socket; with
        ``incoming`` it waits (``-incoming defer``, no guest state, nothing running) for
        :meth:`load`. A VM launched ahead this way is what a prestarted restore takes."""
        meta = {"id": sid, "backend": "microvm", **(meta or {})}
        run = new_sandbox_dir(sid, meta, mode=0o700)
        argv = spec.argv(run, mem_path, share=share)
        if incoming:
            argv += ["-incoming", "defer"]
        setpriv = shutil.which("setpriv")
        if setpriv:
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        try:
            with open(run / "qemu.log", "wb") as log:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
        except BaseException:
            remove_sandbox_dir(run)
            raise
        meta = {**meta, "pids": [proc.pid], "pid_starts": {str(proc.pid): proc_start_time(proc.pid)}}
        write_meta(run, meta)
        vm = cls(run, proc, None)
        vm.meta = meta
        try:
            vm.qmp = await cls._connect_qmp(run, proc)
            # connect before the state loads, so the restored guest never sees the host leave
            vm.agent = await vm._open_agent()
            await vm.set_ignore_shared(ignore_shared)
        except BaseException:
            await vm.stop()
            raise
        return vm

    async def load(self, incoming: Path) -> None:
        """Load the device state saved in ``incoming`` into a VM launched with ``incoming``
        (it starts; :meth:`wait_running` waits for the end)."""
        assert self.qmp is not None
        await self._send_file("state", incoming, os.O_RDONLY)
        await self.qmp.execute("migrate-incoming", uri="fd:state")

    @property
    def id(self) -> str:
        """The sandbox id: the name of the run directory."""
        return self.run.name

    def mark(self, meta: dict[str, object]) -> None:
        """Add a sandbox's fields (image, TTL, labels) to the marker of a VM launched ahead;
        the marker's time is now, so the TTL counts from the sandbox's start."""
        self.meta = {**self.meta, **meta}
        write_meta(self.run, self.meta)

    @staticmethod
    async def _connect_qmp(run: Path, proc: asyncio.subprocess.Process) -> Qmp:
        for _ in range(400):
            if proc.returncode is not None:
                break
            if (run / "qmp.sock").exists():
                with contextlib.suppress(SandboxDiedError):
                    return await Qmp.connect(run / "qmp.sock")
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        raise SandboxDiedError(f"QEMU did not start: {log_tail(run)}")

    async def _open_agent(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream to the guest agent's virtio-serial port."""
        try:
            return await asyncio.open_unix_connection(str(self.run / "agent.sock"), limit=2**22)
        except OSError as exc:
            raise SandboxDiedError(f"can't reach the agent socket: {exc}") from exc

    async def set_ignore_shared(self, on: bool) -> None:
        """Migrate RAM mapped shared (a template's memory file) by reference, not by value."""
        assert self.qmp is not None
        caps = [{"capability": "x-ignore-shared", "state": on}]
        await self.qmp.execute("migrate-set-capabilities", capabilities=caps)

    async def _send_file(self, name: str, path: Path, flags: int) -> None:
        """Open ``path`` here and hand the descriptor to QEMU as ``name`` (QMP ``getfd``)."""
        assert self.qmp is not None
        fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        try:
            await self.qmp.execute("getfd", fd=fd, fdname=name)
        finally:
            os.close(fd)

    async def save(self, path: Path | None = None, *, timeout: float = 60.0) -> None:
        """Pause the guest and write its state to ``path`` (default: ``save_to`` of start).

        RAM in a shared mapping is not in that file (it is in the memory file already);
        RAM in a private mapping is.
        """
        assert self.qmp is not None
        await self.qmp.execute("stop")
        if path is not None:
            await self._send_file("save", path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        await self.qmp.execute("migrate", uri="fd:save")
        async with asyncio.timeout(timeout):
            while True:
                info = await self.qmp.execute("query-migrate")
                if info.get("status") == "completed":
                    return
                if info.get("status") in ("failed", "cancelled"):
                    raise SandboxDiedError(f"saving the VM failed: {info.get('error-desc')}")
                await asyncio.sleep(0.01)

    async def wait_running(self, *, timeout: float = 30.0, resume: bool = True) -> None:
        """Wait until an incoming VM has loaded its state, then resume it.

        The template was paused when it was saved, so the restored VM starts paused too.
        """
        assert self.qmp is not None
        async with asyncio.timeout(timeout):
            while True:
                info = await self.qmp.execute("query-migrate")
                if info.get("status") == "completed":
                    break
                if info.get("status") in ("failed", "cancelled"):
                    raise SandboxDiedError(f"restoring the VM failed: {info.get('error-desc')}: {log_tail(self.run)}")
                await asyncio.sleep(0.002)
            if resume:
                await self.resume()

    async def resume(self) -> None:
        """Run the (paused) guest."""
        assert self.qmp is not None
        await self.qmp.execute("cont")

    def alive(self) -> bool:
        """Whether the QEMU process is still running."""
        return self.proc.returncode is None

    async def stop(self, *, timeout: float = 2.0) -> None:
        """Quit QEMU (QMP ``quit``, SIGKILL after ``timeout``) and remove the run directory."""
        try:
            if self.proc.returncode is None and self.qmp is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.qmp.execute("quit"), timeout)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGKILL)
                await self.proc.wait()
        finally:
            if self.proc.returncode is None:  # cancelled while waiting: don't leave it
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGKILL)
            if self.qmp is not None:
                with contextlib.suppress(Exception):
                    await self.qmp.close()
            if self.agent is not None:
                self.agent[1].close()
            remove_sandbox_dir(self.run)


def log_tail(run: Path, lines: int = 15) -> str:
    """The last lines of the VM's QEMU log and serial console, for error messages."""
    parts = []
    for name in ("qemu.log", "console.log"):
        with contextlib.suppress(OSError):
            text = (run / name).read_text(errors="replace").strip()
            if text:
                parts.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(parts) or "(no output)"
