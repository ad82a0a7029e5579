"""What this host offers the microvm backend: QEMU, a guest kernel, and KVM or TCG.

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
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from sandfleet.errors import HostUnsupportedError

#: what to install when something is missing (Debian package names)
PACKAGES = "qemu-system-x86 linux-image-cloud-amd64 busybox-static lz4 e2fsprogs util-linux"
PROBE_TIMEOUT_S = 8.0
PROBE_MARKER = "SANDFLEET-PROBE-OK"


def cache_dir() -> Path:
    """``<sandfleet cache>/microvm`` (``$SANDFLEET_CACHE`` or ``~/.cache/sandfleet``)."""
    from sandfleet.agent.build import cache_dir as sandfleet_cache

    path = sandfleet_cache() / "microvm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def qemu_binary() -> Path:
    """The ``qemu-system-x86_64`` binary, or :class:`HostUnsupportedError` saying how to get it."""
    found = os.environ.get("SANDFLEET_QEMU") or shutil.which("qemu-system-x86_64")
    if not found:
        raise HostUnsupportedError(f"qemu-system-x86_64 not found; install it with: apt-get install {PACKAGES}")
    return Path(found)


@cache
def qemu_version() -> str:
    """``qemu-system-x86_64 --version``'s first line."""
    out = subprocess.run([str(qemu_binary()), "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else "unknown"


@dataclass(frozen=True)
class GuestKernel:
    """A Debian kernel package on this host: compressed image and its module tree."""

    version: str
    image: Path
    modules: Path


def find_kernel() -> GuestKernel:
    """The guest kernel: ``$SANDFLEET_GUEST_KERNEL`` or the newest ``*-cloud-amd64`` in /boot."""
    wanted = os.environ.get("SANDFLEET_GUEST_KERNEL")
    candidates = [Path(wanted)] if wanted else sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"))
    for image in reversed(candidates):
        version = image.name.removeprefix("vmlinuz-")
        modules = Path("/lib/modules") / version
        if image.is_file() and (modules / "modules.dep").is_file():
            return GuestKernel(version, image, modules)
    raise HostUnsupportedError(
        "no guest kernel (/boot/vmlinuz-*-cloud-amd64 with /lib/modules/<version>); "
        f"install it with: apt-get install {PACKAGES}"
    )


@cache
def tsc_khz() -> int:
    """The host TSC frequency in kHz; TCG guests need it as ``tsc_early_khz`` to boot fast."""
    sysfs = Path("/sys/devices/system/cpu/cpu0/tsc_freq_khz")
    if sysfs.is_file():
        return int(sysfs.read_text().strip())
    match = re.search(r"^cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text(), re.M)
    return int(float(match.group(1)) * 1000) if match else 2_000_000


@dataclass(frozen=True)
class AccelChoice:
    """Which accelerator guests get on this host, and why."""

    accel: str  # "kvm" or "tcg"
    reason: str
    probe_s: float | None = None


def _probe_key(kernel: GuestKernel) -> str:
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    boot = boot_id.read_text().strip() if boot_id.is_file() else ""
    return "|".join([platform.release(), qemu_version(), kernel.version, boot])


def probe_kvm(*, refresh: bool = False) -> AccelChoice:
    """KVM if ``/dev/kvm`` boots the guest kernel within :data:`PROBE_TIMEOUT_S`, else TCG.

    ``SANDFLEET_MICROVM_ACCEL=kvm|tcg`` forces the answer. The probe result is cached.
    """
    forced = os.environ.get("SANDFLEET_MICROVM_ACCEL")
    if forced in ("kvm", "tcg"):
        return AccelChoice(forced, "forced by SANDFLEET_MICROVM_ACCEL")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return AccelChoice("tcg", "/dev/kvm is missing or not accessible")
    kernel = find_kernel()
    key = _probe_key(kernel)
    cached = cache_dir() / "kvm-probe.json"
    if not refresh and cached.is_file():
        try:
            data = json.loads(cached.read_text())
            if data.get("key") == key:
                return AccelChoice(data["accel"], data["reason"], data.get("probe_s"))
        except (ValueError, KeyError):
            pass
    choice = _run_probe(kernel)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, **asdict(choice)}))
    tmp.replace(cached)
    return choice


def _run_probe(kernel: GuestKernel) -> AccelChoice:
    from sandfleet.sandbox.microvm.guest import probe_initramfs, vmlinux

    argv = [
        str(qemu_binary()), "-M", "microvm,x-option-roms=off", "-accel", "kvm", "-cpu", "host",
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


def doctor() -> dict[str, str]:
    """What ``sandfleet doctor`` reports for the microvm backend (name -> status line)."""
    report: dict[str, str] = {}
    try:
        report["qemu"] = f"{qemu_binary()} ({qemu_version()})"
        kernel = find_kernel()
        report["guest kernel"] = f"{kernel.image} ({kernel.version})"
        choice = probe_kvm()
        report["accelerator"] = f"{choice.accel}: {choice.reason}"
    except HostUnsupportedError as exc:
        report["unavailable"] = str(exc)
    return report
