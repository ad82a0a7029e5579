"""The service's own routes: health, metrics, what it offers."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from sandfleet import __version__
from sandfleet.client import models
from sandfleet.server.deps import ERRORS, AppMetrics, Owner, Service

router = APIRouter()


@router.get("/healthz", tags=["service"])
async def healthz(service: Service) -> models.Health:
    return models.Health(ok=not service.draining, draining=service.draining)


@router.get("/metrics", include_in_schema=False)
async def metrics_route(metrics: AppMetrics, owner: Owner) -> Response:
    return Response(metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/info", tags=["service"], responses=ERRORS)
async def info(service: Service, owner: Owner) -> models.ServiceInfo:
    return models.ServiceInfo(
        version=__version__, backend=service.backend, max_sandboxes=service.limits.max_sandboxes,
        max_busy=service.limits.max_busy, quota=service.quota, max_ttl_s=service.config.max_ttl_s,
        max_body_bytes=service.config.max_body_bytes, limits_basis=service.limits.basis,
        sandboxes=len(service.live), busy=service.busy_gate.in_use, draining=service.draining)
