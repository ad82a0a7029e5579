"""The HTTP API of ``sandfleet serve`` (FastAPI), composed: the routers of :mod:`.routes`,
the dialects of :mod:`.dialects` (E2B, SWE-ReX, SandboxFusion), task images, the error
handlers, and the pure ASGI layers of :mod:`.asgi` around them.

Every ``/v1`` route and ``/metrics`` need ``Authorization: Bearer <token>``; ``/healthz``
and ``/openapi.json`` do not. Errors are ``{"code", "message"}`` (:mod:`.wire`: the table of
:func:`~sandfleet.server.wire.problem_for`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sandfleet import __version__
from sandfleet.errors import SandfleetError
from sandfleet.server import taskimages
from sandfleet.server.asgi import Edge, FastExec
from sandfleet.server.auth import Tokens
from sandfleet.server.dialects import Shared, e2b, sandboxfusion, swerex
from sandfleet.server.dialects.e2b import metrics as e2b_metrics
from sandfleet.server.dialects.e2b.ports import PortProxy
from sandfleet.server.kernels import Kernels
from sandfleet.server.metrics import Metrics
from sandfleet.server.routes import commands, files, interpreter, meta, sandboxes, snapshots
from sandfleet.server.service import SandboxService
from sandfleet.server.wire import Problem, problem_for, problem_response

log = logging.getLogger(__name__)


def create_app(service: SandboxService, tokens: Tokens, metrics: Metrics, *,
               on_ready: Callable[[], None] | None = None) -> Any:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        sampler = asyncio.create_task(e2b_metrics.sample_loop(dialect))  # get_metrics' 5 s series
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            sampler.cancel()
            await service.close()

    app = FastAPI(title="sandfleet", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  redirect_slashes=False,
                  description="Sandboxes on a CPU host for agentic RL rollouts (docs/service.md)")
    app.state.tokens = tokens

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if isinstance(e, Problem):
            return problem_response(e)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid_request")
        return problem_response(Problem(e.status_code, code, str(e.detail),
                                         headers=dict(e.headers) if e.headers else None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        parts = []
        for err in e.errors()[:3]:
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            if err.get("type") == "json_invalid":
                parts.append(f"malformed JSON body ({err.get('ctx', {}).get('error', 'decode error')})")
            else:
                parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        return problem_response(Problem(400, "invalid_request", "; ".join(parts) or "invalid request"))

    @app.exception_handler(SandfleetError)
    async def _sandfleet(request: Request, e: SandfleetError) -> JSONResponse:
        p = problem_for(e)
        if p is None:
            raise e
        return problem_response(p)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(e).__name__, e, exc_info=e)
        return problem_response(Problem(500, "internal", f"{type(e).__name__}: {e}"))

    app.state.service = service
    app.state.metrics = metrics
    app.state.kernels = kernels = Kernels(service)  # a sandbox's stateful Python: /v1 run_code and E2B's
    for r in (meta.router, sandboxes.router, commands.router, files.router, snapshots.router, interpreter.router):
        app.include_router(r)

    taskimages.install(app, service, metrics)  # task images built here from uploaded folders

    # the dialects, each outside /openapi.json: the E2B SDK's routes, swerex-remote under
    # /swerex/<sandbox-id>/, SandboxFusion under /sandbox-fusion/<token>/
    shared = Shared(tokens, metrics, kernels)
    dialect = e2b.install(app, service, shared)
    swerex.install(app, service, shared)
    sandboxfusion.install(app, service, shared)
    return Edge(FastExec(PortProxy(app, dialect), service, tokens, metrics), service, metrics)
