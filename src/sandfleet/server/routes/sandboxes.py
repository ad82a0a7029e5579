"""Sandboxes: create (idempotent with a key), list and delete by labels, look up, delete,
extend the TTL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sandfleet.client import models
from sandfleet.server.deps import ERRORS, Deadline, IdempotencyKey, Labels, Owner, Service
from sandfleet.server.service import parse_labels
from sandfleet.server.wire import Problem

router = APIRouter()


@router.post("/v1/sandboxes", status_code=201, tags=["sandboxes"], responses=ERRORS)
async def create(service: Service, spec: models.SandboxSpec, owner: Owner, deadline: Deadline = None,
                 key: IdempotencyKey = None) -> models.SandboxInfo:
    """Create a sandbox. ``limits.ttl_s`` is its lifetime (the service closes it then),
    ``limits.network`` its network. A retry with the same ``Idempotency-Key`` gets the
    same sandbox."""
    e = await service.create(owner, spec, key=key, deadline_ms=deadline)
    return e.info()


@router.post("/v1/sandboxes/{sid}/branch", status_code=201, tags=["sandboxes"], responses=ERRORS)
async def branch(service: Service, sid: str, body: models.BranchRequest, owner: Owner,
                 deadline: Deadline = None) -> models.BranchResult:
    """``n`` live sandboxes that continue from this one's state now (its files and sessions; on
    microvm its memory and processes too); this one keeps running. Running processes the backend
    can't carry: 409 ``branch_refused`` naming them, unless ``processes`` is "drop"."""
    kids, info = await service.branch(owner, sid, body.n, processes=body.processes, deadline_ms=deadline)
    return models.BranchResult(sandboxes=[k.info() for k in kids], carried=list(info.carried) if info else [],
                               dropped=list(info.dropped) if info else [])


@router.get("/v1/sandboxes", tags=["sandboxes"], responses=ERRORS)
async def list_(service: Service, owner: Owner, label: Labels = None) -> models.SandboxList:
    return models.SandboxList(sandboxes=[e.info() for e in service.find(owner, parse_labels(label or []))])


@router.delete("/v1/sandboxes", tags=["sandboxes"], responses=ERRORS)
async def delete_where(service: Service, owner: Owner, label: Labels = None,
                       all_: Annotated[bool, Query(alias="all")] = False) -> models.Deleted:
    """Delete every sandbox of this token whose labels match (``all=true``: every one)."""
    labels = parse_labels(label or [])
    if not labels and not all_:
        raise Problem(400, "invalid_request", "name labels to match (label=key=value), or pass all=true")
    return models.Deleted(deleted=await service.delete_where(owner, labels))


@router.get("/v1/sandboxes/{sid}", tags=["sandboxes"], responses=ERRORS)
async def get(service: Service, sid: str, owner: Owner) -> models.SandboxInfo:
    return service.entry(owner, sid).info()


@router.delete("/v1/sandboxes/{sid}", status_code=204, tags=["sandboxes"], responses=ERRORS)
async def delete(service: Service, sid: str, owner: Owner) -> Response:
    await service.delete(owner, sid)
    return Response(status_code=204)


@router.post("/v1/sandboxes/{sid}/ttl", tags=["sandboxes"], responses=ERRORS)
async def extend(service: Service, sid: str, body: models.TTLRequest, owner: Owner) -> models.SandboxInfo:
    """Set the sandbox's remaining lifetime to ``ttl_s`` from now."""
    return service.extend(owner, sid, body.ttl_s).info()
