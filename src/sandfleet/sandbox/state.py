"""Markers for live sandboxes, and the reaper that removes what a dead owner left behind.

Every sandbox has a directory ``<state>/<id>/`` holding ``meta.json``: its backend, the pid
and start time of its owner, its TTL, and what to clean (cgroups, processes, files). A
restarted sandfleet (or ``sandfleet sandbox rm --all``) finds markers whose owner is gone
or whose TTL has passed, and reaps them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import stat
import time
from pathlib import Path
from typing import Any

import sandfleet.sandbox.cgroups as cgroups
from sandfleet.errors import ConfigError
from sandfleet.reaping import proc_start_time, reap_pids
from sandfleet.settings import current as current_settings

log = logging.getLogger(__name__)


INCOMPLETE_GRACE_S = 120.0
"""A marker directory without meta.json is left alone this long (its sandbox may be starting)."""


@functools.cache
def state_root() -> Path:
    """$SANDFLEET_STATE, or as root /run/sandfleet (/dev/shm/sandfleet where /run is not a
    tmpfs: :func:`_root_default`), or $XDG_RUNTIME_DIR/sandfleet, or else
    ``sandfleet-<uid>/sandfleet`` in the temp directory ($TMPDIR or /tmp).

    Every directory sandfleet makes here is checked to be a real directory owned by this
    user (the reaper trusts the markers inside: the pids it kills, the cgroups it removes),
    and the user's own top directory is private (0700). One that someone else created is
    refused with a ConfigError naming it."""
    settings = current_settings()
    env = settings.state
    if env:
        root = Path(env)
        private_dir(root, 0o711 if os.geteuid() == 0 else 0o700, ours=False)
        return root
    if os.geteuid() == 0:
        root = _root_default()
    elif settings.runtime_dir:
        root = Path(settings.runtime_dir) / "sandfleet"
    else:
        import tempfile

        mine = Path(tempfile.gettempdir()) / f"sandfleet-{os.getuid()}"
        private_dir(mine, 0o700)
        root = mine / "sandfleet"
    private_dir(root, 0o711 if os.geteuid() == 0 else 0o700)
    return root


RUN_DIR = Path("/run/sandfleet")
SHM_DIR = Path("/dev/shm/sandfleet")


def _root_default() -> Path:
    """Root's state directory: /run/sandfleet where /run is a tmpfs (as on every systemd
    host), else /dev/shm/sandfleet where that is a tmpfs that allows exec: markers describe live processes
    and must not outlive a boot, and on a disk filesystem each sandbox's marker, log and
    their removal are journal writes (on the development VM, whose /run is the root's ext4
    with ``discard``: 1.0-2.5 ms of each create-and-close, against 0.5 on tmpfs). A
    /dev/shm/sandfleet that another user made first (/dev/shm is world-writable) is left
    alone: /run/sandfleet then, with a warning, never a refusal to start."""
    run, shm = mount_of(Path("/run")), mount_of(Path("/dev/shm"))
    if (run and run[0] == "tmpfs") or not shm or shm[0] != "tmpfs" or "noexec" in shm[1]:
        return RUN_DIR  # (noexec: the agent's copy for bwrap lives in the state directory)
    try:
        st = SHM_DIR.lstat()
    except FileNotFoundError:
        return SHM_DIR
    except OSError:
        return RUN_DIR
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return SHM_DIR
    log.warning("%s is not a private directory of uid %d (made by someone else?): sandbox markers go to %s",
                SHM_DIR, os.geteuid(), RUN_DIR)
    return RUN_DIR


def mount_of(path: Path) -> tuple[str, set[str]] | None:
    """(filesystem type, mount options) of the mount ``path`` is on (the longest mount point
    above it in /proc/self/mountinfo), or None where that can't be read."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        target = os.path.realpath(path)
    except OSError:
        return None
    best, found = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 6 or not rfields:
            continue
        mnt = fields[4].replace("\\040", " ")
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, found = mnt, (rfields[0], set(fields[5].split(",")))
    return found


def private_dir(path: Path, mode: int, *, ours: bool = True) -> None:
    """Make ``path`` (parents as needed) with ``mode``, or accept an existing one only if it
    is a directory, not a symlink, owned by this user, and writable by no one else. ``ours``:
    the path is sandfleet's own naming, so an existing one is set to ``mode`` too (never done
    to a directory the user named)."""
    created = False
    try:
        path.mkdir(parents=True, mode=mode)
        created = True
    except FileExistsError:
        pass
    try:
        st = path.lstat()
    except OSError as e:
        raise ConfigError(f"state directory {path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"state directory {path} is not a directory (a symlink or a file): refusing it")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"state directory {path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): "
                          "someone else created it; remove it or set SANDFLEET_STATE to a directory of yours")
    if created or ours:
        if stat.S_IMODE(st.st_mode) != mode:
            path.chmod(mode)
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"state directory {path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                          "use a directory only you can write")


