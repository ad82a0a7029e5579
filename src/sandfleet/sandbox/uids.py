"""Host uid slots: every live bwrap sandbox has host uids of its own (docs/security.md, "The uid model").

The kernel counts many per-user resources by *host* uid: inotify instances and watches,
fanotify groups, namespaces of each kind (all charged to the host uid that owns the
sandbox's outermost user namespace P), POSIX message queue bytes, pending signals, and the
key quota (charged to the key owner's host uid). Sandboxes that shared host uids shared
those limits, and could reach each other's keys.

So the range ``uid_base ..`` is cut into slots of :data:`UID_STRIDE` host uids, one slot
per live sandbox:

====================  ============================================================
``base + 0..65535``   the sandbox's uids (S-uid ``i`` = P-uid ``i`` = host ``base + i``)
``base + 65536``      the guest agent (unmapped in S)
``base + 65537``      the slot's owner: owns P (the kernel charges P's counts to it) and
                      runs the slot's network helper; mapped nowhere inside
====================  ============================================================

where ``base = uid_base + slot * UID_STRIDE``. Slot 0 is the *canonical* range in which
sandfleet stores every layer it writes (task images, snapshots, disk seeds). Another
slot sees those layers, and writes its own writable layer, through idmapped mounts that
shift the canonical range onto its own (``--shift-ns``/``--shift`` in the launcher), so
what lands on disk is always canonical.

A slot is taken with an exclusive ``flock`` on ``<dir>/<slot>`` (held by an open file for
the sandbox's life; the kernel drops it if the owner dies), so every process of this host
that makes sandboxes with the same ``uid_base`` shares one allocator, whatever its state
root. Slot 0 is taken whenever it is free (the canonical slot needs no idmapped mounts);
otherwise the search starts where this process last found a free slot (or below, at the
lowest slot it released since), not at 1: with thousands of slots held by other processes
(the idle hold of ``bench micro --idle``), a scan from 1 cost one ``open`` and ``flock`` per
held slot on every start; now a process pays that scan once.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.errors import SandboxError
from sandfleet.sandbox.spec import GUEST_AGENT_UID, SANDBOX_UIDS, UID_STRIDE, BwrapConfig
from sandfleet.settings import current as current_settings

__all__ = ["NS_LIMITS", "OWNER_OFFSET", "Slot", "slot_dir", "take_slot"]

OWNER_OFFSET = SANDBOX_UIDS + 1
"""The slot's owner uid is ``base + 65537``: unmapped in P and S, no sandbox process has it."""

NS_LIMITS: dict[str, int] = {
    "inotify_instances": 128,
    "inotify_watches": 65536,
    "fanotify_groups": 32,
    "fanotify_marks": 65536,
    "user_namespaces": 64,
    "mnt_namespaces": 256,
    "pid_namespaces": 64,
    "ipc_namespaces": 64,
    "net_namespaces": 64,
    "uts_namespaces": 64,
    "cgroup_namespaces": 64,
    "time_namespaces": 64,
}
"""What one sandbox's commands may hold in all, set as P's ``/proc/sys/user/max_*`` by the
launcher (``--userns-max``): every count made in S and below is charged to one (P, uid)
pair and held to these. On top, the host's own per-uid limits (``/proc/sys/user/max_*`` of
the initial namespace, ``fs.inotify.max_user_instances``, ...) apply to the slot's owner."""


@dataclass
class Slot:
    """One slot's host uids, held until :meth:`release`."""

    index: int
    base: int
    """Host uid of the sandbox's root (uid 0 inside)."""
    canonical: int
    """``uid_base``: where stored layers' uids are (slot 0's base)."""
    _fd: int = field(default=-1, repr=False)

    @property
    def owner(self) -> int:
        """The unprivileged host uid that owns the sandbox's user namespace P."""
        return self.base + OWNER_OFFSET

    @property
    def guest(self) -> int:
        """The guest agent's host uid."""
        return self.base + GUEST_AGENT_UID

    def host_uid(self, uid: int) -> int:
        """The host uid that sandbox uid ``uid`` is while this slot is live."""
        return self.base + uid

    @property
    def shifted(self) -> bool:
        """Whether stored (canonical) layers must be shifted onto this slot's range."""
        return self.base != self.canonical

    def release(self) -> None:
        """Free the slot (idempotent): call once nothing of the sandbox runs any more."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            with _held_lock:
                _held.discard((self.canonical, self.index))
                if self.index and self.index < _hint.get(self.canonical, 1):
                    _hint[self.canonical] = self.index
            # unlock first: a forked child (or parent) sharing the open file would keep it locked
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


_held_lock = threading.Lock()
_held: set[tuple[int, int]] = set()  # (uid_base, slot) this process holds: skipped without a syscall
_hint: dict[int, int] = {}  # uid_base -> the slot (>= 1) this process's next search starts at


def slot_dir(config: BwrapConfig) -> Path:
    """The lock files of ``config.uid_base``'s slots: host-wide (the kernel's uids are), in
    $SANDFLEET_UID_SLOTS or /run/sandfleet-uid-slots/<uid_base>."""
    root = Path(current_settings().uid_slots or "/run/sandfleet-uid-slots")
    d = root / str(config.uid_base)
    if not d.is_dir():
        d.mkdir(parents=True, mode=0o700, exist_ok=True)
    return d


def take_slot(config: BwrapConfig) -> Slot:
    """A free slot of ``config``'s range, locked for the caller: slot 0 if free, else the
    first free one from this process's hint on, wrapping round; SandboxError when all
    ``config.slots`` are live."""
    d = slot_dir(config)
    with _held_lock:
        start = min(max(_hint.get(config.uid_base, 1), 1), config.slots)
    for i in itertools.chain((0,), range(start, config.slots), range(1, start)):
        key = (config.uid_base, i)
        with _held_lock:
            if key in _held:
                continue
            _held.add(key)  # reserved against this process's other threads while we try
        fd = -1
        try:
            fd = os.open(d / str(i), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            if fd >= 0:
                os.close(fd)
            with _held_lock:
                _held.discard(key)
            continue
        if i:
            with _held_lock:
                _hint[config.uid_base] = i + 1 if i + 1 < config.slots else 1
        return Slot(index=i, base=config.uid_base + i * UID_STRIDE, canonical=config.uid_base, _fd=fd)
    raise SandboxError(f"all {config.slots} host uid slots of uid_base {config.uid_base} are in use "
                       f"(one per live sandbox: raise BwrapConfig.slots, or close sandboxes)")


def holds_owner(uid: int) -> bool:
    """Whether ``uid`` is the owner of a slot this process holds now (a network helper may run
    as it: sandbox/network.py keys a sandbox's firewall rules by its helper's uid)."""
    with _held_lock:
        return any(uid == base + i * UID_STRIDE + OWNER_OFFSET for base, i in _held)


def live_slots(config: BwrapConfig) -> list[int]:
    """Slots held now by any process (for doctor and tests)."""
    d = slot_dir(config)
    out = []
    for i in range(config.slots):
        p = d / str(i)
        if not p.exists():
            continue
        with _held_lock:
            if (config.uid_base, i) in _held:
                out.append(i)
                continue
        with contextlib.suppress(OSError):
            fd = os.open(p, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                out.append(i)
            finally:
                os.close(fd)
    return out
