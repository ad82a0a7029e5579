"""The E2B dialect's root: the ``E2B`` state (sandboxes, aliases, processes, watchers), its
control-plane create/connect/list/kill, envd files, and :func:`install`, which adds every route."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import sandfleet.server.dialects.e2b.control as e2b_control
import sandfleet.server.dialects.e2b.interpreter as e2b_interpreter
import sandfleet.server.dialects.e2b.metrics as e2b_metrics
import sandfleet.server.dialects.e2b.pause as e2b_pause
from sandfleet.errors import SandfleetError
from sandfleet.sandbox.spec import Limits, SandboxSpec
from sandfleet.server.auth import Tokens
from sandfleet.server.dialects.e2b.fs import FsRPC, Watcher
from sandfleet.server.dialects.e2b.image import base_image
from sandfleet.server.dialects.e2b.network import network_limits
from sandfleet.server.dialects.e2b.pause import Paused
from sandfleet.server.dialects.e2b.process import Proc, ProcessRPC
from sandfleet.server.dialects.e2b.wire import (
    UNSUPPORTED,
    CPError,
    EnvdError,
    NotFound,
    cp_error,
    cp_response,
    envd_response,
    not_found,
    rfc3339,
)
from sandfleet.server.kernels import Kernels
from sandfleet.server.service import Entry, SandboxService

log = logging.getLogger(__name__)

ENVD_VERSION = "0.5.7"
HOME = "/home/user"
DEFAULT_TIMEOUT_S = 300
SANDBOX_URL_HINT = "set-E2B_SANDBOX_URL"
"""In the ``domain`` of a plain-HTTP service (see :meth:`E2B.domain`; ports.py accepts it)."""


@dataclass(eq=False)
class Box:
    """What E2B adds to a sandfleet sandbox: its access token, template and processes."""

    token: str
    template: str
    metadata: dict[str, str]
    traffic_token: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    procs: dict[int, Proc] = field(default_factory=dict)
    next_pid: int = 1000
    watchers: dict[str, Watcher] = field(default_factory=dict)


class E2B(ProcessRPC, FsRPC):
    def __init__(self, service: SandboxService, tokens: Tokens):
        self.service = service
        self.tokens = tokens
        self.boxes: dict[str, Box] = {}
        self.snapshot_names: dict[str, str] = {}
        self.paused: dict[str, Paused] = {}
        """Paused sandboxes by id (pause with mode "filesystem": a snapshot, resumed by connect)."""
        self.pause_snaps: set[str] = set()
        """Snapshots made by pause (not the token's own: list_snapshots leaves them out)."""
        self.alias: dict[str, str] = {}
        """A resumed sandbox's E2B id -> its sandfleet id (a resume is a new sandbox)."""
        self.public: dict[str, str] = {}
        """The reverse of ``alias``."""
        self.host = "127.0.0.1"
        """The service's address as clients reach it (the Host of their last control-plane call)."""
        self.tls = False
        """Whether that call came over HTTPS (serve --ssl-certfile)."""

    # -- control plane

    def adopt(self, e: Entry, template: str, metadata: dict[str, str]) -> Entry:
        """Give a sandbox made here (create, fork) its E2B side: an access token."""
        for gone in [k for k in self.boxes if k not in self.service.live]:  # expired, deleted through /v1
            self.forget(gone)
        if e.sb.id not in self.boxes:
            self.boxes[e.sb.id] = Box(token=secrets.token_urlsafe(24), template=template, metadata=metadata)
        return e

    def real(self, sid: str) -> str:
        """The sandfleet id behind an E2B sandbox id (they differ once it was paused and resumed)."""
        return self.alias.get(sid, sid)

    def pub(self, real_id: str) -> str:
        return self.public.get(real_id, real_id)

    def owner(self, request: Request) -> str:
        key = request.headers.get("x-api-key")
        oid = self.tokens.owner(f"Bearer {key}") if key else None
        if oid is None:
            raise CPError(401, "Invalid API key: X-API-Key must be a token of this service")
        self.host = request.headers.get("host") or self.host
        self.tls = request.url.scheme == "https"
        return oid

    def domain(self, b: Box) -> str:
        """What the SDK's get_host(port) appends to "<port>-<id>.": the token as URL userinfo
        at the service's own address (e2b_ports). Over plain HTTP the userinfo also names
        E2B_SANDBOX_URL: an SDK without it sends envd calls to https://<port>-<id>.<domain>,
        and its TLS error quotes that URL, so it says what is missing."""
        return f"{'' if self.tls else SANDBOX_URL_HINT}:{b.traffic_token}@{self.host}"

    def box(self, e: Entry) -> Box:
        """The E2B side of a sandbox (made on first use for one created through /v1)."""
        b = self.boxes.get(e.sb.id)
        if b is None:
            b = self.boxes[e.sb.id] = Box(token=secrets.token_urlsafe(24), template=e.spec.image,
                                          metadata=dict(e.spec.labels))
        return b

    def sandbox_body(self, e: Entry) -> dict[str, Any]:
        b = self.box(e)
        return {"templateID": b.template, "sandboxID": self.pub(e.sb.id), "clientID": "sandfleet", "alias": b.template,
                "envdVersion": ENVD_VERSION, "envdAccessToken": b.token, "trafficAccessToken": b.traffic_token,
                "domain": self.domain(b)}

    def listed(self, e: Entry) -> dict[str, Any]:
        b = self.box(e)
        lim = e.spec.limits
        end = time.time() + max(0.0, e.expires - time.monotonic())
        return {"templateID": b.template, "alias": b.template, "sandboxID": self.pub(e.sb.id), "clientID": "sandfleet",
                "startedAt": rfc3339(e.created), "endAt": rfc3339(end),
                "cpuCount": max(1, round(lim.cpus or (os.cpu_count() or 1))),
                "memoryMB": lim.memory_mib or 0, "diskSizeMB": lim.disk_mib, "state": "running",
                "envdVersion": ENVD_VERSION, "metadata": b.metadata}

    async def create(self, request: Request) -> dict[str, Any]:
        owner = self.owner(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            raise CPError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise CPError(400, "the body is not a JSON object")
        for feature, key in (("MCP", "mcp"), ("volume mounts", "volumeMounts"), ("auto-pause", "autoPause"),
                             ("IAM", "iam")):
            if body.get(key):
                raise CPError(501, f"{feature} ({key}) is {UNSUPPORTED}")
        template = str(body.get("templateID") or "base")
        timeout = body.get("timeout") or DEFAULT_TIMEOUT_S
        metadata = {str(k): str(v) for k, v in (body.get("metadata") or {}).items()}
        envs = {str(k): str(v) for k, v in (body.get("envVars") or {}).items()}
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
                               limits=Limits(ttl_s=float(timeout), **network_limits(body)),  # allowOut/denyOut
                               **({"user": "user"} if users else {}))
        except ValueError as err:
            raise CPError(400, f"invalid sandbox: {err}") from None
        try:
            e = await self.service.create(owner, spec, key=request.headers.get("idempotency-key"), deadline_ms=None)
        except Exception as err:
            raise cp_error(err) from None
        return self.sandbox_body(self.adopt(e, template, metadata))

    def entry(self, owner: str, sid: str) -> Entry:
        try:
            return self.service.entry(owner, self.real(sid))
        except SandfleetError as err:
            raise cp_error(err) from None

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

    def set_timeout(self, owner: str, sid: str, timeout: Any) -> None:
        try:
            self.service.extend(owner, self.real(sid), float(timeout))
        except Exception as err:
            raise cp_error(err) from None

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

    def forget(self, sid: str) -> None:
        pub = self.public.pop(sid, None)
        if pub is not None:
            self.alias.pop(pub, None)
        b = self.boxes.pop(sid, None)
        if b is not None:
            for p in b.procs.values():
                if p.task is not None:
                    p.task.cancel()
            for w in b.watchers.values():
                if w.task is not None:
                    w.task.cancel()
        e2b_metrics.forget(sid)

    # -- envd

    def signed_sandbox(self, request: Request) -> str:
        """The sandbox whose access token signed a ``download_url`` / ``upload_url`` (E2B's v1
        signature: sha256 of path, operation, user, token and expiry); 401 for none, or an
        expired one. The URL is the service's own ``/files``: no other address is involved."""
        q = request.query_params
        op = "read" if request.method == "GET" else "write"
        exp = q.get("signature_expiration")
        if exp is not None:
            if not exp.isdigit():
                raise CPError(400, "signature_expiration is a Unix time")
            if int(exp) < time.time():
                raise CPError(401, "this file URL's signature has expired")
        for sid, b in list(self.boxes.items()):
            raw = f"{q.get('path') or ''}:{op}:{q.get('username') or ''}:{b.token}" + (f":{exp}" if exp else "")
            want = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
            if hmac.compare_digest(want.encode(), (q.get("signature") or "").encode()):
                return sid
        raise CPError(401, f"the signature does not match this file URL's path, user and operation ({op})")

    def user_env(self, e: Entry, user: str | None) -> dict[str, str]:
        """What envd sets per user: root's HOME is /root (the sandbox's env names the default user's)."""
        if user in ("root", "0"):
            return {"HOME": "/root", "USER": "root", "LOGNAME": "root"}
        return {}

    def envd(self, request: Request) -> tuple[Entry, Box, str | None]:
        """The sandbox an envd request names, checked against its access token; the user."""
        sid = self.real(request.headers.get("e2b-sandbox-id") or "")
        signed = not sid and request.url.path == "/files" and bool(request.query_params.get("signature"))
        if signed:
            sid = self.signed_sandbox(request)
        e = self.service.live.get(sid)
        b = self.boxes.get(sid)
        if e is None or b is None or not e.sb.alive:
            if e is None:
                self.forget(sid)
            raise NotFound(sid)
        tok = request.headers.get("x-access-token") or ""
        if not signed and not hmac.compare_digest(tok.encode(), b.token.encode()):
            raise EnvdError("unauthenticated", "a valid X-Access-Token for this sandbox is needed")
        user = request.query_params.get("username")
        auth = request.headers.get("authorization") or ""
        if user is None and auth.lower().startswith("basic "):
            try:
                user = base64.b64decode(auth[6:].strip()).decode().split(":", 1)[0] or None
            except (binascii.Error, UnicodeDecodeError):
                raise EnvdError("unauthenticated", "a malformed Authorization: Basic header") from None
        if user == "user":
            user = None  # E2B's default user is the sandbox's own user
        return e, b, user


def install_routes(app: FastAPI, service: SandboxService, tokens: Tokens, kernels: Kernels) -> E2B:
    """Add the E2B routes to ``app`` (none of them in the schema); the code interpreter's
    cells run in ``kernels``."""
    e2b = E2B(service, tokens)

    def cp(fn: Any, status: int = 200) -> Any:
        async def route(request: Request) -> Response:
            try:
                out = await fn(request)
            except CPError as err:
                return cp_response(err)
            return out if isinstance(out, Response) else JSONResponse(out, status_code=status)
        return route

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

    def envd(fn: Any) -> Any:
        async def route(request: Request) -> Response:
            try:
                out = await fn(request)
            except NotFound as err:
                return not_found(str(err))
            except EnvdError as err:
                return envd_response(err)
            except CPError as err:
                return cp_response(err)
            return out if isinstance(out, Response) else JSONResponse(out)
        return route

    rpcs = {"/process.Process/Start": e2b.start, "/process.Process/Connect": e2b.connect_process,
            "/process.Process/SendSignal": e2b.send_signal, "/process.Process/List": e2b.list_processes,
            "/process.Process/SendInput": e2b.send_input, "/process.Process/StreamInput": e2b.stream_input,
            "/process.Process/CloseStdin": e2b.close_stdin, "/process.Process/Update": e2b.update,
            "/filesystem.Filesystem/ListDir": e2b.list_dir, "/filesystem.Filesystem/Stat": e2b.stat_,
            "/filesystem.Filesystem/MakeDir": e2b.make_dir, "/filesystem.Filesystem/Remove": e2b.remove,
            "/filesystem.Filesystem/Move": e2b.move, "/filesystem.Filesystem/WatchDir": e2b.watch_dir,
            "/filesystem.Filesystem/CreateWatcher": e2b.create_watcher,
            "/filesystem.Filesystem/GetWatcherEvents": e2b.get_watcher_events,
            "/filesystem.Filesystem/RemoveWatcher": e2b.remove_watcher}
    for path, fn in rpcs.items():
        app.add_api_route(path, envd(fn), methods=["POST"], include_in_schema=False)
    app.add_api_route("/files", envd(e2b.read), methods=["GET"], include_in_schema=False)
    app.add_api_route("/files", envd(e2b.write), methods=["POST"], include_in_schema=False)

    async def health(request: Request) -> Response:
        e2b.envd(request)
        return Response(status_code=204)

    app.add_api_route("/health", envd(health), methods=["GET"], include_in_schema=False)
    e2b_interpreter.install(app, e2b, kernels)  # the code interpreter's port 49999: /execute, /contexts
    return e2b
