"""A sandbox's stateful Python: ``POST /v1/sandboxes/{sid}/run_code`` runs one cell in its
kernel (:mod:`sandfleet.server.kernels`, shared with the E2B code interpreter)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from sandfleet.client import models
from sandfleet.server.deps import ERRORS, Deadline, Owner, Service
from sandfleet.server.kernels import Kernels
from sandfleet.server.service import check_env

router = APIRouter()


@router.post("/v1/sandboxes/{sid}/run_code", tags=["interpreter"], responses=ERRORS)
async def run_code(service: Service, sid: str, body: models.RunCodeRequest, request: Request, owner: Owner,
                   deadline: Deadline = None) -> models.CodeExecution:
    """Run a cell in the sandbox's Python, started on its first cell (one busy slot for that
    start): globals persist per ``context``; the value of the last expression is the result
    with ``is_main_result``; a cell past ``timeout`` is interrupted (KeyboardInterrupt) and
    the state stays. ``language`` ``bash``: the context is a long-lived bash (``default-bash``
    for the default context); a cell of the other language than its context's is 400. A kernel
    that cannot start (no python3) is 422 guest_error."""
    e = service.entry(owner, sid)
    check_env(body.env)
    kernels: Kernels = request.app.state.kernels
    context = kernels.context(e, body.context, body.language)
    k = kernels.get(e)
    if not k.alive:
        release = await service.admit_start(owner, deadline, e)
        try:
            await k.start()
        finally:
            release()
    return await k.run(body.code, context=context, cwd=body.cwd, env=body.env, timeout=body.timeout,
                       language=body.language)
