"""What ``sandfleet doctor`` asks of the microvm backend: is it usable here, KVM or TCG, why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox.microvm import host


def kvm_report() -> dict[str, Any]:
    """``present``: /dev/kvm exists; ``usable``: it runs the guest kernel; ``reason``: why."""
    present = Path("/dev/kvm").exists()
    try:
        choice = host.probe_kvm()
    except HostUnsupportedError as exc:
        return {"present": present, "usable": None, "reason": str(exc)}
    return {"present": present, "usable": choice.accel == "kvm", "reason": choice.reason}


def availability() -> dict[str, Any]:
    """``available``, ``reason``, and the ``accel`` guests get on this host."""
    try:
        qemu = host.qemu_binary()
        kernel = host.find_kernel()
        choice = host.probe_kvm()
    except HostUnsupportedError as exc:
        return {"available": False, "reason": str(exc)}
    return {
        "available": True,
        "accel": choice.accel,
        "reason": f"{host.qemu_version()} ({qemu}); guest kernel {kernel.version}; "
        f"{choice.accel.upper()}: {choice.reason}",
    }
