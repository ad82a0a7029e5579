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
import time
from pathlib import Path
from typing import Any

from sandfleet.sandbox import cgroups

log = logging.getLogger(__name__)


INCOMPLETE_GRACE_S = 120.0
"""A marker directory without meta.json is left alone this long (its sandbox may be starting)."""


@functools.cache
def state_root() -> Path:
    """$SANDFLEET_STATE, or /run/sandfleet as root, or $XDG_RUNTIME_DIR/sandfleet."""
    env = os.environ.get("SANDFLEET_STATE")
    if env:
        root = Path(env)
    elif os.geteuid() == 0:
        root = Path("/run/sandfleet")
    else:
        root = Path(os.environ.get("XDG_RUNTIME_DIR", f"/tmp/sandfleet-{os.getuid()}")) / "sandfleet"
    root.mkdir(parents=True, exist_ok=True, mode=0o711)
    return root


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of a process (to tell a live owner from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@functools.cache
def self_identity() -> tuple[int, int | None]:
    return os.getpid(), proc_start_time(os.getpid())


def write_meta(sandbox_dir: Path, meta: dict[str, Any]) -> None:
    pid, start = self_identity()
    data = {"owner_pid": pid, "owner_start": start, "created": time.time(), **meta}
    tmp = sandbox_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.replace(sandbox_dir / "meta.json")


def read_meta(sandbox_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((sandbox_dir / "meta.json").read_text())
        return data
    except (OSError, ValueError):
        return None


def owner_alive(meta: dict[str, Any]) -> bool:
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
    for pid in meta.get("pids", []):
        if proc_start_time(pid) is not None and proc_start_time(pid) == meta.get("pid_starts", {}).get(str(pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    if meta.get("cgroup"):
        cgroups.Cgroup(sid).remove()
    d = Path(meta.get("dir") or state_root() / sid)
    shutil.rmtree(d, ignore_errors=True)


def reap_leftovers(*, include_live: bool = False) -> list[str]:
    """Reap sandboxes whose owner died or whose TTL passed; return their ids."""
    reaped = []
    for meta in list_sandboxes():
        if include_live or not meta["alive"] or meta["expired"]:
            log.info("reaping sandbox %s (owner alive=%s, expired=%s)", meta["id"], meta["alive"], meta["expired"])
            reap_one(meta)
            reaped.append(str(meta["id"]))
    known = {m["id"] for m in list_sandboxes()}
    for name in cgroups.leftover_names():
        if name not in known:  # a cgroup whose marker is gone
            cgroups.Cgroup(name).remove()
            reaped.append(name)
    return reaped
