"""The ``e2b-code-interpreter`` SDK's port 49999 on sandfleet: ``run_code`` and code contexts,
served by a :class:`~sandfleet.interpreter.Kernel` (no Jupyter) in each sandbox.

The SDK sends these to ``E2B_SANDBOX_URL`` (the service) with ``E2b-Sandbox-Id`` and
``E2b-Sandbox-Port: 49999``: ``POST /execute`` (``{"code", "context_id", "language",
"env_vars"}``, answered with NDJSON lines ``stdout`` / ``stderr`` (``text``, ``timestamp`` in
ns), ``result``, ``error`` (``name``, ``value``, ``traceback``), ``number_of_executions``
and ``end_of_execution``), ``POST /contexts`` (``{"language"?, "cwd"?}`` -> ``{"id",
"language", "cwd"}``), ``GET /contexts``, ``POST /contexts/{id}/restart`` and ``DELETE
/contexts/{id}``. ``/execute`` carries ``X-Access-Token``, the context calls only
``E2B-Traffic-Access-Token``: either of the sandbox's tokens is accepted.

Errors as the SDK maps them: 404 (an unknown context) is NotFoundException, 502 "... was
not found" (an unknown or dead sandbox) TimeoutException, others SandboxException. Python and
bash (a long-lived bash per context, as Jupyter's bash kernel: a failed cell's error has no
name and its exit status as value) are the languages; the others the SDK sends
(``javascript``, ``typescript``, ``r``, ``java``) are 400 with what to use instead
(:func:`unsupported`). The kernel starts on a
sandbox's first cell, under one busy slot (``--max-busy``) as a process's start is; cells
then run in the sandbox's cgroup like any process, one at a time per sandbox, and a client
that hangs up interrupts its cell.
"""

from __future__ import annotations

import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from sandfleet.interpreter import Kernel, KernelError
from sandfleet.server.dialects.e2b.state import Boxes
from sandfleet.server.dialects.e2b.wire import CPError, NotFound, cp_error, route
from sandfleet.server.kernels import DEFAULT_BASH, Kernels

if TYPE_CHECKING:
    from sandfleet.server.service import Entry

PORT = 49999
TEMPLATES = ("code-interpreter-v1",)
"""Template names that mean "base, with the code interpreter" (the SDK's default template)."""
LANGUAGES = ("python", "python3", "bash")
DEFAULT = "default"


def _language(language: str) -> str:
    return "bash" if language.lower() == "bash" else "python"


