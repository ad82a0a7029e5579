"""Snapshots: take one of a sandbox, list, fork ``n`` sandboxes from one, delete."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from sandfleet.client import models
from sandfleet.server.deps import ERRORS, Deadline, Owner, Service

router = APIRouter()


@router.post("/v1/sandboxes/{sid}/snapshot", status_code=201, tags=["snapshots"], responses=ERRORS)
async def snapshot(service: Service, sid: str, owner: Owner) -> models.SnapshotInfo:
    """Save the sandbox's filesystem (and memory where the backend can) to fork from."""
    snap_id, s = await service.snapshot(owner, sid)
    return models.SnapshotInfo(id=snap_id, backend=s.snap.backend, sandbox=s.sandbox)


@router.get("/v1/snapshots", tags=["snapshots"], responses=ERRORS)
async def list_snapshots(service: Service, owner: Owner) -> list[models.SnapshotInfo]:
    return [models.SnapshotInfo(id=k, backend=s.snap.backend, sandbox=s.sandbox)
            for k, s in service.snapshots.items() if s.owner == owner]


@router.post("/v1/snapshots/{snap}/fork", status_code=201, tags=["snapshots"], responses=ERRORS)
async def fork_(service: Service, snap: str, body: models.ForkRequest, owner: Owner,
                deadline: Deadline = None) -> models.SandboxList:
    """``n`` new sandboxes, each starting from the snapshot's state."""
    kids = await service.fork(owner, snap, body.n, ttl_s=body.ttl_s, labels=body.labels, deadline_ms=deadline)
    return models.SandboxList(sandboxes=[k.info() for k in kids])


@router.delete("/v1/snapshots/{snap}", status_code=204, tags=["snapshots"], responses=ERRORS)
async def delete_snapshot(service: Service, snap: str, owner: Owner) -> Response:
    service.delete_snapshot(owner, snap)
    return Response(status_code=204)

