"""The pure ASGI layers around the FastAPI app: :class:`Edge` (byte counts, the body cap,
draining) outermost, then :class:`FastExec`, the rollout hot path answered without
FastAPI's layers."""

from __future__ import annotations

import logging
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from sandfleet.client import models
from sandfleet.errors import SandfleetError
from sandfleet.server.auth import Tokens
from sandfleet.server.commands import buffered_command, exec_runner
from sandfleet.server.metrics import Metrics
from sandfleet.server.service import SandboxService
from sandfleet.server.wire import Problem, problem_for, problem_response

log = logging.getLogger(__name__)


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
            await problem_response(p)(scope, receive, send)
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
                body = models.ExecRequest.model_validate_json(data)
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
            resp = problem_response(p)
        except SandfleetError as err:
            prob = problem_for(err)
            if prob is None:
                raise
            resp = problem_response(prob)
        except Exception as err:  # as FastAPI's handler of last resort (_bug) answers
            log.error("POST %s failed: %s: %s", path, type(err).__name__, err, exc_info=err)
            resp = problem_response(Problem(500, "internal", f"{type(err).__name__}: {err}"))
        await resp(scope, receive, send)


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
                await problem_response(p)(scope, receive, counted_send)
            else:
                await self.app(scope, counted_receive, counted_send)
        finally:
            self.metrics.requests.labels(f"{status // 100}xx" if status else "none").inc()
