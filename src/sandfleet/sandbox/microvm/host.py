"""What this host offers the microvm backend: QEMU and a guest kernel (whether KVM runs it
is :mod:`sandfleet.sandbox.microvm.probe`'s question)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from sandfleet.errors import HostUnsupportedError
from sandfleet.settings import current as current_settings

#: what to install when something is missing (Debian package names)
PACKAGES = "qemu-system-x86 linux-image-cloud-amd64 busybox-static lz4 e2fsprogs util-linux"


def cache_dir() -> Path:
    """``<sandfleet cache>/microvm`` (``$SANDFLEET_CACHE`` or ``~/.cache/sandfleet``)."""
    from sandfleet.agent.build import cache_dir as sandfleet_cache

    path = sandfleet_cache() / "microvm"
    path.mkdir(parents=True, exist_ok=True)
    return path


def qemu_binary() -> Path:
    """The ``qemu-system-x86_64`` binary, or :class:`HostUnsupportedError` saying how to get it."""
    found = current_settings().qemu or shutil.which("qemu-system-x86_64")
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
    wanted = current_settings().guest_kernel
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
