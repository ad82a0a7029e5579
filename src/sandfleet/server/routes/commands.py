"""Commands: exec (NDJSON, see :mod:`sandfleet.server.commands`), kill a user's processes,
and persistent shell sessions."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sandfleet.agent.client import ExecResult, OutputCallback
from sandfleet.client import models
from sandfleet.errors import ConfigError
from sandfleet.server.commands import answer, exec_runner
from sandfleet.server.deps import ERRORS, AppMetrics, Deadline, Owner, Service
from sandfleet.server.service import check_argv, check_env
from sandfleet.server.wire import NDJSON_TYPE

router = APIRouter()


@router.post("/v1/sandboxes/{sid}/exec", tags=["commands"], responses={
    **ERRORS, 200: {"content": {NDJSON_TYPE: {}}, "description": "NDJSON records, the last one exit or error"}})
async def exec_(service: Service, metrics: AppMetrics, sid: str, body: models.ExecRequest, request: Request,
                owner: Owner, deadline: Deadline = None) -> Response:
    """Run a command; the answer streams NDJSON (see ExecRequest)."""
    e = service.entry(owner, sid)
    return await answer(service, metrics, e, owner, deadline, body.stream, exec_runner(e, body), request)


@router.post("/v1/sandboxes/{sid}/kill", status_code=204, tags=["commands"], responses=ERRORS)
async def kill(service: Service, sid: str, body: models.KillRequest, owner: Owner) -> Response:
    """Kill every process of ``user`` in the sandbox; returns once they are gone. ``user`` ``*``:
    every process of every user but the guest agent's own (a root agent's stop in one request);
    a service older than it refuses ``*`` as a user name (400)."""
    sb = service.entry(owner, sid).sb
    if body.user == "*":
        if not await sb.kill_everyone():
            raise ConfigError("user '*' (every user): this sandbox can't stop every user in one request")
    else:
        await sb.kill_user(body.user)
    return Response(status_code=204)


@router.post("/v1/sandboxes/{sid}/sessions", status_code=201, tags=["sessions"], responses=ERRORS)
async def open_session(service: Service, sid: str, body: models.SessionRequest, owner: Owner) -> models.SessionInfo:
    """A persistent shell: cwd, exported and shell variables survive between its commands."""
    e = service.entry(owner, sid)
    check_env(body.env)
    return models.SessionInfo(id=service.open_session(e, cwd=body.cwd, env=body.env, user=body.user))


@router.post("/v1/sandboxes/{sid}/sessions/{session}/run", tags=["sessions"], responses={
    **ERRORS, 200: {"content": {NDJSON_TYPE: {}}, "description": "NDJSON records, as exec"}})
async def run_in_session(service: Service, metrics: AppMetrics, sid: str, session: str, body: models.SessionRun,
                         request: Request, owner: Owner, deadline: Deadline = None) -> Response:
    e = service.entry(owner, sid)
    s = service.session(e, session)
    check_argv(body.command)

    def run(on_output: OutputCallback | None) -> Coroutine[Any, Any, ExecResult]:
        return s.run(body.command, timeout=body.timeout, max_output=body.max_output, on_output=on_output)

    return await answer(service, metrics, e, owner, deadline, body.stream, run, request)


@router.delete("/v1/sandboxes/{sid}/sessions/{session}", status_code=204, tags=["sessions"], responses=ERRORS)
async def close_session(service: Service, sid: str, session: str, owner: Owner) -> Response:
    await service.close_session(service.entry(owner, sid), session)
    return Response(status_code=204)
