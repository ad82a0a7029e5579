"""E2B's pause and resume on sandfleet snapshots.

``pause(mode="filesystem")`` (Boxes: "the in-memory state is dropped and only the filesystem
is persisted; resuming cold-boots it") is a sandfleet snapshot of the sandbox, which is then
closed; the id stays, listed with state "paused". ``Sandbox.connect(id)`` (and the older
``/resume``) starts a sandbox from the snapshot and answers under the same id: the E2B id
then names a new sandfleet sandbox (``E2B.alias``), with the paused one's files and no
processes. ``pause()`` with memory (E2B's default, ``mode="full"``) is refused: a resume here is a
fork of the snapshot, which keeps no processes on bwrap (a microVM's memory snapshot could
serve it; not done).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from sandfleet.server.dialects.e2b.state import ENVD_VERSION, Boxes, Paused
from sandfleet.server.dialects.e2b.wire import CPError, cp_error, rfc3339, unsupported

if TYPE_CHECKING:
    from sandfleet.server.service import Entry


async def pause(e2b: Boxes, owner: str, sid: str, body: dict[str, Any]) -> None:
    if sid in e2b.paused:
        raise CPError(409, f"sandbox {sid} is paused already")
    e = e2b.entry(owner, sid)
    if body.get("memory") is not False:
        raise unsupported("pause with memory (mode=\"full\", the default)",
                          "a paused sandbox's processes are not kept; "
                          "pause(mode=\"filesystem\") keeps its files and resumes it cold")
    try:
        snap_id, _ = await e2b.service.snapshot(owner, e.sb.id)
    except NotImplementedError as err:
        raise unsupported("pause", f"{err} (this service's backend has no snapshots)") from None
    except Exception as err:
        raise cp_error(err) from None
    e2b.pause_snaps.add(snap_id)
    b = e2b.box(e)
    lim = e.spec.limits
    e2b.paused[sid] = Paused(owner=owner, snap=snap_id, template=b.template, metadata=dict(b.metadata),
                             started=e.created, timeout=float(lim.ttl_s or 300), cpus=lim.cpus,
                             memory_mib=lim.memory_mib, disk_mib=lim.disk_mib)
    e2b.forget(e.sb.id)
    try:
        await e2b.service.delete(owner, e.sb.id)
    except Exception as err:  # it stays paused (its snapshot is taken); the sandbox was going anyway
        raise cp_error(err) from None


async def resume(e2b: Boxes, owner: str, sid: str, p: Paused) -> Entry:
    try:
        kids = await e2b.service.fork(owner, p.snap, 1, ttl_s=p.timeout, labels=p.metadata, deadline_ms=None)
    except Exception as err:
        raise cp_error(err) from None
    e = kids[0]
    del e2b.paused[sid]  # its snapshot stays (hidden): the resumed root, and its snapshots, stack on it
    e2b.alias[sid] = e.sb.id
    e2b.public[e.sb.id] = sid
    return e2b.adopt(e, p.template, p.metadata)


def drop(e2b: Boxes, sid: str) -> None:
    """Kill a paused sandbox: its snapshot goes."""
    p = e2b.paused.pop(sid)
    e2b.pause_snaps.discard(p.snap)
    try:
        e2b.service.delete_snapshot(p.owner, p.snap)
    except Exception:
        pass  # gone already (the service stopped its snapshots)


def listed(e2b: Boxes, sid: str, p: Paused) -> dict[str, Any]:
    return {"templateID": p.template, "alias": p.template, "sandboxID": sid, "clientID": "sandfleet",
            "startedAt": rfc3339(p.started), "endAt": rfc3339(time.time() + p.timeout),
            "cpuCount": max(1, round(p.cpus or (os.cpu_count() or 1))), "memoryMB": p.memory_mib or 0,
            "diskSizeMB": p.disk_mib, "state": "paused", "envdVersion": ENVD_VERSION, "metadata": p.metadata}