class CodeInterpreter:
    def __init__(self, e2b: Boxes, kernels: Kernels):
        self.e2b = e2b
        self.kernels = kernels
        self.contexts: dict[str, dict[str, dict[str, str]]] = {}
        """Per sandbox: the contexts made by ``POST /contexts``, by id."""

    def sandbox(self, request: Request) -> Entry:
        sid = self.e2b.real(request.headers.get("e2b-sandbox-id") or "")
        e = self.e2b.service.live.get(sid)
        b = self.e2b.boxes.get(sid)
        if e is None or b is None or not e.sb.alive:
            raise NotFound(sid)
        toks = [t.encode() for t in (request.headers.get("x-access-token"),
                                     request.headers.get("e2b-traffic-access-token")) if t]
        if not any(hmac.compare_digest(t, want.encode()) for t in toks for want in (b.token, b.traffic_token)):
            raise CPError(401, "the sandbox's X-Access-Token or E2B-Traffic-Access-Token is needed")
        return e

    def kernel(self, e: Entry) -> Kernel:
        for gone in [sid for sid in self.contexts if sid not in self.e2b.service.live]:
            del self.contexts[gone]
        return self.kernels.get(e)

    def context(self, e: Entry, cid: str) -> dict[str, str]:
        ctx = self.contexts.get(e.sb.id, {}).get(cid)
        if ctx is None:
            raise CPError(404, f"Context {cid} not found")
        return ctx

    async def execute(self, request: Request) -> Response:
        e = self.sandbox(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            raise CPError(400, "the body is not JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("code"), str):
            raise CPError(400, "a body {\"code\": ...} is needed")
        cid, language = body.get("context_id"), body.get("language")
        if cid and language:
            raise CPError(400, "context_id and language are exclusive")
        if language and str(language).lower() not in LANGUAGES:
            raise CPError(400, unsupported(str(language)))
        env = body.get("env_vars") or {}
        if not isinstance(env, dict):
            raise CPError(400, "env_vars is an object of names to values")
        # the default contexts start where the kernel does (the sandbox's workdir, as the backend maps it)
        ctx: dict[str, str | None] = dict(self.context(e, str(cid))) if cid else (
            {"id": DEFAULT_BASH, "cwd": None, "language": "bash"} if language and _language(str(language)) == "bash"
            else {"id": DEFAULT, "cwd": None})
        k = self.kernel(e)
        try:
            release = await self.e2b.service.admit_start(e.owner, None, e)
        except Exception as err:
            raise cp_error(err) from None
        try:
            await k.start()
        except KernelError as err:
            raise CPError(500, f"the code interpreter could not start in sandbox {e.sb.id}: {err}") from None
        finally:
            release()  # the kernel runs: from here on its sandbox's cgroup bounds it, not a slot

        async def lines() -> AsyncIterator[bytes]:
            async for ev in k.events(body["code"], context=str(ctx["id"]), cwd=ctx["cwd"],
                                     env={str(a): str(b) for a, b in env.items()},
                                     language=str(ctx.get("language") or "python")):
                kind = ev.pop("type", None)
                ev.pop("id", None)
                if kind == "end":
                    if ev.get("execution_count") is not None:
                        yield _line({"type": "number_of_executions", "execution_count": ev["execution_count"]})
                    yield _line({"type": "end_of_execution"})
                    return
                if kind in ("stdout", "stderr"):
                    ev.setdefault("timestamp", time.time_ns())
                yield _line({"type": kind, **ev})

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def create_context(self, request: Request) -> dict[str, str]:
        e = self.sandbox(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            raise CPError(400, "the body is not JSON") from None
        language = str((body or {}).get("language") or "python")
        if language.lower() not in LANGUAGES:
            raise CPError(400, unsupported(language))
        ctx = {"id": str(uuid.uuid4()), "language": _language(language),
               "cwd": str(body.get("cwd") or e.spec.workdir or "/")}
        self.contexts.setdefault(e.sb.id, {})[ctx["id"]] = ctx
        return ctx

    async def list_contexts(self, request: Request) -> list[dict[str, str]]:
        e = self.sandbox(request)
        return list(self.contexts.get(e.sb.id, {}).values())

    async def restart_context(self, request: Request) -> Response:
        e = self.sandbox(request)
        cid = request.path_params["cid"]
        if cid != DEFAULT:
            self.context(e, cid)
        await self.kernel(e).reset(cid)
        return Response(status_code=204)

    async def remove_context(self, request: Request) -> Response:
        e = self.sandbox(request)
        cid = request.path_params["cid"]
        self.context(e, cid)
        self.contexts[e.sb.id].pop(cid, None)
        await self.kernel(e).drop(cid)
        return Response(status_code=204)


def unsupported(language: str) -> str:
    """Why ``language`` is refused (run_code's ``language``, create_code_context's), and what to
    use instead: the e2b SDK also sends ``javascript``, ``typescript``, ``r``, ``java``."""
    return (f"language {language!r} is not supported by sandfleet's code interpreter, which runs python and "
            f"bash: run {language} programs with sbx.commands.run(...) in a sandbox whose template has the "
            "language's tools (a template is a sandfleet image name: sandfleet image build)")


def _line(msg: dict[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def install(app: FastAPI, e2b: Boxes, kernels: Kernels) -> CodeInterpreter:
    """Add the code interpreter's routes to ``app`` (none of them in the schema)."""
    ci = CodeInterpreter(e2b, kernels)

    app.add_api_route("/execute", route(ci.execute), methods=["POST"], include_in_schema=False)
    app.add_api_route("/contexts", route(ci.create_context), methods=["POST"], include_in_schema=False)
    app.add_api_route("/contexts", route(ci.list_contexts), methods=["GET"], include_in_schema=False)
    app.add_api_route("/contexts/{cid}/restart", route(ci.restart_context), methods=["POST"], include_in_schema=False)
    app.add_api_route("/contexts/{cid}", route(ci.remove_context), methods=["DELETE"], include_in_schema=False)
    return ci
