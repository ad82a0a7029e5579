"""What the routes take from a request, declared once: the service and its metrics (from
``app.state``), the owner (from the bearer token), the admission deadline, label filters,
the idempotency key; and the error answers every ``/v1`` route documents."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request
from fastapi.security import HTTPBearer

from sandfleet.client import models
from sandfleet.server.auth import Tokens
from sandfleet.server.metrics import Metrics
from sandfleet.server.service import SandboxService
from sandfleet.server.wire import Problem

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": models.ErrorBody} for code in (400, 401, 404, 410, 413, 422, 429, 503)}
"""The error answers of a ``/v1`` route, for ``/openapi.json``."""

_bearer = HTTPBearer(auto_error=False, description="A token from the service's --token-file.")


async def _auth(request: Request, _: Annotated[Any, Depends(_bearer)]) -> str:
    """The owner id of the request's bearer token; 401 without a valid one."""
    tokens: Tokens = request.app.state.tokens
    oid = tokens.owner(request.headers.get("authorization"))
    if oid is None:
        what = "this token is not" if request.headers.get("authorization") else "no token was sent: it must be"
        raise Problem(401, "unauthorized", f"{what} a line of this service's --token-file "
                      "(an Authorization: Bearer <token> header)",
                      headers={"WWW-Authenticate": "Bearer"})
    return oid


Owner = Annotated[str, Depends(_auth)]
Deadline = Annotated[str | None, Header(alias="X-Deadline-Ms",
                                        description="How long to wait for admission, ms (default: --deadline).")]
Labels = Annotated[list[str] | None, Query(alias="label", description="key=value; repeatable; all must match.")]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


def _service(request: Request) -> SandboxService:
    service: SandboxService = request.app.state.service
    return service


def _metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


Service = Annotated[SandboxService, Depends(_service)]
"""The app's one :class:`SandboxService` (``app.state.service``)."""
AppMetrics = Annotated[Metrics, Depends(_metrics)]
