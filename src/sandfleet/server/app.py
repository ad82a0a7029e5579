"""The HTTP API of ``sandfleet serve`` (FastAPI): routes, auth, errors, streaming.

Every ``/v1`` route and ``/metrics`` need ``Authorization: Bearer <token>``; ``/healthz``
and ``/openapi.json`` do not. Errors are ``{"code", "message"}`` (see :mod:`.api`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import logging
import posixpath
import tarfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Message, Receive, Scope, Send

from sandfleet.agent.client import ExecResult, OutputCallback
from sandfleet.errors import SandfleetError
from sandfleet.sandbox.base import AgentSandbox, sandbox_path
from sandfleet.server import api
from sandfleet.server.api import Problem
from sandfleet.server.auth import Tokens
from sandfleet.server.metrics import Metrics
from sandfleet.server.service import Entry, SandboxService, check_argv, check_env, parse_labels

log = logging.getLogger(__name__)
NDJSON_TYPE = "application/x-ndjson"
BINARY_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
TAR_BODY = {"requestBody": {"required": True, "description": "an uncompressed tar stream", "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": api.ErrorBody} for code in (400, 401, 404, 410, 413, 422, 429, 503)}


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def error_record(e: BaseException) -> dict[str, Any]:
    p = api.problem_for(e) if isinstance(e, SandfleetError | Problem) else None
    if p is None:
        log.error("command failed inside the service: %s: %s", type(e).__name__, e, exc_info=e)
        p = Problem(500, "internal", f"{type(e).__name__}: {e}")
    return {"type": "error", "status": p.status_code, **p.body()}


def exit_record(res: ExecResult, streamed: bool) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "type": "exit", "exit_code": res.exit_code, "timed_out": res.timed_out, "signal": res.signal,
        "duration_s": res.duration_s, "stdout_dropped": res.stdout_dropped, "stderr_dropped": res.stderr_dropped,
    }  # fmt: skip
    if not streamed:  # stdout as bytes (an archive, say), stderr as the text ExecResult has
        rec["stdout_b64"] = base64.b64encode(res.stdout_bytes).decode()
        rec["stderr"] = res.stderr
    return rec


async def command_lines(run: Callable[[OutputCallback | None], Coroutine[Any, Any, ExecResult]], stream: bool,
                        metrics: Metrics) -> AsyncIterator[bytes]:
    """Run a command in a task; yield its NDJSON records. Closed early (the client went
    away), it cancels the task, and the agent client kills the command."""
    q: asyncio.Queue[bytes | None] = asyncio.Queue()

    def on_output(name: str, data: bytes) -> None:
        q.put_nowait(_line(api.chunk_record(name, data)))

    t0 = time.perf_counter()
    task = asyncio.create_task(run(on_output if stream else None))
    task.add_done_callback(lambda _: q.put_nowait(None))
    try:
        done = False
        while not done:
            item = await q.get()
            batch = []
            while item is not None:
                batch.append(item)
                if q.empty():
                    break
                item = q.get_nowait()
            done = item is None
            if batch:
                yield b"".join(batch)
        try:
            res = task.result()
        except Exception as e:
            yield _line(error_record(e))
        else:
            metrics.exec_seconds.observe(time.perf_counter() - t0)
            yield _line(exit_record(res, stream))
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        elif not task.cancelled():
            task.exception()  # retrieved (it was reported, or nobody is left to tell)


async def buffered_command(receive: Receive, run: Callable[[OutputCallback | None], Coroutine[Any, Any, ExecResult]],
                           metrics: Metrics) -> Response:
    """Run a command whose output is not streamed and answer its one record. The client
    hanging up (``http.disconnect`` from ``receive``) cancels it: the agent client kills
    the command."""
    t0 = time.perf_counter()
    task = asyncio.create_task(run(None))
    gone = asyncio.create_task(_disconnect(receive))
    stopped = False
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        # the service is stopping and the drain grace is over: kill the command and say so
        # (an exception here would reach the client as a bare 500)
        stopped = True
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if stopped:
        return Response(_line({"type": "error", "status": 410, "code": "sandbox_lost",
                               "message": "the service stopped: the command was killed after the drain grace"}),
                        media_type=NDJSON_TYPE)
    if task.cancelled():
        return Response(status_code=499)  # nobody is left to read it
    try:
        res = task.result()
    except Exception as e:
        line = _line(error_record(e))
    else:
        metrics.exec_seconds.observe(time.perf_counter() - t0)
        line = _line(exit_record(res, False))
    return Response(line, media_type=NDJSON_TYPE)


def exec_runner(e: Entry, body: api.ExecRequest) -> Callable[[OutputCallback | None], Coroutine[Any, Any, ExecResult]]:
    """The command of an exec request, checked (a Problem names what is wrong), ready to run."""
    stdin = _b64(body.stdin_b64, "stdin_b64")
    check_argv(body.cmd)
    check_env(body.env)
    if body.cwd is not None and "\x00" in body.cwd:
        raise Problem(400, "bad_path", "cwd holds a NUL byte")

    def run(on_output: OutputCallback | None) -> Coroutine[Any, Any, ExecResult]:
        return e.sb.exec(body.cmd, cwd=body.cwd, env=body.env, stdin=stdin, timeout=body.timeout,
                         max_output=body.max_output, on_output=on_output, user=body.user,
                         network=body.network, pid_namespace=body.pid_namespace)

    return run


class FastExec:
    """Pure ASGI: a well-formed, authorised, non-streamed ``POST /v1/sandboxes/{sid}/exec``
    (the hot path of a rollout) is answered here, without FastAPI's layers (routing,
    dependencies, exception middleware: about a third of the service's time per exec).
    Everything else, and every request this path would refuse (bad token, a body FastAPI
    would not parse as this, a streamed command), goes to the FastAPI app with its body
    replayed: refusals, the schema and /openapi.json stay FastAPI's. What it does answer is
    what the FastAPI route answers: the same checks, admission, record and disconnect kill."""

    PREFIX = "/v1/sandboxes/"
    SUFFIX = "/exec"

    def __init__(self, app: Any, service: SandboxService, tokens: Tokens, metrics: Metrics):
        self.app = app
        self.service = service
        self.tokens = tokens
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (scope["type"] != "http" or scope["method"] != "POST" or not path.startswith(self.PREFIX)
                or not path.endswith(self.SUFFIX)):
            await self.app(scope, receive, send)
            return
        sid = path[len(self.PREFIX):-len(self.SUFFIX)]
        auth = deadline = ctype = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = auth if auth is not None else value
            elif name == b"x-deadline-ms":
                deadline = deadline if deadline is not None else value
            elif name == b"content-type":
                ctype = ctype if ctype is not None else value
        chunks = []
        try:
            while True:
                msg = await receive()
                if msg["type"] != "http.request":  # gone before the body was in
                    return
                chunks.append(msg.get("body", b""))
                if not msg.get("more_body", False):
                    break
        except Problem as p:  # over the body cap (Edge)
            await _problem_response(p)(scope, receive, send)
            return
        data = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        owner = self.tokens.owner(auth.decode("latin-1")) if auth is not None else None
        body = None
        if owner is not None and ctype == b"application/json" and sid and "/" not in sid:
            try:
                body = api.ExecRequest.model_validate_json(data)
            except ValueError:
                body = None
        if owner is None or body is None or body.stream:
            await self.app(scope, replay, send)
            return
        try:
            e = self.service.entry(owner, sid)
            run = exec_runner(e, body)
            async with self.service.busy(owner, deadline.decode("latin-1") if deadline is not None else None, e):
                resp = await buffered_command(receive, run, self.metrics)
        except Problem as p:
            resp = _problem_response(p)
        except SandfleetError as err:
            prob = api.problem_for(err)
            if prob is None:
                raise
            resp = _problem_response(prob)
        except Exception as err:  # as FastAPI's handler of last resort (_bug) answers
            log.error("POST %s failed: %s: %s", path, type(err).__name__, err, exc_info=err)
            resp = _problem_response(Problem(500, "internal", f"{type(err).__name__}: {err}"))
        await resp(scope, receive, send)


async def _disconnect(receive: Receive) -> None:
    """Return when the client hangs up (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class NDJSONResponse(StreamingResponse):
    """A streamed command; ``cleanup`` (the busy slot) runs however the response ends,
    even when the client left before the first byte and the body was never started."""

    def __init__(self, body: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[Any]]):
        super().__init__(body, media_type=NDJSON_TYPE)
        self._body = body
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                aclose = getattr(self._body, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                await self._cleanup()


class Edge:
    """Pure ASGI middleware: counts bytes in and out and answers by status class, caps
    request bodies (413), and refuses new work while draining (503)."""

    def __init__(self, app: Any, service: SandboxService, metrics: Metrics):
        self.app = app
        self.service = service
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap = self.service.config.max_body_bytes
        got = 0
        status = 0

        async def counted_receive() -> Message:
            nonlocal got
            msg = await receive()
            if msg["type"] == "http.request":
                n = len(msg.get("body", b""))
                got += n
                self.metrics.bytes_in.inc(n)
                if got > cap:
                    raise Problem(413, "too_large", f"the request body is over this service's cap of {cap} bytes")
            return msg

        async def counted_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            elif msg["type"] == "http.response.body":
                self.metrics.bytes_out.inc(len(msg.get("body", b"")))
            await send(msg)

        length = dict(scope.get("headers") or []).get(b"content-length")
        too_big = length is not None and length.isdigit() and int(length) > cap
        draining = self.service.draining and scope["path"].startswith("/v1/")
        try:
            if too_big or draining:
                p = (Problem(413, "too_large", f"the request body is over this service's cap of {cap} bytes")
                     if too_big else Problem(503, "draining", "the service is shutting down; no new work is taken"))
                await _problem_response(p)(scope, receive, counted_send)
            else:
                await self.app(scope, counted_receive, counted_send)
        finally:
            self.metrics.requests.labels(f"{status // 100}xx" if status else "none").inc()


_bearer = HTTPBearer(auto_error=False, description="A token from the service's --token-file.")


async def _auth(request: Request, _: Annotated[Any, Depends(_bearer)]) -> str:
    """The owner id of the request's bearer token; 401 without a valid one."""
    tokens: Tokens = request.app.state.tokens
    oid = tokens.owner(request.headers.get("authorization"))
    if oid is None:
        raise Problem(401, "unauthorized", "a valid Authorization: Bearer <token> header is needed",
                      headers={"WWW-Authenticate": "Bearer"})
    return oid


Owner = Annotated[str, Depends(_auth)]
Deadline = Annotated[str | None, Header(alias="X-Deadline-Ms",
                                        description="How long to wait for admission, ms (default: --deadline).")]
Labels = Annotated[list[str] | None, Query(alias="label", description="key=value; repeatable; all must match.")]
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


def _problem_response(p: Problem) -> JSONResponse:
    return JSONResponse(p.body(), status_code=p.status_code, headers=p.headers)


def create_app(service: SandboxService, tokens: Tokens, metrics: Metrics, *,
               on_ready: Callable[[], None] | None = None) -> Any:
    from sandfleet import __version__

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await service.close()

    app = FastAPI(title="sandfleet", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  redirect_slashes=False,
                  description="Sandboxes on a CPU host for agentic RL rollouts (docs/service.md)")
    app.state.tokens = tokens

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        if isinstance(e, Problem):
            return _problem_response(e)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid_request")
        return _problem_response(Problem(e.status_code, code, str(e.detail),
                                         headers=dict(e.headers) if e.headers else None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        parts = []
        for err in e.errors()[:3]:
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            if err.get("type") == "json_invalid":
                parts.append(f"malformed JSON body ({err.get('ctx', {}).get('error', 'decode error')})")
            else:
                parts.append(f"{loc}: {err.get('msg')}" if loc else str(err.get("msg")))
        return _problem_response(Problem(400, "invalid_request", "; ".join(parts) or "invalid request"))

    @app.exception_handler(SandfleetError)
    async def _sandfleet(request: Request, e: SandfleetError) -> JSONResponse:
        p = api.problem_for(e)
        if p is None:
            raise e
        return _problem_response(p)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, type(e).__name__, e, exc_info=e)
        return _problem_response(Problem(500, "internal", f"{type(e).__name__}: {e}"))

    @app.get("/healthz", tags=["service"])
    async def healthz() -> api.Health:
        return api.Health(ok=not service.draining, draining=service.draining)

    @app.get("/metrics", include_in_schema=False)
    async def metrics_route(owner: Owner) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/info", tags=["service"], responses=ERRORS)
    async def info(owner: Owner) -> api.ServiceInfo:
        return api.ServiceInfo(
            version=__version__, backend=service.backend, max_sandboxes=service.limits.max_sandboxes,
            max_busy=service.limits.max_busy, quota=service.quota, max_ttl_s=service.config.max_ttl_s,
            max_body_bytes=service.config.max_body_bytes, limits_basis=service.limits.basis,
            sandboxes=len(service.live), busy=service.busy_gate.in_use, draining=service.draining)

    # -- sandboxes

    @app.post("/v1/sandboxes", status_code=201, tags=["sandboxes"], responses=ERRORS)
    async def create(spec: api.SandboxSpec, owner: Owner, deadline: Deadline = None,
                     key: IdempotencyKey = None) -> api.SandboxInfo:
        """Create a sandbox. ``limits.ttl_s`` is its lifetime (the service closes it then),
        ``limits.network`` its network. A retry with the same ``Idempotency-Key`` gets the
        same sandbox."""
        e = await service.create(owner, spec, key=key, deadline_ms=deadline)
        return e.info()

    @app.get("/v1/sandboxes", tags=["sandboxes"], responses=ERRORS)
    async def list_(owner: Owner, label: Labels = None) -> api.SandboxList:
        return api.SandboxList(sandboxes=[e.info() for e in service.find(owner, parse_labels(label or []))])

    @app.delete("/v1/sandboxes", tags=["sandboxes"], responses=ERRORS)
    async def delete_where(owner: Owner, label: Labels = None,
                           all_: Annotated[bool, Query(alias="all")] = False) -> api.Deleted:
        """Delete every sandbox of this token whose labels match (``all=true``: every one)."""
        labels = parse_labels(label or [])
        if not labels and not all_:
            raise Problem(400, "invalid_request", "name labels to match (label=key=value), or pass all=true")
        return api.Deleted(deleted=await service.delete_where(owner, labels))

    @app.get("/v1/sandboxes/{sid}", tags=["sandboxes"], responses=ERRORS)
    async def get(sid: str, owner: Owner) -> api.SandboxInfo:
        return service.entry(owner, sid).info()

    @app.delete("/v1/sandboxes/{sid}", status_code=204, tags=["sandboxes"], responses=ERRORS)
    async def delete(sid: str, owner: Owner) -> Response:
        await service.delete(owner, sid)
        return Response(status_code=204)

    @app.post("/v1/sandboxes/{sid}/ttl", tags=["sandboxes"], responses=ERRORS)
    async def extend(sid: str, body: api.TTLRequest, owner: Owner) -> api.SandboxInfo:
        """Set the sandbox's remaining lifetime to ``ttl_s`` from now."""
        return service.extend(owner, sid, body.ttl_s).info()

    # -- commands

    async def _streamed(e: Entry, owner: str, deadline: str | None, stream: bool,
                        run: Callable[[OutputCallback | None], Coroutine[Any, Any, ExecResult]],
                        request: Request) -> Response:
        if not stream:  # one record: a plain response, fewer writes than a stream
            async with service.busy(owner, deadline, e):
                return await buffered_command(request.receive, run, metrics)
        stack = AsyncExitStack()
        await stack.enter_async_context(service.busy(owner, deadline, e))
        try:
            return NDJSONResponse(command_lines(run, stream, metrics), stack.aclose)
        except BaseException:
            await stack.aclose()
            raise

    @app.post("/v1/sandboxes/{sid}/exec", tags=["commands"], responses={
        **ERRORS, 200: {"content": {NDJSON_TYPE: {}}, "description": "NDJSON records, the last one exit or error"}})
    async def exec_(sid: str, body: api.ExecRequest, request: Request, owner: Owner,
                    deadline: Deadline = None) -> Response:
        """Run a command; the answer streams NDJSON (see ExecRequest)."""
        e = service.entry(owner, sid)
        return await _streamed(e, owner, deadline, body.stream, exec_runner(e, body), request)

    @app.post("/v1/sandboxes/{sid}/kill", status_code=204, tags=["commands"], responses=ERRORS)
    async def kill(sid: str, body: api.KillRequest, owner: Owner) -> Response:
        """Kill every process of ``user`` in the sandbox; returns once they are gone."""
        await service.entry(owner, sid).sb.kill_user(body.user)
        return Response(status_code=204)

    @app.post("/v1/sandboxes/{sid}/sessions", status_code=201, tags=["sessions"], responses=ERRORS)
    async def open_session(sid: str, body: api.SessionRequest, owner: Owner) -> api.SessionInfo:
        """A persistent shell: cwd, exported and shell variables survive between its commands."""
        e = service.entry(owner, sid)
        check_env(body.env)
        return api.SessionInfo(id=service.open_session(e, cwd=body.cwd, env=body.env, user=body.user))

    @app.post("/v1/sandboxes/{sid}/sessions/{session}/run", tags=["sessions"], responses={
        **ERRORS, 200: {"content": {NDJSON_TYPE: {}}, "description": "NDJSON records, as exec"}})
    async def run_in_session(sid: str, session: str, body: api.SessionRun, request: Request, owner: Owner,
                             deadline: Deadline = None) -> Response:
        e = service.entry(owner, sid)
        s = service.session(e, session)
        check_argv(body.command)

        def run(on_output: OutputCallback | None) -> Coroutine[Any, Any, ExecResult]:
            return s.run(body.command, timeout=body.timeout, max_output=body.max_output, on_output=on_output)

        return await _streamed(e, owner, deadline, body.stream, run, request)

    @app.delete("/v1/sandboxes/{sid}/sessions/{session}", status_code=204, tags=["sessions"], responses=ERRORS)
    async def close_session(sid: str, session: str, owner: Owner) -> Response:
        e = service.entry(owner, sid)
        s = service.session(e, session)
        del e.sessions[session]
        await s.close()
        return Response(status_code=204)

    # -- files

    @app.get("/v1/sandboxes/{sid}/files", tags=["files"], responses={
        **ERRORS, 200: {"content": {"application/octet-stream": {}}, "description": "the file's bytes"}})
    async def read_file(sid: str, path: str, owner: Owner, user: str | None = None,
                        max_bytes: Annotated[int | None, Query(ge=0, le=256 << 20)] = None,
                        nofollow: bool = False) -> Response:
        """A regular file's bytes, read as ``user``."""
        e = service.entry(owner, sid)
        data = await e.sb.read_file(path, user=user, max_bytes=max_bytes, nofollow=nofollow)
        return Response(data, media_type="application/octet-stream")

    @app.put("/v1/sandboxes/{sid}/files", status_code=204, tags=["files"], responses=ERRORS,
             openapi_extra=BINARY_BODY)
    async def write_file(sid: str, path: str, request: Request, owner: Owner, user: str | None = None,
                         mode: Annotated[int, Query(ge=0, le=0o7777)] = 0o644) -> Response:
        """Write the body to a regular file, as ``user`` (who owns it if it is new)."""
        e = service.entry(owner, sid)
        data = await request.body()
        await e.sb.write_file(path, data, mode=mode, user=user)
        return Response(status_code=204)

    @app.put("/v1/sandboxes/{sid}/archive", status_code=204, tags=["files"], responses=ERRORS,
             openapi_extra=TAR_BODY)
    async def upload(sid: str, path: str, request: Request, owner: Owner, user: str | None = None,
                     deadline: Deadline = None) -> Response:
        """Unpack a tar stream (uncompressed) into directory ``path`` (created if missing), as
        ``user``. Members that are absolute, climb out with ``..``, link outside, or are
        devices are refused before anything is written."""
        e = service.entry(owner, sid)
        data = await request.body()
        dest = _sandbox_dir(e, path)
        check_tar(data)
        async with service.busy(owner, deadline, e):
            res = await e.sb.exec(["sh", "-c", 'mkdir -p "$1" && tar -x --no-same-owner -C "$1"', "sh", dest],
                                  stdin=data, cwd="/", user=user)
        if res.exit_code != 0:
            raise Problem(400, "bad_path", f"upload to {dest} failed: {res.stderr.strip()}")
        return Response(status_code=204)

    @app.get("/v1/sandboxes/{sid}/archive", tags=["files"], responses={
        **ERRORS, 200: {"content": {"application/x-tar": {}}, "description": "a tar stream of path"}})
    async def download(sid: str, path: str, owner: Owner,
                       max_bytes: Annotated[int, Query(ge=0, le=1 << 30)] = 256 << 20,
                       deadline: Deadline = None) -> Response:
        """A tar stream of file or directory ``path``; 413 when it would be over ``max_bytes``."""
        e = service.entry(owner, sid)
        src = _sandbox_dir(e, path)
        parent, name = posixpath.split(src.rstrip("/") or "/")
        async with service.busy(owner, deadline, e):
            res = await e.sb.exec(["tar", "-c", "-C", parent or "/", name or "."], max_output=max_bytes + 1, cwd="/")
        if res.exit_code != 0:
            raise Problem(400, "bad_path", f"download of {src} failed: {res.stderr.strip()}")
        if res.truncated or len(res.stdout_bytes) > max_bytes:
            raise Problem(413, "too_large", f"download of {src} refused: its archive is larger than {max_bytes} bytes")
        return Response(res.stdout_bytes, media_type="application/x-tar")

    # -- snapshots

    @app.post("/v1/sandboxes/{sid}/snapshot", status_code=201, tags=["snapshots"], responses=ERRORS)
    async def snapshot(sid: str, owner: Owner) -> api.SnapshotInfo:
        """Save the sandbox's filesystem (and memory where the backend can) to fork from."""
        snap_id, s = await service.snapshot(owner, sid)
        return api.SnapshotInfo(id=snap_id, backend=s.snap.backend, sandbox=s.sandbox)

    @app.get("/v1/snapshots", tags=["snapshots"], responses=ERRORS)
    async def list_snapshots(owner: Owner) -> list[api.SnapshotInfo]:
        return [api.SnapshotInfo(id=k, backend=s.snap.backend, sandbox=s.sandbox)
                for k, s in service.snapshots.items() if s.owner == owner]

    @app.post("/v1/snapshots/{snap}/fork", status_code=201, tags=["snapshots"], responses=ERRORS)
    async def fork_(snap: str, body: api.ForkRequest, owner: Owner, deadline: Deadline = None) -> api.SandboxList:
        """``n`` new sandboxes, each starting from the snapshot's state."""
        kids = await service.fork(owner, snap, body.n, ttl_s=body.ttl_s, labels=body.labels, deadline_ms=deadline)
        return api.SandboxList(sandboxes=[k.info() for k in kids])

    @app.delete("/v1/snapshots/{snap}", status_code=204, tags=["snapshots"], responses=ERRORS)
    async def delete_snapshot(snap: str, owner: Owner) -> Response:
        service.delete_snapshot(owner, snap)
        return Response(status_code=204)

    from sandfleet.server import e2b, sandboxfusion, swerex, taskimages

    taskimages.install(app, service, metrics)  # task images built here from uploaded folders

    dialect = e2b.install(app, service, tokens)  # the E2B SDK's routes, outside /openapi.json
    swerex.install(app, service, tokens)  # swerex-remote under /swerex/<sandbox-id>/
    sandboxfusion.install(app, service, tokens, metrics, service.config.fusion_image)  # /sandbox-fusion/<token>/
    from sandfleet.server.e2b_ports import PortProxy

    return Edge(FastExec(PortProxy(app, dialect), service, tokens, metrics), service, metrics)


def _b64(text: str | None, name: str) -> bytes | None:
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise Problem(400, "invalid_request", f"{name} is not valid base64") from None


def _sandbox_dir(e: Entry, path: str) -> str:
    sb = e.sb
    return sb._path(path) if isinstance(sb, AgentSandbox) else sandbox_path(path, sb.spec.workdir)


def check_tar(data: bytes) -> None:
    """Refuse an archive whose members would land outside the directory it is unpacked in."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for m in tar:
                try:
                    tarfile.data_filter(m, "/.sandfleet-upload")
                except tarfile.FilterError as err:
                    raise Problem(400, "bad_path", f"upload refused: {err}") from None
    except (tarfile.TarError, EOFError) as err:
        raise Problem(400, "invalid_request", f"the body is not an uncompressed tar archive: {err}") from None

