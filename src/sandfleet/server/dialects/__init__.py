"""The dialects ``sandfleet serve`` speaks beside its own ``/v1``: E2B (:mod:`.e2b`), SWE-ReX
(:mod:`.swerex`) and SandboxFusion (:mod:`.sandboxfusion`), so that their unmodified clients
drive sandfleet sandboxes.

Each is a package installed the same way, ``install(app, service, shared)`` (from
``server/app.py``), with its routes outside ``/openapi.json`` (only ``/v1`` is the service's
own contract), request models at its edge, and one error mapper that turns what goes wrong
into that dialect's wire errors. A dialect imports the service and the server's shared
modules (auth, wire, service); nothing below it imports a dialect, and no dialect imports
another. Adding one: docs/architecture.md, "Where to add a dialect".
"""

from __future__ import annotations

from dataclasses import dataclass

from sandfleet.server.auth import Tokens
from sandfleet.server.kernels import Kernels
from sandfleet.server.metrics import Metrics


@dataclass(frozen=True)
class Shared:
    """What the app lends every dialect besides the service."""

    tokens: Tokens
    metrics: Metrics
    kernels: Kernels
