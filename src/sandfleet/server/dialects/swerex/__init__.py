"""SWE-ReX's ``swerex-remote`` API, per sandbox, under ``/swerex/<sandbox-id>/``.

Modules: :mod:`.api` (the routes, and the one error mapper), :mod:`.models` (the request
bodies), :mod:`.pty` (interactive commands and ``expect`` on a pty).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandfleet.server.dialects.swerex.api import SweRex, install_routes

if TYPE_CHECKING:
    from fastapi import FastAPI

    from sandfleet.server.dialects import Shared
    from sandfleet.server.service import SandboxService


def install(app: FastAPI, service: SandboxService, shared: Shared) -> SweRex:
    """The swerex-remote routes on ``app``."""
    return install_routes(app, service, shared.tokens)
