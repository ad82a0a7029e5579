"""What this host supports, and what to do about what it lacks (``sandfleet doctor``:
:mod:`sandfleet.cli.doctor`)."""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _kvm() -> dict[str, Any]:
    try:
        from sandfleet.sandbox.microvm import probe

        result: dict[str, Any] = probe.kvm_report()
        return result
    except (ImportError, AttributeError):
        present = Path("/dev/kvm").exists()
        return {"present": present, "usable": None,
                "reason": "/dev/kvm exists (not probed)" if present else "no /dev/kvm"}


def report(say: Callable[[str], None] = lambda what: None) -> dict[str, Any]:
    """Facts about the host and each backend's availability, as a dict; ``say`` is told what
    is probed next, as it starts (``sandfleet doctor`` prints it)."""
    from sandfleet.imagestore import arch
    from sandfleet.sandbox import cgroups
    from sandfleet.sandbox.bwrap import bwrap_version

    say("cgroups (the mounted hierarchies and their controllers)")
    lay = cgroups.detect()
    root = os.geteuid() == 0
    from sandfleet.sandbox.registry import NAMES, availability

    say("bubblewrap (bwrap --version)")
    bw = bwrap_version()
    say(f"backends ({', '.join(NAMES)}: each one's own check)")
    backends = availability()  # each backend's probe (sandbox/registry.py)
    say("kvm (/dev/kvm)")
    kvm = _kvm()
    qemu_name = "qemu-system-x86_64" if platform.machine() == "x86_64" else "qemu-system-aarch64"
    qemu = shutil.which(qemu_name)
    default = "bwrap" if backends["bwrap"]["available"] else "process"
    from sandfleet.sandbox.disk import available as disk_available
    from sandfleet.sandbox.network import availability as network_availability

    say("network (pasta, nftables)")
    try:
        net: dict[str, Any] = network_availability()
    except Exception as e:  # a bad $SANDFLEET_NET_UID, say
        net = {"available": False, "reason": str(e)}
    say("disk (loop devices, mkfs.ext4), the guest agent's toolchain, the state directory, binfmt, uid slots")
    return {
        "arch": arch(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "page_size": os.sysconf("SC_PAGE_SIZE"),
        "cpus": os.cpu_count(),
        "root": root,
        "cgroup": {"version": lay.version, "writable": lay.writable,
                   "controllers": {k: str(v) for k, v in lay.mounts.items()}},
        "bwrap": bw,
        "qemu": qemu,
        "kvm": kvm,
        "backends": backends,
        "network": net,
        "disk": {"kind": "ext4" if disk_available() else "tmpfs",
                 "reason": "a filesystem of its own on a loop device: writing past disk_mib is ENOSPC"
                 if disk_available() else "no loop devices or mkfs.ext4 (or SANDFLEET_DISK=tmpfs): the writable "
                 "layer is a tmpfs charged to the memory limit (filling it can OOM-kill a sandbox)"},
        "default_backend": default,
        "agent": _agent(),
        "state": _state(),
        "binfmt": _binfmt(),
        "uids": _uids(),
        "limits": _limits(),
    }


def _state() -> dict[str, Any]:
    """Where the sandboxes' markers live, and on what (a disk filesystem makes every start and
    close pay for journal writes: docs/bench.md)."""
    from sandfleet.errors import SandfleetError
    from sandfleet.sandbox.state import mount_of, state_root

    try:
        root = state_root()
    except SandfleetError as e:
        return {"dir": None, "fs": None, "reason": str(e)}
    found = mount_of(root)
    fs = found[0] if found else None
    return {"dir": str(root), "fs": fs,
            "reason": "in memory, gone at reboot" if fs == "tmpfs" else
            "on a disk filesystem: each start and close writes its marker there (SANDFLEET_STATE=a tmpfs directory)"}


def _agent() -> dict[str, Any]:
    """What the guest agent is built with (not built here: that takes a compiler run)."""
    from sandfleet.agent.build import toolchain
    from sandfleet.errors import SandfleetError

    try:
        name, cmd = toolchain()
    except SandfleetError as e:
        return {"toolchain": None, "reason": str(e)}
    why = {"musl": "static musl: an exec costs no cpuid probes (docs/bench.md)",
           "glibc": "static glibc; apt-get install musl-tools for a faster start in VMs (docs/bench.md)",
           "cc": "$CC"}[name]
    return {"toolchain": name, "command": cmd, "reason": why}


def _limits() -> dict[str, Any]:
    """Open files and host tasks: how many idle sandboxes they allow (docs/bench.md, "Density")."""
    from sandfleet.sandbox import hostlimits

    return hostlimits.report()


def _uids() -> dict[str, Any]:
    """The bwrap sandboxes' host uid slots (docs/security.md, "The uid model")."""
    import pwd

    from sandfleet.sandbox import uids
    from sandfleet.sandbox.spec import UID_STRIDE, BwrapConfig

    cfg = BwrapConfig()
    end = cfg.uid_base + cfg.slots * UID_STRIDE - 1
    clash = sorted(f"{p.pw_name} ({p.pw_uid})" for p in pwd.getpwall() if cfg.uid_base <= p.pw_uid <= end)
    try:
        live: int | None = len(uids.live_slots(cfg)) if os.geteuid() == 0 else None
    except OSError:
        live = None
    return {"uid_base": cfg.uid_base, "slots": cfg.slots, "per_slot": UID_STRIDE, "last_uid": end,
            "live": live, "clashing_users": clash, "per_sandbox_limits": dict(uids.NS_LIMITS)}


def _binfmt() -> list[dict[str, Any]]:
    """binfmt_misc registrations (system-wide; ``ours``: sandfleet made it, for --arch)."""
    from sandfleet.images.emulation import registrations

    return [{"name": r.name, "enabled": r.enabled, "interpreter": r.interpreter, "flags": r.flags, "ours": r.ours}
            for r in registrations()]