@functools.cache
def self_identity() -> tuple[int, int | None]:
    return os.getpid(), proc_start_time(os.getpid())


@functools.cache
def pid_namespace() -> int | None:
    """This process's pid namespace (its inode): a pid in a marker means something only there."""
    try:
        return Path("/proc/self/ns/pid").stat().st_ino
    except OSError:
        return None


def write_meta(sandbox_dir: Path, meta: dict[str, Any]) -> None:
    pid, start = self_identity()
    data = {"owner_pid": pid, "owner_start": start, "owner_pidns": pid_namespace(), "created": time.time(), **meta}
    tmp = sandbox_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(sandbox_dir / "meta.json")


NEW_PREFIX = ".new-"
"""A sandbox directory being made: ``.new-<pidns>-<pid>-<start>-<id>``, renamed to ``<id>`` once its
marker is in it. The name itself says whose it is, so a creator killed before the rename leaves
nothing the reaper can't judge."""


def new_sandbox_dir(sid: str, meta: dict[str, Any], mode: int = 0o777) -> Path:
    """Make ``<state>/<sid>/`` with its marker (``meta``, see :func:`write_meta`) already in it: the
    directory appears under its name only together with the marker that names its owner. (Made
    by mkdir then marked, a creator killed in between left a directory no one could tell was
    dead, kept for the incomplete-marker grace period: seen as a leftover after a SIGKILL.)"""
    root = state_root()
    pid, start = self_identity()
    tmp = root / f"{NEW_PREFIX}{pid_namespace()}-{pid}-{start}-{sid}"
    tmp.mkdir(mode=mode)
    try:
        write_meta(tmp, meta)
        final = root / sid
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


GONE_PREFIX = ".gone-"
"""A sandbox directory being removed: renamed ``.gone-<id>-<pid>-<ns>`` first, then deleted."""


