"""A sandbox on a ``sandfleet serve`` host, behind the same contract as a local one.

:class:`RemoteRuntime` offers what :class:`~sandfleet.sandbox.base.AgentSandbox` asks of a
guest agent (exec, read, write, kill by user), over HTTP; so :class:`RemoteSandbox` is an
``AgentSandbox`` and sessions, uploads, downloads and path rules are the very code local
sandboxes run. Paths are normalised here and again on the service.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import logging
import tarfile
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, Unpack

import httpx

from sandfleet.agent.client import ExecResult, OutputCallback, RunOptions, _text
from sandfleet.agent.protocol import MAX_OUTPUT, MAX_READ
from sandfleet.client._http import JSON, body, checked_request, ndjson, raise_for_status, transport_error
from sandfleet.client._transport import FastTransport
from sandfleet.client.models import (
    BranchRequest,
    BranchResult,
    CodeExecution,
    ExecRequest,
    KillRequest,
    RunCodeRequest,
    TTLRequest,
)
from sandfleet.errors import (
    ConfigError,
    ProtocolError,
    SandboxClosedError,
    SandboxDiedError,
    SandboxError,
    SandboxUnresponsiveError,
    ServiceError,
    from_wire,
)
from sandfleet.sandbox.base import AgentSandbox, Sandbox, Snapshot
from sandfleet.sandbox.branching import BranchInfo, carry_sessions
from sandfleet.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)
EXEC_GRACE_S = 30.0
"""Past a command's timeout (or the TTL), how long the client waits for the service."""
MAX_DEADLINE_S = 3600.0
"""The longest X-Deadline-Ms the service takes (an hour)."""
QUEUE_SHARE = 0.8
"""Of a request's read timeout, the share it may wait in the service's queue for a busy slot
(the rest is for the work itself: an answer after the read timeout is an error of its own)."""


def queued(seconds: float) -> dict[str, str]:
    """The X-Deadline-Ms of a request that may wait ``seconds`` (MAX_DEADLINE_S at most) in the
    service's queue for a busy slot."""
    return {"X-Deadline-Ms": str(int(min(seconds, MAX_DEADLINE_S) * 1000))}


