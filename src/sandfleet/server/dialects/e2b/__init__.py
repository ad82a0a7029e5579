"""The E2B wire protocol on ``sandfleet serve``: the unmodified ``e2b`` SDK drives sandfleet
sandboxes through ``E2B_API_URL`` / ``E2B_SANDBOX_URL`` / ``E2B_API_KEY`` pointed at the service.

Two route families, kept out of ``/openapi.json`` (only ``/v1`` is the service's contract):

- the control plane, ``/sandboxes...`` and ``/v2/sandboxes...``: ``X-API-Key`` is a service
  token; errors are ``{"code": <int>, "message"}`` with the status the SDK maps;
- envd, ``/process.Process/*``, ``/filesystem.Filesystem/*``, ``/files``, ``/health``, with the
  sandbox named by ``E2b-Sandbox-Id`` and authorised by the ``X-Access-Token`` that create (or
  connect) returned. Connect protocol v1 with the JSON codec; a process outlives its stream
  (envd semantics: its output is buffered, a client that hangs up does not kill it). An unknown
  or dead sandbox answers 502 "... was not found", which the SDK maps to SandboxNotRunning.

Template ``base`` (or none) is the service's default image with ``/home/user`` as the working
directory and home; the E2B user ``user`` is the sandbox's default user. Any other template is
a sandfleet image name.

Modules: :mod:`.state` (what every other module takes: the sandboxes' E2B side, who may
call), :mod:`.dialect` (create/connect/kill/list, and the routes, composing process.Process
and filesystem.Filesystem as components), :mod:`.control` (templates, snapshots, timeouts),
:mod:`.process` (process.Process), :mod:`.files` and :mod:`.fs` (``/files``,
filesystem.Filesystem, watchers), :mod:`.wire` (Connect framing, the one error mapper,
:func:`~.wire.error_response`), :mod:`.pause`, :mod:`.metrics`, :mod:`.network` (egress
lists), :mod:`.image` (template ``base``), :mod:`.ports` (the port proxy), :mod:`.interpreter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandfleet.server.dialects.e2b.dialect import E2B, install_routes

if TYPE_CHECKING:
    from fastapi import FastAPI

    from sandfleet.server.dialects import Shared
    from sandfleet.server.service import SandboxService


def install(app: FastAPI, service: SandboxService, shared: Shared) -> E2B:
    """The E2B routes on ``app``; the code interpreter's cells run in ``shared.kernels``."""
    return install_routes(app, service, shared.tokens, shared.kernels)