def remove_sandbox_dir(d: Path) -> None:
    """Remove a sandbox's directory: renamed out of the markers' names first (one atomic step),
    then deleted. Deleted in place, a remover killed half-way (``meta.json`` gone, ``agent.log``
    not yet) left a directory without a marker, which the reaper keeps for the incomplete-marker
    grace period as one that may be starting (seen: a leftover of a run SIGKILLed as it closed
    a sandbox). A ``.gone-`` directory is anyone's to delete (:func:`_reap_unfinished`)."""
    gone = d.with_name(f"{GONE_PREFIX}{d.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        d.rename(gone)
    except FileNotFoundError:
        return
    except OSError:  # (a mount point, a read-only root: deleted where it is, as before)
        gone = d
    shutil.rmtree(gone, ignore_errors=True)


def _reap_unfinished() -> list[str]:
    """Remove directories a creator left before marking them (see :func:`new_sandbox_dir`) once
    that creator is gone, and those a remover left half-deleted (:func:`remove_sandbox_dir`)."""
    reaped = []
    root = state_root()
    for d in sorted(root.glob(GONE_PREFIX + "*")) if root.exists() else []:
        shutil.rmtree(d, ignore_errors=True)  # (a remover still at it: both deleting is harmless)
        reaped.append(d.name)
    for d in sorted(root.glob(NEW_PREFIX + "*")) if root.exists() else []:
        parts = d.name[len(NEW_PREFIX):].split("-", 3)
        try:
            ns, pid, start = (None if p == "None" else int(p) for p in parts[:3])
        except ValueError:
            continue  # not ours
        if owner_alive({"owner_pidns": ns, "owner_pid": pid, "owner_start": start}):
            continue
        shutil.rmtree(d, ignore_errors=True)
        reaped.append(d.name)
    return reaped


def read_meta(sandbox_dir: Path) -> dict[str, Any] | None:
    return read_meta_file(sandbox_dir / "meta.json")


def owner_alive(meta: dict[str, Any]) -> bool:
    """The marker's owner is alive (or can't be told from here: its pid is of another pid
    namespace, e.g. a service that is PID 1 of a container sharing the state directory)."""
    ns = meta.get("owner_pidns")
    if isinstance(ns, int) and ns != pid_namespace():
        return True  # not ours to judge: that namespace's processes reap it
    pid = meta.get("owner_pid")
    if not isinstance(pid, int):
        return False
    return proc_start_time(pid) == meta.get("owner_start")


def expired(meta: dict[str, Any]) -> bool:
    ttl = meta.get("ttl_s")
    return ttl is not None and time.time() > float(meta.get("created", 0)) + float(ttl)


def list_sandboxes() -> list[dict[str, Any]]:
    """Every sandbox marker on this host, with ``alive`` and ``expired`` flags."""
    out = []
    root = state_root()
    for d in sorted(root.glob("sf-*")) if root.exists() else []:
        meta = read_meta(d)
        young = False
        if meta is None:  # being created right now, or its creator died before writing it
            try:
                young = time.time() - d.stat().st_mtime < INCOMPLETE_GRACE_S
            except OSError:
                continue
            meta = {"id": d.name, "backend": "?"}
        meta["dir"] = str(d)
        meta["alive"] = young or owner_alive(meta)
        meta["expired"] = expired(meta)
        out.append(meta)
    return out


def reap_one(meta: dict[str, Any]) -> None:
    """Kill and remove everything a sandbox marker names."""
    sid = str(meta["id"])
    if not sid.startswith("sf-") or "/" in sid:
        log.warning("not reaping a marker with a malformed id %r", sid)
        return
    killed: dict[int, int | None] = {}
    for pid in meta.get("pids", []):
        if not isinstance(pid, int):
            continue
        if proc_start_time(pid) is not None and proc_start_time(pid) == meta.get("pid_starts", {}).get(str(pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed[pid] = meta["pid_starts"][str(pid)]
    if killed:  # where this process is a subreaper, what it killed may be its child to reap

        reap_pids(killed, timeout=0.5)
    if meta.get("cgroup"):
        for parent in cgroups.parents():  # wherever it is: throttled parents too
            cgroups.Cgroup(sid, parent=parent).remove()
    remove_sandbox_dir(Path(meta.get("dir") or state_root() / sid))


SNAPSHOTS = "snapshots"
SNAPSHOT_MARKER = "owner.json"


def new_snapshot_dir() -> Path:
    """A fresh directory for a snapshot under ``<state>/snapshots``, marked with its owner
    (like a sandbox's meta.json) so that the reaper removes it once the owner is gone."""
    from sandfleet.sandbox.base import new_id

    d = state_root() / SNAPSHOTS / new_id("snap")
    d.mkdir(parents=True)
    pid, start = self_identity()
    (d / SNAPSHOT_MARKER).write_text(json.dumps({"owner_pid": pid, "owner_start": start,
                                                 "owner_pidns": pid_namespace(), "created": time.time()}))
    return d


def reap_snapshots() -> list[str]:
    """Remove snapshots whose owner is gone (or, unmarked, older than the grace period)."""
    reaped = []
    root = state_root() / SNAPSHOTS
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        meta = read_meta_file(d / SNAPSHOT_MARKER)
        if meta is not None:
            if owner_alive(meta):
                continue
        else:
            try:
                if time.time() - d.stat().st_mtime < INCOMPLETE_GRACE_S:
                    continue
            except OSError:
                continue
        log.info("reaping snapshot %s of a dead owner", d.name)
        shutil.rmtree(d, ignore_errors=True)
        reaped.append(d.name)
    return reaped


def read_meta_file(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _abandoned(cg: cgroups.Cgroup) -> bool:
    """Whether a sandbox cgroup that no marker here names is a leftover: only when it holds
    no process and was made longer ago than the grace period. A sandbox's processes die with
    its owner, so a group with processes in it is a live sandbox of another state root under
    the same parent (another SANDFLEET_STATE), or one that is being made; sweeping it killed
    a live sandbox of a concurrent process (seen: 'the guest agent closed its stream')."""
    if cg.pids():
        return False
    made = []
    for d in cg.dirs:  # (one per hierarchy on v1, made one after another: some may not exist yet)
        try:
            made.append(d.stat().st_mtime)
        except OSError:
            continue
    if not made:
        return True  # gone already (or no hierarchy): remove() does nothing harmful
    # the youngest: a group being made right now has its first directories and not yet the
    # rest; taken as gone, it was removed under its maker (seen: FileNotFoundError joining it)
    return time.time() - max(made) >= INCOMPLETE_GRACE_S


def reap_leftovers(*, include_live: bool = False) -> list[str]:
    """Reap sandboxes whose owner died or whose TTL passed, and snapshots whose owner died;
    return their ids."""
    reaped = []
    for meta in list_sandboxes():
        if include_live or not meta["alive"] or meta["expired"]:
            log.info("reaping sandbox %s (owner alive=%s, expired=%s)", meta["id"], meta["alive"], meta["expired"])
            reap_one(meta)
            reaped.append(str(meta["id"]))
    known = {m["id"] for m in list_sandboxes()}
    mine = cgroups.group()
    for name, parent in sorted(cgroups.leftover_groups()):
        # A cgroup whose marker is gone, under this process's own parent (or a throttled
        # one): under another parent it may belong to a live owner of another state root
        # (e.g. the simulated nodes of a local Ray cluster, each with its own parent).
        if name not in known and (parent == mine or parent.startswith("sandfleet-slowhost-")):
            cg = cgroups.Cgroup(name, parent=parent)
            if not _abandoned(cg):
                continue
            cg.remove()
            reaped.append(name)
    reaped += reap_snapshots()
    reaped += _reap_unfinished()
    return reaped
