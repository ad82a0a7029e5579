"""The E2B dialect's root: the ``E2B`` state (sandboxes, aliases, processes, watchers), its
control-plane create/connect/list/kill, envd files, and :func:`install`, which adds every route."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

import sandfleet.server.dialects.e2b.control as e2b_control
import sandfleet.server.dialects.e2b.interpreter as e2b_interpreter
import sandfleet.server.dialects.e2b.metrics as e2b_metrics
import sandfleet.server.dialects.e2b.pause as e2b_pause
from sandfleet.sandbox.spec import Limits, SandboxSpec
from sandfleet.server.auth import Tokens
from sandfleet.server.dialects.e2b.fs import FsRPC
from sandfleet.server.dialects.e2b.image import base_image
from sandfleet.server.dialects.e2b.models import UNSUPPORTED_FIELDS, NewSandbox, problem
from sandfleet.server.dialects.e2b.network import network_limits
from sandfleet.server.dialects.e2b.process import ProcessRPC
from sandfleet.server.dialects.e2b.state import Boxes
from sandfleet.server.dialects.e2b.wire import (
    UNSUPPORTED,
    CPError,
    cp_error,
    json_body,
    route,
)
from sandfleet.server.kernels import Kernels
from sandfleet.server.service import SandboxService

log = logging.getLogger(__name__)

HOME = "/home/user"
DEFAULT_TIMEOUT_S = 300


class E2B(Boxes):
    """The E2B dialect: its state (:class:`~.state.Boxes`), the control plane's calls here,
    and envd's two halves as components, :attr:`process` (process.Process) and :attr:`fs`
    (filesystem.Filesystem and /files)."""

    def __init__(self, service: SandboxService, tokens: Tokens):
        super().__init__(service, tokens)
        self.process = ProcessRPC(self)
        self.fs = FsRPC(self)
        self.on_forget.append(e2b_metrics.forget)

    async def create(self, request: Request) -> dict[str, Any]:
        owner = self.owner(request)
        body = await json_body(request)
        for feature, key in UNSUPPORTED_FIELDS:
            if body.get(key):
                raise CPError(501, f"{feature} ({key}) is {UNSUPPORTED}")
        try:
            req = NewSandbox.model_validate(body)
        except ValidationError as err:
            raise CPError(400, problem(err)) from None
        template = req.templateID or "base"
        timeout = req.timeout or DEFAULT_TIMEOUT_S
        metadata, envs = req.metadata or {}, req.envVars or {}
        snap = self.service.snapshots.get(template)
        if snap is not None and snap.owner == owner:  # a snapshot's id is a template (create_snapshot)
            try:
                kids = await self.service.fork(owner, template, 1, ttl_s=float(timeout), labels=metadata,
                                               deadline_ms=None)
            except Exception as err:
                raise cp_error(err) from None
            return self.sandbox_body(self.adopt(kids[0], template, metadata))
        base = template == "base" or template in e2b_interpreter.TEMPLATES  # the kernel needs only python3
        # E2B's users need the e2b-base layer, which bwrap copies over the host; another backend
        # (process, microvm) runs template base on the host image, as its own default user
        users = base and self.service.backend == "bwrap"
        env = {"HOME": HOME, "USER": "user", "LOGNAME": "user", **envs} if users else (
            {"HOME": HOME, **envs} if base else envs)
        try:
            image = base_image() if users else ("host" if base else template)
        except OSError as err:
            raise CPError(503, f"the E2B base image could not be made on this host: {err}") from None
        try:
            spec = SandboxSpec(image=image, workdir=HOME, env=env, labels=metadata,
                               limits=Limits(ttl_s=float(timeout), **network_limits(body, self.internet())),
                               **({"user": "user"} if users else {}))
        except ValueError as err:
            raise CPError(400, f"invalid sandbox: {err}") from None
        try:
            e = await self.service.create(owner, spec, key=request.headers.get("idempotency-key"), deadline_ms=None)
        except Exception as err:
            raise cp_error(err) from None
        self.adopt(e, template, metadata)
        net = body.get("network")
        asked = net.get("allowPublicTraffic") if isinstance(net, dict) else None
        self.box(e).public = self.service.config.e2b_public_traffic if asked is None else bool(asked)
        return self.sandbox_body(e)

    def internet(self) -> bool:
        """Whether a create that does not say gets the internet: E2B's default, unless serve
        was told ``--no-e2b-internet``; off on microvm, whose sandboxes have no network device."""
        return self.service.config.e2b_internet and self.service.backend != "microvm"

    async def connect(self, request: Request, sid: str) -> dict[str, Any]:
        owner = self.owner(request)
        p = self.paused.get(sid)
        resumed = p is not None and p.owner == owner
        e = await e2b_pause.resume(self, owner, sid, p) if p is not None and resumed else self.entry(owner, sid)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            body = {}
        if isinstance(body, dict) and body.get("timeout"):
            try:
                ttl = float(body["timeout"])
            except (TypeError, ValueError):
                raise CPError(400, "timeout is a number of seconds") from None
            # E2B: "for running sandboxes, the timeout will update only if the new timeout is
            # longer than the existing one" (a resumed one takes it as given)
            if resumed or ttl > e.expires - time.monotonic():
                self.set_timeout(owner, sid, ttl)
        return self.sandbox_body(e)

    def list_sandboxes(self, request: Request) -> Response:
        owner = self.owner(request)
        q = request.query_params
        states = set((q.get("state") or "running,paused").split(","))  # E2B: no state filter lists both
        want = dict(parse_qsl(q.get("metadata") or ""))
        entries = [e for e in self.service.find(owner, {}) if e.sb.alive] if "running" in states else []
        entries = [e for e in entries if all(self.box(e).metadata.get(k) == v for k, v in want.items())]
        if q.get("template"):
            entries = [e for e in entries if self.box(e).template == q["template"]]
        if q.get("startedAfter"):
            try:
                after = dt.datetime.fromisoformat(q["startedAfter"].replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise CPError(400, "startedAfter is not an RFC3339 time") from None
            entries = [e for e in entries if e.created > after]
        entries.sort(key=lambda e: (e.created, e.sb.id), reverse=q.get("order") == "desc")
        try:
            limit = max(1, min(int(q.get("limit") or 100), 1000))
            start = int(q.get("nextToken") or 0)
        except ValueError:
            raise CPError(400, "limit and nextToken are numbers") from None
        rows = [self.listed(e) for e in entries]
        if "paused" in states:
            rows += [e2b_pause.listed(self, sid, p) for sid, p in sorted(self.paused.items())
                     if p.owner == owner and all(p.metadata.get(k) == v for k, v in want.items())
                     and (not q.get("template") or p.template == q["template"])]
        page = rows[start:start + limit]
        headers = {"X-Next-Token": str(start + limit)} if start + limit < len(rows) else {}
        return JSONResponse(page, headers=headers)

    async def kill(self, request: Request, sid: str) -> Response:
        owner = self.owner(request)
        p = self.paused.get(sid)
        if p is not None and p.owner == owner:
            e2b_pause.drop(self, sid)
            return Response(status_code=204)
        e = self.entry(owner, sid)
        self.forget(e.sb.id)
        # answered once the sandbox is unregistered: its processes are killed and its files
        # removed in the background (service.close() still waits for that on shutdown)
        await self.service.delete_soon(e)
        return Response(status_code=204)

def install_routes(app: FastAPI, service: SandboxService, tokens: Tokens, kernels: Kernels) -> E2B:
    """Add the E2B routes to ``app`` (none of them in the schema); the code interpreter's
    cells run in ``kernels``."""
    e2b = E2B(service, tokens)

    cp = envd = route  # the control plane's routes and envd's: errors through wire.error_response

    async def create(request: Request) -> Any:
        return await e2b.create(request)

    async def list_(request: Request) -> Any:
        return e2b.list_sandboxes(request)

    async def info(request: Request) -> Any:
        sid = request.path_params["sid"]
        owner = e2b.owner(request)
        p = e2b.paused.get(sid)
        if p is not None and p.owner == owner:
            return e2b_pause.listed(e2b, sid, p)
        e = e2b.entry(owner, sid)
        return {**e2b.listed(e), "envdAccessToken": e2b.box(e).token, "domain": e2b.domain(e2b.box(e))}

    async def timeout(request: Request) -> Any:
        sid = request.path_params["sid"]
        owner = e2b.owner(request)
        try:
            body = json.loads(await request.body() or b"{}")
            t = float(body["timeout"])
        except (ValueError, KeyError, TypeError):
            raise CPError(400, "a body {\"timeout\": seconds} is needed") from None
        e2b.set_timeout(owner, sid, t)
        return Response(status_code=204)

    async def connect(request: Request) -> Any:
        sid = request.path_params["sid"]
        return await e2b.connect(request, sid)

    async def kill(request: Request) -> Any:
        sid = request.path_params["sid"]
        return await e2b.kill(request, sid)

    e2b_control.install(app, e2b, cp)
    for prefix in ("", "/v2"):
        app.add_api_route(f"{prefix}/sandboxes", cp(create, 201), methods=["POST"], include_in_schema=False)
        app.add_api_route(f"{prefix}/sandboxes", cp(list_), methods=["GET"], include_in_schema=False)
        app.add_api_route(f"{prefix}/sandboxes/{{sid}}", cp(info), methods=["GET"], include_in_schema=False)
        app.add_api_route(f"{prefix}/sandboxes/{{sid}}", cp(kill), methods=["DELETE"], include_in_schema=False)
        app.add_api_route(f"{prefix}/sandboxes/{{sid}}/timeout", cp(timeout), methods=["POST"],
                          include_in_schema=False)
        app.add_api_route(f"{prefix}/sandboxes/{{sid}}/connect", cp(connect), methods=["POST"],
                          include_in_schema=False)
    # older SDKs resume through /resume (2.63 through connect)
    app.add_api_route("/sandboxes/{sid}/resume", cp(connect, 201), methods=["POST"], include_in_schema=False)

    proc, fs = e2b.process, e2b.fs
    rpcs = {"/process.Process/Start": proc.start, "/process.Process/Connect": proc.connect_process,
            "/process.Process/SendSignal": proc.send_signal, "/process.Process/List": proc.list_processes,
            "/process.Process/SendInput": proc.send_input, "/process.Process/StreamInput": proc.stream_input,
            "/process.Process/CloseStdin": proc.close_stdin, "/process.Process/Update": proc.update,
            "/filesystem.Filesystem/ListDir": fs.list_dir, "/filesystem.Filesystem/Stat": fs.stat_,
            "/filesystem.Filesystem/MakeDir": fs.make_dir, "/filesystem.Filesystem/Remove": fs.remove,
            "/filesystem.Filesystem/Move": fs.move, "/filesystem.Filesystem/WatchDir": fs.watch_dir,
            "/filesystem.Filesystem/CreateWatcher": fs.create_watcher,
            "/filesystem.Filesystem/GetWatcherEvents": fs.get_watcher_events,
            "/filesystem.Filesystem/RemoveWatcher": fs.remove_watcher}
    for path, fn in rpcs.items():
        app.add_api_route(path, envd(fn), methods=["POST"], include_in_schema=False)
    app.add_api_route("/files", envd(fs.read), methods=["GET"], include_in_schema=False)
    app.add_api_route("/files", envd(fs.write), methods=["POST"], include_in_schema=False)

    async def health(request: Request) -> Response:
        e2b.envd(request)
        return Response(status_code=204)

    app.add_api_route("/health", envd(health), methods=["GET"], include_in_schema=False)
    e2b_interpreter.install(app, e2b, kernels)  # the code interpreter's port 49999: /execute, /contexts
    return e2b
