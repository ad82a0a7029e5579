"""One QEMU ``microvm`` process: its command line, run directory, start and teardown.

Each VM lives in a private run directory holding its QMP and agent sockets, its serial
console log and an ``owner.json`` marker. Nothing outlives its owner: QEMU is started under
``setpriv --pdeathsig KILL`` (the kernel kills it when the owning process dies), and
:mod:`reaper` removes whatever a killed owner still left (run directories, processes).
Memory is a file-backed RAM block: the template VM of a snapshot writes its RAM through a
shared mapping into the snapshot's memory file; restored VMs map that file privately, so
their untouched pages stay shared in the host page cache (copy-on-write).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from sandfleet.errors import SandboxDiedError
from sandfleet.sandbox.microvm.guest import AGENT_PORT
from sandfleet.sandbox.microvm.host import qemu_binary, tsc_khz
from sandfleet.sandbox.microvm.qmp import Qmp


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


def runtime_root() -> Path:
    """Where run directories live (short: unix socket paths are limited to 108 bytes)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    root = Path(base) / f"sandfleet-vm-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def process_start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), to tell a pid from its reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


#: migrate RAM blocks mapped shared (the snapshot's memory file) by reference, not by value
IGNORE_SHARED = [{"capability": "x-ignore-shared", "state": True}]


class Vm:
    """A running QEMU process. Start with :meth:`start`; always finish with :meth:`stop`."""

    def __init__(self, run: Path, proc: asyncio.subprocess.Process, qmp: Qmp | None):
        self.run = run
        self.proc = proc
        self.qmp = qmp

    @classmethod
    async def start(
        cls,
        spec: VmSpec,
        mem_path: Path,
        *,
        share: bool,
        incoming: Path | None = None,
        save_to: Path | None = None,
    ) -> Vm:
        """Launch QEMU.

        With ``incoming``, restore the device state saved in that file (RAM comes from
        ``mem_path``). With ``save_to``, QEMU holds that file open for :meth:`save`.
        """
        run = runtime_root() / secrets.token_hex(6)
        run.mkdir(mode=0o700)
        marker = {"owner_pid": os.getpid(), "owner_start": process_start_time(os.getpid())}
        (run / "owner.json").write_text(json.dumps(marker))
        argv = spec.argv(run, mem_path, share=share)
        if incoming is not None:
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
            shutil.rmtree(run, ignore_errors=True)
            raise
        marker["qemu_pid"] = proc.pid
        (run / "owner.json").write_text(json.dumps(marker))
        vm = cls(run, proc, None)
        try:
            vm.qmp = await cls._connect_qmp(run, proc)
            await vm.qmp.execute("migrate-set-capabilities", capabilities=IGNORE_SHARED)
            if incoming is not None:
                await vm._send_file("state", incoming, os.O_RDONLY)
                await vm.qmp.execute("migrate-incoming", uri="fd:state")
            elif save_to is not None:
                await vm._send_file("state", save_to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except BaseException:
            await vm.stop()
            raise
        return vm

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

    async def open_agent(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A byte stream to the guest agent's virtio-serial port."""
        try:
            return await asyncio.open_unix_connection(str(self.run / "agent.sock"), limit=2**22)
        except OSError as exc:
            raise SandboxDiedError(f"can't reach the agent socket: {exc}") from exc

    async def _send_file(self, name: str, path: Path, flags: int) -> None:
        """Open ``path`` here and hand the descriptor to QEMU as ``name`` (QMP ``getfd``)."""
        assert self.qmp is not None
        fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        try:
            await self.qmp.execute("getfd", fd=fd, fdname=name)
        finally:
            os.close(fd)

    async def save(self, *, timeout: float = 60.0) -> None:
        """Pause the guest and write its device state to the ``save_to`` file given at start.

        RAM is not in that file: it is already in the shared memory file.
        """
        assert self.qmp is not None
        await self.qmp.execute("stop")
        await self.qmp.execute("migrate", uri="fd:state")
        async with asyncio.timeout(timeout):
            while True:
                info = await self.qmp.execute("query-migrate")
                if info.get("status") == "completed":
                    return
                if info.get("status") in ("failed", "cancelled"):
                    raise SandboxDiedError(f"saving the VM failed: {info.get('error-desc')}")
                await asyncio.sleep(0.01)

    async def wait_running(self, *, timeout: float = 30.0) -> None:
        """Wait until an incoming VM has loaded its state and runs."""
        assert self.qmp is not None
        async with asyncio.timeout(timeout):
            while True:
                status = (await self.qmp.execute("query-status"))["status"]
                if status == "running":
                    return
                if status not in ("inmigrate", "prelaunch", "restore-vm", "paused"):
                    raise SandboxDiedError(f"restored VM is {status}: {log_tail(self.run)}")
                await asyncio.sleep(0.002)

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
            shutil.rmtree(self.run, ignore_errors=True)


def log_tail(run: Path, lines: int = 15) -> str:
    """The last lines of the VM's QEMU log and serial console, for error messages."""
    parts = []
    for name in ("qemu.log", "console.log"):
        with contextlib.suppress(OSError):
            text = (run / name).read_text(errors="replace").strip()
            if text:
                parts.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(parts) or "(no output)"
