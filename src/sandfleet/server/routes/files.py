"""Files: one file's bytes read or written, and directories in and out as tar streams."""

from __future__ import annotations

import posixpath
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from sandfleet.sandbox.base import AgentSandbox, sandbox_path
from sandfleet.server.deps import ERRORS, Deadline, Owner, Service
from sandfleet.server.service import Entry
from sandfleet.server.wire import BINARY_BODY, TAR_BODY, Problem, check_tar

router = APIRouter()


@router.get("/v1/sandboxes/{sid}/files", tags=["files"], responses={
    **ERRORS, 200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes"}})
async def read_file(service: Service, sid: str, path: str, owner: Owner, user: str | None = None,
                    max_bytes: Annotated[int | None, Query(ge=0, le=256 << 20)] = None,
                    nofollow: bool = False) -> Response:
    """A regular file's bytes, read as ``user``."""
    e = service.entry(owner, sid)
    data = await e.sb.read_file(path, user=user, max_bytes=max_bytes, nofollow=nofollow)
    return Response(data, media_type="application/octet-stream")


@router.put("/v1/sandboxes/{sid}/files", status_code=204, tags=["files"], responses=ERRORS,
             openapi_extra=BINARY_BODY)
async def write_file(service: Service, sid: str, path: str, request: Request, owner: Owner, user: str | None = None,
                     mode: Annotated[int, Query(ge=0, le=0o7777)] = 0o644) -> Response:
    """Write the body to a regular file, as ``user`` (who owns it if it is new)."""
    e = service.entry(owner, sid)
    data = await request.body()
    await e.sb.write_file(path, data, mode=mode, user=user)
    return Response(status_code=204)


@router.put("/v1/sandboxes/{sid}/archive", status_code=204, tags=["files"], responses=ERRORS,
             openapi_extra=TAR_BODY)
async def upload(service: Service, sid: str, path: str, request: Request, owner: Owner, user: str | None = None,
                 deadline: Deadline = None) -> Response:
    """Unpack a tar stream (uncompressed) into directory ``path`` (created if missing), as
    ``user``. Members that are absolute, climb out with ``..``, link outside, or are
    devices are refused before anything is written."""
    e = service.entry(owner, sid)
    data = await request.body()
    dest = sandbox_dir(e, path)
    check_tar(data)
    async with service.busy(owner, deadline, e):
        res = await e.sb.exec(["sh", "-c", 'mkdir -p "$1" && tar -x --no-same-owner -C "$1"', "sh", dest],
                              stdin=data, cwd="/", user=user)
    if res.exit_code != 0:
        raise Problem(400, "bad_path", f"upload to {dest} failed: {res.stderr.strip()}")
    return Response(status_code=204)


@router.get("/v1/sandboxes/{sid}/archive", tags=["files"], responses={
    **ERRORS, 200: {"content": {"application/x-tar": {}}, "description": "a tar stream of path"}})
async def download(service: Service, sid: str, path: str, owner: Owner,
                   max_bytes: Annotated[int, Query(ge=0, le=1 << 30)] = 256 << 20,
                   deadline: Deadline = None) -> Response:
    """A tar stream of file or directory ``path``; 413 when it would be over ``max_bytes``."""
    e = service.entry(owner, sid)
    src = sandbox_dir(e, path)
    parent, name = posixpath.split(src.rstrip("/") or "/")
    async with service.busy(owner, deadline, e):
        res = await e.sb.exec(["tar", "-c", "-C", parent or "/", name or "."], max_output=max_bytes + 1, cwd="/")
    if res.exit_code != 0:
        raise Problem(400, "bad_path", f"download of {src} failed: {res.stderr.strip()}")
    if res.truncated or len(res.stdout_bytes) > max_bytes:
        raise Problem(413, "too_large", f"download of {src} refused: its archive is larger than {max_bytes} bytes")
    return Response(res.stdout_bytes, media_type="application/x-tar")


def sandbox_dir(e: Entry, path: str) -> str:
    sb = e.sb
    return sb._path(path) if isinstance(sb, AgentSandbox) else sandbox_path(path, sb.spec.workdir)
