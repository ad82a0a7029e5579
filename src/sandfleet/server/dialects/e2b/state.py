"""The E2B side of the service's sandboxes: per sandbox its :class:`Box` (access token,
template, processes, watchers), the paused ones, the ids E2B clients see, and who may call
(:meth:`Boxes.owner` for the control plane, :meth:`Boxes.envd` for envd).

Every other module of the dialect takes a :class:`Boxes` (the control plane, process.Process,
filesystem.Filesystem, the code interpreter, pause, metrics, the port proxy) and imports this
module, never :mod:`.dialect`, which composes them: no import cycle, not even for types.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from sandfleet.agent.client import RunningCommand
from sandfleet.errors import SandfleetError
from sandfleet.server.auth import Tokens
from sandfleet.server.dialects.e2b.wire import (
    CPError,
    EnvdError,
    NotFound,
    cp_error,
    envelope,
    rfc3339,
)
from sandfleet.server.service import Entry, SandboxService

ENVD_VERSION = "0.6.4"
"""The envd the SDK is told it talks to: the newest whose features the SDK checks are all
served (0.5.7 octet-stream uploads, 0.6.2 file metadata, 0.6.3 watch events with their
entry, 0.6.4 watching any mount: a watcher here compares listings, so any filesystem does)."""
SANDBOX_URL_HINT = "set-E2B_SANDBOX_URL"
"""In the ``domain`` of a plain-HTTP service (see :meth:`Boxes.domain`; ports.py accepts it)."""
PROCESS_OUTPUT_CAP = 64 << 20
"""Bytes of a process's output kept for its stream (``serve --e2b-max-output``): beyond, the
rest is dropped and the process ends with an error saying so."""

@dataclass(eq=False)
class Proc:
    pid: int
    config: dict[str, Any]
    tag: str | None = None
    pty: bool = False
    stdin: bool = True
    events: list[bytes] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False
    task: asyncio.Task[None] | None = None
    handle: RunningCommand | None = None
    kept: int = 0
    cap: int = PROCESS_OUTPUT_CAP
    dropped: int = 0

    def push(self, msg: dict[str, Any]) -> None:
        self.events.append(envelope(0, {"event": msg}))
        self.changed.set()

    def output(self, name: str, data: bytes) -> None:
        room = self.cap - self.kept
        if len(data) > room:
            self.dropped += len(data) - max(0, room)
            data = data[:max(0, room)]
            if not data:
                return
        self.kept += len(data)
        self.push({"data": {"pty" if self.pty else name: base64.b64encode(data).decode()}})

    def info(self) -> dict[str, Any]:
        return {"config": self.config, "pid": self.pid, **({"tag": self.tag} if self.tag else {})}


@dataclass(eq=False)
class Watcher:
    task: asyncio.Task[None] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    error: EnvdError | None = None


@dataclass(eq=False)
class Paused:
    owner: str
    snap: str
    template: str
    metadata: dict[str, str]
    started: float
    timeout: float
    cpus: float | None
    memory_mib: int | None
    disk_mib: int


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
    public: bool = True
    """Its ports answer a host-name request without the traffic token (E2B's allowPublicTraffic)."""



def split_host(host: str) -> tuple[str, str]:
    """(name, port or "") of a Host header's value (``[::1]:8765``, ``127.0.0.1:8765``, ``x.test``)."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else ""
    name, sep, port = host.rpartition(":")
    return (name, port) if sep and port.isdigit() and ":" not in name else (host, "")


def is_loopback(name: str) -> bool:
    n = name.lower().rstrip(".")
    return n == "localhost" or n.endswith(".localhost") or n == "::1" or n.startswith("127.")


class Boxes:
    """The E2B state of the service's sandboxes, and who may call."""

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
        self.on_forget: list[Callable[[str], None]] = []
        """Called with a sandbox's id when its E2B side is dropped (the metrics series)."""

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
        """What the SDK's get_host(port) appends to "<port>-<id>.", by ``--domain``
        (ServiceConfig.e2b_domain): a host name (``localhost`` or the service's DNS name,
        with the port the client used), which ports.py routes by the Host header; or the
        token as URL userinfo at the service's own address. Over plain HTTP it also names
        E2B_SANDBOX_URL (a label of the host name, or the userinfo): an SDK without it sends
        envd calls to https://<port>-<id>.<domain>, and its TLS error quotes that URL, so it
        says what is missing."""
        name, port = split_host(self.host)
        mode = self.service.config.e2b_domain
        if mode == "auto":
            # over HTTPS the SDK also sends envd calls to the domain, and Python's resolver
            # does not map *.localhost everywhere: the userinfo form keeps E2B_API_URL alone working
            mode = "localhost" if is_loopback(name) and not self.tls else "userinfo"
        if mode == "userinfo":
            return f"{'' if self.tls else SANDBOX_URL_HINT}:{b.traffic_token}@{self.host}"
        return f"{'' if self.tls else SANDBOX_URL_HINT + '.'}{mode}{':' + port if port else ''}"

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

    def entry(self, owner: str, sid: str) -> Entry:
        try:
            return self.service.entry(owner, self.real(sid))
        except SandfleetError as err:
            raise cp_error(err) from None

    def set_timeout(self, owner: str, sid: str, timeout: Any) -> None:
        try:
            self.service.extend(owner, self.real(sid), float(timeout))
        except Exception as err:
            raise cp_error(err) from None

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
        for hook in self.on_forget:
            hook(sid)

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


