"""SandboxFusion's HTTP API (what verl and the ``sandbox-fusion`` client call), under
``/sandbox-fusion/<token>/``.

Modules: :mod:`.api` (``run_code``, the routes, the one error mapper), :mod:`.jupyter`
(``run_jupyter``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandfleet.server.dialects.sandboxfusion import jupyter
from sandfleet.server.dialects.sandboxfusion.api import install_routes

if TYPE_CHECKING:
    from fastapi import FastAPI

    from sandfleet.server.dialects import Shared
    from sandfleet.server.service import SandboxService


def install(app: FastAPI, service: SandboxService, shared: Shared) -> None:
    """``run_code`` and ``run_jupyter`` on ``app``, in sandboxes of the service's ``--fusion-image``."""
    install_routes(app, service, shared.tokens, shared.metrics, service.config.fusion_image,
                   endpoints={"run_jupyter": jupyter.run_jupyter})
