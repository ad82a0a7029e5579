"""Whether KVM runs the guest here, and what ``sandfleet doctor`` asks of the microvm backend.

The accelerator is chosen by *running* a guest, not by looking at ``/dev/kvm``: some hosts
(nested PVM, for one) expose a ``/dev/kvm`` that can't run a stock Debian kernel at a usable
speed. :func:`probe_kvm` boots the guest kernel once under KVM with a short timeout, and the
answer is cached in ``~/.cache/sandfleet/microvm/kvm-probe.json`` keyed by everything that
could change it (host kernel, QEMU version, guest kernel, boot id).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import sandfleet.sandbox.microvm.host as host
from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox.microvm.guest import PROBE_MARKER, probe_initramfs, vmlinux
from sandfleet.settings import current as current_settings

PROBE_TIMEOUT_S = 8.0


@dataclass(frozen=True)
class AccelChoice:
    """Which accelerator guests get on this host, and why."""

    accel: str  # "kvm" or "tcg"
    reason: str
    probe_s: float | None = None


def _probe_key(kernel: host.GuestKernel) -> str:
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    boot = boot_id.read_text().strip() if boot_id.is_file() else ""
    return "|".join([platform.release(), host.qemu_version(), kernel.version, boot])


def probe_kvm(*, refresh: bool = False) -> AccelChoice:
    """KVM if ``/dev/kvm`` boots the guest kernel within :data:`PROBE_TIMEOUT_S`, else TCG.

    ``SANDFLEET_MICROVM_ACCEL=kvm|tcg`` forces the answer. The probe result is cached.
    """
    forced = current_settings().microvm_accel
    if forced in ("kvm", "tcg"):
        return AccelChoice(forced, "forced by SANDFLEET_MICROVM_ACCEL")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return AccelChoice("tcg", "/dev/kvm is missing or not accessible")
    kernel = host.find_kernel()
    key = _probe_key(kernel)
    cached = host.cache_dir() / "kvm-probe.json"
    if not refresh and cached.is_file():
        try:
            data = json.loads(cached.read_text())
            if data.get("key") == key:
                return AccelChoice(data["accel"], data["reason"], data.get("probe_s"))
        except (ValueError, KeyError):
            pass
    choice = _run_probe(kernel)
    tmp = cached.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps({"key": key, **asdict(choice)}))
    tmp.replace(cached)
    return choice


def _run_probe(kernel: host.GuestKernel) -> AccelChoice:
    argv = [
        str(host.qemu_binary()), "-M", "microvm,x-option-roms=off", "-accel", "kvm", "-cpu", "host",
        "-m", "128", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
        "-no-reboot", "-kernel", str(vmlinux(kernel)), "-initrd", str(probe_initramfs(kernel)),
        "-append", "console=ttyS0 quiet panic=-1", "-serial", "stdio",
    ]  # fmt: skip
    start = time.monotonic()
    try:
        out = subprocess.run(argv, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return AccelChoice(
            "tcg",
            f"/dev/kvm did not boot the guest kernel within {PROBE_TIMEOUT_S:.0f} s "
            "(nested or paravirtual KVM?); using TCG",
        )
    took = time.monotonic() - start
    if PROBE_MARKER.encode() in out.stdout:
        return AccelChoice("kvm", f"/dev/kvm booted the guest kernel in {took:.2f} s", took)
    tail = (out.stderr or out.stdout).decode(errors="replace").strip().splitlines()[-1:]
    return AccelChoice("tcg", f"/dev/kvm failed to boot the guest: {' '.join(tail)}", took)


def kvm_report() -> dict[str, Any]:
    """``present``: /dev/kvm exists; ``usable``: it runs the guest kernel; ``reason``: why."""
    present = Path("/dev/kvm").exists()
    try:
        choice = probe_kvm()
    except HostUnsupportedError as exc:
        return {"present": present, "usable": None, "reason": str(exc)}
    return {"present": present, "usable": choice.accel == "kvm", "reason": choice.reason}


def availability() -> dict[str, Any]:
    """``available``, ``reason``, and the ``accel`` guests get on this host."""
    try:
        qemu = host.qemu_binary()
        kernel = host.find_kernel()
        choice = probe_kvm()
    except HostUnsupportedError as exc:
        return {"available": False, "reason": str(exc)}
    return {
        "available": True,
        "accel": choice.accel,
        "reason": f"{host.qemu_version()} ({qemu}); guest kernel {kernel.version}; "
        f"{choice.accel.upper()}: {choice.reason}",
    }