class ServiceSession(Protocol):
    """What a remote sandbox needs of the service it lives on (a
    :class:`~sandfleet.client.service.ServiceClient` is one)."""

    url: str
    connect_timeout: float
    deadline_s: float | None
    http: httpx.AsyncClient

    def pool(self, key: str | None = None) -> httpx.AsyncClient: ...

    def direct(self, key: str) -> FastTransport | None: ...

    def deadline_header(self) -> dict[str, str]: ...

    async def fork(self, snapshot: Snapshot, n: int) -> list[Sandbox]: ...

    def later(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class RemoteRuntime:
    """The guest-agent calls of one remote sandbox, over the service's HTTP API."""

    def __init__(self, service: ServiceSession, sid: str, expires_in_s: float):
        self.service = service
        self.sid = sid
        self.path = f"/v1/sandboxes/{sid}"
        self.http = service.pool(sid)
        self.exec_url = httpx.URL(f"{service.url}{self.path}/exec")  # parsed once: not on every exec
        # Commands go straight to the transport the service session hands over (its own
        # FastTransport, when no proxy is configured): httpx's client adds nothing a command
        # needs (auth is a header, the service never redirects or sets cookies) and costs
        # ~0.35 ms of CPU per request. An injected transport keeps the whole client.
        self._direct = service.direct(sid)
        self._headers = {**self.http.headers, "content-type": "application/json", **service.deadline_header()}
        self.expires = time.monotonic() + expires_in_s
        self._dead: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._dead is None and time.monotonic() < self.expires

    @property
    def error(self) -> BaseException | None:
        if self._dead is None and time.monotonic() >= self.expires:
            return SandboxDiedError(f"sandbox {self.sid} expired (its TTL passed)")
        return self._dead

    def mark_dead(self, err: BaseException) -> None:
        if self._dead is None:
            self._dead = err

    def _seen(self, err: Exception) -> Exception:
        """Remember that the sandbox is gone for good when the service says so."""
        if isinstance(err, SandboxDiedError | SandboxUnresponsiveError | SandboxClosedError):
            self.mark_dead(err)
        return err

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request of the sandbox's; where the client gave no deadline of its own, one that
        waits for a busy slot (a file's read or write, an archive) waits in the service's queue
        for most of its read timeout (QUEUE_SHARE), so that a host at its --max-busy delays it
        rather than failing it."""
        headers = dict(kw.pop("headers", None) or {})
        if self.service.deadline_s is None and not any(k.lower() == "x-deadline-ms" for k in headers):
            t = kw.get("timeout", self.http.timeout)
            read = t.read if isinstance(t, httpx.Timeout) else t
            headers |= queued(MAX_DEADLINE_S if read is None else float(read) * QUEUE_SHARE)
        try:
            resp = await self.http.request(method, self.path + path, headers=headers, **kw)
        except httpx.HTTPError as e:
            raise transport_error(e, self.service.url) from None
        try:
            await raise_for_status(resp)
        except (SandboxError, ServiceError) as e:
            raise self._seen(e) from None
        return resp

    async def exec(self, argv: Sequence[str], **opts: Unpack[RunOptions]) -> ExecResult:
        cap = min(max(0, opts.get("max_output", 1 << 20)), MAX_OUTPUT)
        stdin, timeout, on_output = opts.get("stdin"), opts.get("timeout"), opts.get("on_output")
        with checked_request():
            req = ExecRequest(cmd=list(argv), cwd=opts.get("cwd"), env=opts.get("env") or None, timeout=timeout,
                              max_output=cap, stdin_b64=base64.b64encode(stdin).decode() if stdin else None,
                              stream=on_output is not None, user=opts.get("user"),
                              network=opts.get("network", True), pid_namespace=opts.get("pid_namespace", False))
        wait = (timeout if timeout is not None else max(0.0, self.expires - time.monotonic())) + EXEC_GRACE_S
        return await self._run(self.exec_url, body(req), on_output, cap, wait)

    def _admission(self, wait: float) -> tuple[dict[str, str], float]:
        """The deadline header of a command that may run ``wait`` seconds, and how long its
        answer may take to start: the client's ``deadline_s`` where it gave one; else the
        command waits in the service's queue for a busy slot (--max-busy) as long as the sandbox
        has left to live (its own run time where that is longer; an hour at most), so that a host
        at its limit delays a rollout's command instead of failing it (HTTP 429, an infra fault:
        the rollout masked, though nothing was wrong with it). How long a slot stays busy is other
        sandboxes' commands' business, not this command's: a verifier's 30-s check queued at most
        its own 30 s, behind two 60-s commands, and the rollout was masked (issue 41)."""
        if self.service.deadline_s is not None:
            return {}, wait
        queue = min(max(wait, self.expires - time.monotonic()), MAX_DEADLINE_S)
        return queued(queue), wait + queue

    async def _run(self, url: httpx.URL, content: bytes, on_output: OutputCallback | None, cap: int,
                   wait: float) -> ExecResult:
        """POST a command and read its NDJSON records to the exit record. Cancelled, the
        connection closes and the service kills the command."""
        kept = {"stdout": bytearray(), "stderr": bytearray()}
        seen = {"stdout": 0, "stderr": 0}
        deadline, first_byte = self._admission(wait)
        timeout = httpx.Timeout(first_byte, connect=self.service.connect_timeout)
        try:
            async with self._post(url, content, timeout, deadline) as resp:
                try:
                    await raise_for_status(resp)
                except (SandboxError, ServiceError) as e:
                    raise self._seen(e) from None
                last: dict[str, Any] | None = None
                async for rec in ndjson(resp):  # to the end of the body: the connection is then reused
                    kind = rec.get("type")
                    if kind in ("stdout", "stderr"):
                        data = base64.b64decode(rec.get("b64") or "")
                        seen[kind] += len(data)
                        room = cap - len(kept[kind])
                        if room > 0:
                            kept[kind] += data[:room]
                        if on_output is not None:
                            on_output(kind, data)
                    elif kind in ("exit", "error"):
                        last = rec
            if last is None:
                raise ProtocolError(f"the service ended command output of sandbox {self.sid} without an exit record")
            if last["type"] == "error":
                raise self._seen(from_wire(int(last.get("status") or 400), last))
            return self._result(last, kept, seen, on_output is not None)
        except httpx.TimeoutException:
            err = SandboxUnresponsiveError(f"sandbox {self.sid}: the service did not report the end of the command "
                                           f"within {wait:g}s; the sandbox is marked dead")
            self.mark_dead(err)
            raise err from None
        except httpx.HTTPError as e:
            if isinstance(e, httpx.RemoteProtocolError | httpx.ReadError):  # the service went away mid-command
                raise SandboxDiedError(f"sandbox {self.sid}: the service closed the connection during a command "
                                       f"({type(e).__name__}); the sandbox may be lost") from None
            raise transport_error(e, self.service.url) from None

    @contextlib.asynccontextmanager
    async def _post(self, url: httpx.URL, content: bytes, timeout: httpx.Timeout,
                    deadline: dict[str, str] | None = None) -> AsyncIterator[httpx.Response]:
        """POST ``content`` (JSON); the response's stream, closed after the block. ``deadline``:
        an X-Deadline-Ms of this request's own in place of the client's."""
        if self._direct is None:
            async with self.http.stream("POST", url, content=content, timeout=timeout,
                                        headers={"content-type": "application/json",
                                                 **self.service.deadline_header(), **(deadline or {})}) as resp:
                yield resp
            return
        req = httpx.Request("POST", url, content=content, headers={**self._headers, **(deadline or {})},
                            extensions={"timeout": timeout.as_dict()})
        resp = await self._direct.handle_async_request(req)
        resp.request = req
        try:
            yield resp
        finally:
            await resp.aclose()

    @staticmethod
    def _result(rec: dict[str, Any], kept: dict[str, bytearray], seen: dict[str, int], streamed: bool) -> ExecResult:
        try:
            if streamed:
                out, err_bytes = bytes(kept["stdout"]), bytes(kept["stderr"])
                drop_out, drop_err = seen["stdout"] - len(out), seen["stderr"] - len(err_bytes)
                err_text = _text(err_bytes, drop_err)
            else:
                out = base64.b64decode(rec.get("stdout_b64") or "")
                drop_out, drop_err = int(rec.get("stdout_dropped") or 0), int(rec.get("stderr_dropped") or 0)
                err_text = str(rec.get("stderr") or "")
            return ExecResult(
                exit_code=int(rec["exit_code"]), stdout=_text(out, drop_out), stderr=err_text,
                duration_s=float(rec.get("duration_s") or 0.0), timed_out=bool(rec.get("timed_out")),
                signal=rec.get("signal") or None, stdout_dropped=drop_out, stderr_dropped=drop_err,
                stdout_bytes=out, detached=int(rec.get("detached") or 0),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"the service sent a malformed exit record: {e}") from None

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20, user: str | int | None = None,
                        nofollow: bool = False) -> bytes:
        params: dict[str, Any] = {"path": path, "max_bytes": min(max(0, max_bytes), MAX_READ)}
        if user is not None:
            params["user"] = str(user)
        if nofollow:
            params["nofollow"] = "true"
        return (await self.request("GET", "/files", params=params)).content

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644, user: str | int | None = None) -> None:
        params: dict[str, Any] = {"path": path, "mode": mode}
        if user is not None:
            params["user"] = str(user)
        await self.request("PUT", "/files", params=params, content=data,
                           headers={"content-type": "application/octet-stream"})

    async def kill_user(self, user: str | int) -> None:
        with checked_request():
            req = KillRequest(user=user)
        await self.request("POST", "/kill", content=body(req), headers=JSON)

    async def kill_everyone(self) -> bool:
        """``/kill`` of user ``*``: True once every process but the guest agent's is gone; False
        where the service refuses it (older than it: ``*`` is no user name there), and the caller
        then kills user by user."""
        try:
            await self.kill_user("*")
        except ConfigError:
            return False
        return True

    async def close(self) -> None:
        """Nothing to close per sandbox: the HTTP client belongs to the ServiceClient."""


class RemoteSandbox(AgentSandbox):
    """A sandbox on a sandfleet service; the Sandbox contract, as local ones."""

    backend = "remote"

    def __init__(self, service: ServiceSession, info: dict[str, Any]):
        spec = SandboxSpec.model_validate(info["spec"])
        self.runtime = RemoteRuntime(service, str(info["id"]), float(info["expires_in_s"]))
        # a Runtime, as the guest agent's AgentClient is: the SWE-ReX shape, in-process or remote
        super().__init__(str(info["id"]), spec, self.runtime)
        self.service = service
        self.backend = str(info.get("backend", "remote"))
        """The backend the service runs it on (bwrap, ...): what code that asks whether users
        and isolation exist must see. ``isinstance(sb, RemoteSandbox)`` tells it is remote."""
        self.env = {}  # the service adds the base environment; send only what the caller gives

    async def upload(self, local: str | Path, remote_dir: str, *, user: str | int | None = None) -> None:
        """Copy a local file or directory into ``remote_dir`` as one tar stream."""
        local = Path(local)
        if not local.exists():
            raise FileNotFoundError(f"nothing to upload at {local}")
        self._check()

        def pack() -> bytes:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for child in sorted(local.iterdir()) if local.is_dir() else [local]:
                    tar.add(child, arcname=child.name)
            return buf.getvalue()

        params: dict[str, Any] = {"path": self._path(remote_dir)}
        if user is not None:
            params["user"] = str(user)
        await self.runtime.request("PUT", "/archive", params=params, content=await asyncio.to_thread(pack),
                                   headers={"content-type": "application/x-tar", **self.service.deadline_header()})

    async def extend(self, ttl_s: float) -> None:
        """Set the remaining lifetime to ``ttl_s`` seconds from now (within the service's --max-ttl)."""
        self._check()
        with checked_request():
            req = TTLRequest(ttl_s=ttl_s)
        resp = await self.runtime.request("POST", "/ttl", content=body(req), headers=JSON)
        self.runtime.expires = time.monotonic() + float(resp.json()["expires_in_s"])

    async def run_code(self, code: str, *, context: str = "default", cwd: str | None = None,
                       env: dict[str, str] | None = None, timeout: float | None = None,
                       language: Literal["python", "bash"] = "python") -> CodeExecution:
        """Run a cell in the sandbox's stateful Python on the service (its kernel, started on
        the first cell and shared with the E2B code interpreter): globals persist per
        ``context``, ``.text`` is the value of the last expression, ``.error`` what it raised
        (``name``, ``value``, ``traceback``). Past ``timeout`` the cell is interrupted.
        ``language="bash"``: a long-lived bash per context (``RunCodeRequest.language``)."""
        self._check()
        with checked_request():
            req = RunCodeRequest(code=code, context=context, cwd=cwd, env=env, timeout=timeout, language=language)
        resp = await self.runtime.request("POST", "/run_code", content=body(req),
                                          headers={**JSON, **self.service.deadline_header()},
                                          timeout=None if timeout is None else timeout + EXEC_GRACE_S)
        return CodeExecution.model_validate_json(resp.content)

    async def snapshot(self) -> Snapshot:
        self._check()
        resp = await self.runtime.request("POST", "/snapshot")
        return RemoteSnapshot(self.service, str(resp.json()["id"]), self.spec)

    async def branch(self, n: int, *, processes: Literal["error", "drop"] = "error") -> list[Sandbox]:
        """``n`` sandboxes on the service that continue from this one's state now
        (``POST /v1/sandboxes/{sid}/branch``); each continues this one's sessions."""
        self._check()
        with checked_request():
            req = BranchRequest(n=n, processes=processes)
        resp = await self.runtime.request("POST", "/branch", content=body(req),
                                          headers={**JSON, **self.service.deadline_header()})
        got = BranchResult.model_validate(resp.json())
        kids: list[Sandbox] = []
        for i, info in enumerate(got.sandboxes):
            kid = RemoteSandbox(self.service, info.model_dump(mode="json"))
            kid.branch_info = BranchInfo(parent=self.id, carried=list(got.carried), index=i,
                                         dropped=[(int(p), str(c), str(cmd)) for p, c, cmd in got.dropped],
                                         sessions=carry_sessions(self, kid))
            kids.append(kid)
        return kids

    async def close(self) -> None:
        """Delete the sandbox on the service (one already gone there is fine)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.runtime.request("DELETE", "")
        except (SandboxError, ServiceError) as e:
            if getattr(e, "status", None) == 404 or isinstance(e, SandboxError):
                return  # already gone there (deleted, expired, lost, or never ours)
            raise
        finally:
            self.runtime.mark_dead(SandboxDiedError(f"sandbox {self.id} is closed"))


class RemoteSnapshot(Snapshot):
    """A snapshot kept on the service; ``fork`` it there, ``delete`` it when done."""

    def __init__(self, service: ServiceSession, snap_id: str, spec: SandboxSpec):
        super().__init__(backend="remote", spec=spec, layer=None, cleanup=self._delete_later)
        self.id = snap_id
        self.service = service

    async def fork(self, n: int) -> list[Sandbox]:
        return await self.service.fork(self, n)

    def _delete_later(self) -> None:
        self.service.later(self.adelete())

    async def adelete(self) -> None:
        self._cleanup = None
        try:
            resp = await self.service.http.delete(f"/v1/snapshots/{self.id}")
            if resp.status_code != 404:
                await raise_for_status(resp)
        except httpx.HTTPError as e:
            raise transport_error(e, self.service.url) from None
