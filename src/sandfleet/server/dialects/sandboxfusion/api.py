"""SandboxFusion's HTTP API (what verl and the ``sandbox-fusion`` client call), under
``/sandbox-fusion/<token>/``.

The unchanged clients send no headers, so the service token travels in the path: the
``sandbox-fusion`` client's endpoint is ``<service>/sandbox-fusion/<token>`` and verl's
``sandbox_fusion_url`` is ``<service>/sandbox-fusion/<token>/run_code``. Nothing there answers
without a valid token (401), and the token is never logged: the access log line shows
``/sandbox-fusion/***/run_code`` and errors are logged without the path.

``POST run_code`` runs ``code`` in a fresh sandbox of the service's ``--fusion-image`` (limits as
every other sandbox: seccomp, cgroups, no network), then closes it. ``language`` is
``python`` (python3), ``bash`` or ``cpp`` (``g++ -std=c++17 -O2``, when the image has g++);
anything else is a 400 naming the three. ``memory_limit_MB`` becomes the sandbox's memory
limit; ``compile_timeout`` and ``run_timeout`` the commands' timeouts; ``files`` (base64) are
written into the working directory first, ``fetch_files`` are read back (base64). Other
fields are accepted and ignored.

The answer is SandboxFusion's ``RunCodeResponse``: ``status`` ``Success`` (every command
exited 0), ``Failed`` (one exited non-zero or ran out of time: the code's fault), or
``SandboxError`` (the sandbox could not be made or was lost: the host's fault; the client
retries it, then raises). ``compile_result`` / ``run_result`` carry ``status`` ``Finished``
(it exited, whatever the code), ``TimeLimitExceeded`` (killed at its timeout, ``return_code``
null) or ``Error`` (it could not start), ``return_code`` (128+N when killed by signal N),
``stdout``, ``stderr`` and ``execution_time`` (seconds). Admission is the service's: a call
waits for a sandbox and a busy slot up to ``--deadline``, then 429. ``run_jupyter`` is
:mod:`.fusion_jupyter` (cells in one stateful Python); the dataset endpoints
(``get_prompts``, ``submit``, ...) answer 501, saying so.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import posixpath
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import Counter
from pydantic import ValidationError

from sandfleet.agent.client import ExecResult
from sandfleet.errors import GuestExecError, SandfleetError, ServiceError
from sandfleet.rollout import fusion_record
from sandfleet.sandbox.base import DEFAULT_MAX_OUTPUT
from sandfleet.sandbox.spec import Limits, SandboxSpec
from sandfleet.server.auth import Tokens
from sandfleet.server.dialects.sandboxfusion.models import RunCode, RunJupyter, problem
from sandfleet.server.metrics import Metrics
from sandfleet.server.service import Entry, SandboxService
from sandfleet.server.wire import Problem, problem_for

log = logging.getLogger(__name__)
PREFIX = "/sandbox-fusion/"
WORKDIR = "/work"
LANGUAGES = ("python", "bash", "cpp")
NOT_SERVED = ("get_prompts", "get_prompt_by_id", "submit", "get_metrics", "get_metrics_function",
              "list_datasets", "list_ids")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MIB = 1024
GRACE_S = 60.0
"""The sandbox's TTL past compile_timeout + run_timeout (it is closed when the call ends)."""


class FusionError(Exception):
    """An HTTP error answer, SandboxFusion style: ``{"detail": message}``."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


@dataclass
class Program:
    """What one language needs: the file the code goes in, a compile step, the run argv."""
    source: str
    run: list[str]
    compile: list[str] | None = None
    files: dict[str, bytes] = field(default_factory=dict)


def program(language: str) -> Program:
    if language == "python":
        return Program("main.py", ["python3", "main.py"])
    if language == "bash":
        return Program("main.sh", ["bash", "main.sh"])
    if language == "cpp":
        return Program("main.cpp", ["./main"], compile=["g++", "-std=c++17", "-O2", "-o", "main", "main.cpp"])
    raise FusionError(400, f"language {language!r} is not supported by sandfleet's SandboxFusion dialect "
                           f"(it runs {', '.join(LANGUAGES)})")


def _number(key: str, v: float | None, default: float, *, low: float, high: float) -> float:
    if v is None:
        return default
    if not low <= v <= high:
        raise FusionError(400, f"{key} must be a number from {low:g} to {high:g}, not {v!r}")
    return float(v)


def _files(req: RunCode | RunJupyter) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for path, b64 in (req.files or {}).items():
        if b64 is None:
            continue
        try:
            out[_path(path)] = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise FusionError(400, f"files[{path!r}] is not valid base64") from None
    return out


def _path(p: str) -> str:
    if not p or "\x00" in p:
        raise FusionError(400, f"file path {p!r} is empty or holds a NUL byte")
    return posixpath.normpath(posixpath.join(WORKDIR, p))


def command_result(res: ExecResult) -> dict[str, Any]:
    return {"status": "TimeLimitExceeded" if res.timed_out else "Finished",
            "execution_time": round(res.duration_s, 6), "cpu_time": None,
            "return_code": None if res.timed_out else res.exit_code, "stdout": res.stdout, "stderr": res.stderr}


def truncated(res: ExecResult, cap: int, stage: str) -> str:
    """The message of a run whose output was over the cap (its status is Failed)."""
    return (f"{stage} output truncated: {res.stdout_dropped + res.stderr_dropped} bytes over the {cap}-byte "
            "limit were not returned (sandfleet serve --max-output)")


def not_started(e: GuestExecError) -> dict[str, Any]:
    return {"status": "Error", "execution_time": 0.0, "cpu_time": None, "return_code": None, "stdout": "",
            "stderr": str(e)}


class SandboxFusion:
    def __init__(self, service: SandboxService, tokens: Tokens, metrics: Metrics, image: str):
        self.service = service
        self.tokens = tokens
        self.image = image
        self.runs = Counter("sandfleet_sandbox_fusion_runs", "SandboxFusion run_code calls answered, by "
                            "language and status (Success, Failed, SandboxError, or the HTTP error code).",
                            ["language", "status"], registry=metrics.registry)
        self.exec_seconds = metrics.exec_seconds
        self.recorder = fusion_record.Recorder.from_env()
        """With $SANDFLEET_RECORD_DIR: each call's record (rollout/fusion_record.py, docs/replay.md)."""

    def owner(self, request: Request) -> str:
        token = request.path_params.get("token") or ""
        oid = self.tokens.owner(f"Bearer {token}") if token else None
        if oid is None:
            raise FusionError(401, "the path must be /sandbox-fusion/<token>/... with a token of this service")
        return oid

    async def run_code(self, request: Request) -> dict[str, Any]:
        owner = self.owner(request)
        if self.service.draining:
            raise FusionError(503, "the service is shutting down; no new work is taken", {"Retry-After": "1"})
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            raise FusionError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise FusionError(400, "the body is not a JSON object")
        max_t = self.service.config.max_ttl_s
        bounds = {"compile_timeout": (0.001, max_t), "run_timeout": (0.001, max_t), "memory_limit_MB": (16, 16 << 20)}
        try:
            req = RunCode.model_validate(body)
        except ValidationError as err:
            detail = problem(err, RunCode, bounds)
            code, language = body.get("code"), body.get("language")
            if isinstance(code, str) and isinstance(language, str):  # as SandboxFusion: the language first
                request.state.fusion_language = language
                program(language)
            raise FusionError(400, detail) from None
        request.state.fusion_language = req.language
        prog = program(req.language)
        stdin = req.stdin
        compile_t = _number("compile_timeout", req.compile_timeout, DEFAULT_TIMEOUT_S, low=0.001, high=max_t)
        run_t = _number("run_timeout", req.run_timeout, DEFAULT_TIMEOUT_S, low=0.001, high=max_t)
        mem = req.memory_limit_MB
        memory = (DEFAULT_MEMORY_MIB if mem is None or mem <= 0
                  else int(_number("memory_limit_MB", mem, DEFAULT_MEMORY_MIB, low=16, high=16 << 20)))
        prog.files, fetch = _files(req), req.fetch_files or []
        prog.files[_path(prog.source)] = req.code.encode()
        ttl = min(max_t, compile_t + run_t + GRACE_S)
        spec = SandboxSpec(image=self.image, workdir=WORKDIR, labels={"dialect": "sandbox-fusion"},
                           limits=Limits(memory_mib=memory, ttl_s=ttl))
        t0, start = time.perf_counter(), time.time()
        try:
            e = await self.service.create(owner, spec, key=None, deadline_ms=None)
        except SandfleetError as err:
            known = problem_for(err)
            if known is None or known.status_code in (410, 503):
                return sandbox_error(f"the sandbox could not be made: {err}")
            if isinstance(err, ServiceError):  # the service refused it: over a quota, ...
                raise FusionError(known.status_code, known.message, dict(known.headers or {})) from None
            if known.status_code == 400:  # the request's fault: an unknown image, a bad limit
                raise FusionError(400, known.message) from None
            return sandbox_error(f"the sandbox could not be made: {err}")
        out = await self.in_sandbox(request, owner, e, self._run(owner, e, prog, stdin, compile_t, run_t, fetch))
        self.exec_seconds.observe(time.perf_counter() - t0)
        if self.recorder is not None:
            asked = {"language": req.language, "code": req.code, "stdin": stdin, "compile_timeout": compile_t,
                     "run_timeout": run_t, "memory_limit_MB": memory, "files": req.files, "fetch_files": fetch}
            ran = {"source": prog.source, "compile": prog.compile, "run": prog.run, "workdir": WORKDIR}
            self.recorder.write(fusion_record.build(asked, ran, spec, e.sb.backend, out, time.perf_counter() - t0,
                                                    start))  # fmt: skip
        return out

    async def in_sandbox(self, request: Request, owner: str, e: Entry,
                         work: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        """``work``'s answer (the call's commands in sandbox ``e``), unless the client hangs up
        first: then the work is cancelled (its command killed with its sandbox) and the answer
        is 499. The sandbox is deleted either way."""
        run = asyncio.create_task(work)
        gone = asyncio.create_task(_disconnect(request))
        try:
            await asyncio.wait({run, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                raise FusionError(499, "the client went away")
            return run.result()
        finally:
            gone.cancel()
            if not run.done():
                run.cancel()
                await asyncio.wait({run})
            try:
                await self.service.delete(owner, e.sb.id)
            except Exception as err:  # closed already (TTL, lost): the service logged it
                log.debug("sandbox-fusion: closing %s: %s", e.sb.id, err)

    async def _run(self, owner: str, e: Entry, prog: Program, stdin: str | None, compile_t: float, run_t: float,
                   fetch: list[str]) -> dict[str, Any]:
        sb = e.sb
        cap = self.service.config.max_output
        try:
            async with self.service.busy(owner, None, e):
                dirs = sorted({posixpath.dirname(p) for p in prog.files} - {WORKDIR})
                if dirs:
                    await sb.exec(["mkdir", "-p", "--", *dirs], cwd=WORKDIR)
                for path, data in prog.files.items():
                    await sb.write_file(path, data)
                compiled = None
                if prog.compile is not None:
                    try:
                        res = await sb.exec(prog.compile, cwd=WORKDIR, timeout=compile_t, max_output=cap)
                    except GuestExecError as err:
                        raise FusionError(400, f"this service's image {self.image!r} cannot compile this language: "
                                               f"{err}") from None
                    compiled = command_result(res)
                    if res.truncated:
                        return answer("Failed", compiled, None, {}, truncated(res, cap, "compile"))
                    if not res.ok:
                        return answer("Failed", compiled, None, {})
                try:
                    res = await sb.exec(prog.run, cwd=WORKDIR, stdin=(stdin or "").encode(), timeout=run_t,
                                        max_output=cap)
                except GuestExecError as err:
                    if prog.compile is None:
                        raise FusionError(400, f"this service's image {self.image!r} cannot run this language: "
                                               f"{err}") from None
                    return answer("Failed", compiled, not_started(err), {})
                got = {}
                for p in fetch:
                    try:
                        got[p] = base64.b64encode(await sb.read_file(_path(p), max_bytes=DEFAULT_MAX_OUTPUT)).decode()
                    except SandfleetError as err:  # missing or unreadable: left out, as SandboxFusion does
                        log.debug("sandbox-fusion: fetch_files %s: %s", p, err)
                if res.truncated:  # never a silent cut: the run failed, the message says why
                    return answer("Failed", compiled, command_result(res), got, truncated(res, cap, "run"))
                return answer("Success" if res.ok else "Failed", compiled, command_result(res), got)
        except (FusionError, Problem, ServiceError):
            raise
        except SandfleetError as err:
            known = problem_for(err)
            if known is not None and known.status_code in (400, 422):  # a bad path in files: the request's fault
                raise FusionError(400, known.message) from None
            return sandbox_error(f"the sandbox failed during the call: {err}")


async def _disconnect(request: Request) -> None:
    """Return when the client hangs up (the request body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def answer(status: str, compiled: dict[str, Any] | None, ran: dict[str, Any] | None,
           files: dict[str, str], message: str = "") -> dict[str, Any]:
    return {"status": status, "message": message, "compile_result": compiled, "run_result": ran,
            "executor_pod_name": None, "files": files}


def sandbox_error(message: str) -> dict[str, Any]:
    return {"status": "SandboxError", "message": message, "compile_result": None, "run_result": None,
            "executor_pod_name": None, "files": {}}


class RedactToken(logging.Filter):
    """Access-log lines show ``/sandbox-fusion/***/...``, never the token."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(a, str) and PREFIX in a for a in args):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in args)
        elif isinstance(record.msg, str) and PREFIX in record.msg:
            record.msg = redact(record.msg)
        return True


def redact(text: str) -> str:
    out, rest = [], text
    while PREFIX in rest:
        head, _, tail = rest.partition(PREFIX)
        _, slash, after = tail.partition("/")
        out.append(head + PREFIX + "***" + slash)
        rest = after
    return "".join(out) + rest


Endpoint = Callable[["SandboxFusion", Request], Awaitable[dict[str, Any]]]


def install_routes(app: FastAPI, service: SandboxService, tokens: Tokens, metrics: Metrics, image: str = "host",
                   endpoints: dict[str, Endpoint] | None = None) -> None:
    """Add the SandboxFusion routes to ``app`` (none of them in the schema): ``run_code``, and
    ``endpoints`` (name -> handler, answered and counted as run_code is)."""
    fusion = SandboxFusion(service, tokens, metrics, image)
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactToken) for f in logger.filters):
            logger.addFilter(RedactToken())

    def error(err: FusionError) -> JSONResponse:
        return JSONResponse({"detail": err.detail}, status_code=err.status, headers=err.headers)

    def served(fn: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await answer_with(fn, request)
        return route

    async def answer_with(fn: Endpoint, request: Request) -> Response:
        try:
            out = await fn(fusion, request)
        except FusionError as err:
            fusion.runs.labels(_language(request), str(err.status)).inc()
            return error(err)
        except (Problem, ServiceError) as err:  # the body over --max-body-mib (Edge); busy, draining
            p = problem_for(err)
            assert p is not None
            fusion.runs.labels(_language(request), str(p.status_code)).inc()
            return error(FusionError(p.status_code, p.message, dict(p.headers or {})))
        except Exception as err:  # logged without the path: it holds the token
            log.error("sandbox-fusion run_code failed: %s: %s", type(err).__name__, err, exc_info=err)
            fusion.runs.labels(_language(request), "500").inc()
            return JSONResponse({"detail": f"internal error: {type(err).__name__}: {err}"}, status_code=500)
        fusion.runs.labels(_language(request), out["status"]).inc()
        return JSONResponse(out)

    async def other(request: Request) -> Response:
        try:
            fusion.owner(request)
        except FusionError as err:
            return error(err)
        name = request.path_params.get("rest", "")
        if name in NOT_SERVED:
            return error(FusionError(501, f"{name} is not supported by sandfleet: it serves run_code "
                                          f"({', '.join(LANGUAGES)}) and run_jupyter only"))
        return error(FusionError(404, f"no SandboxFusion endpoint {name!r} here; sandfleet serves run_code"))

    for name, fn in {"run_code": SandboxFusion.run_code, **(endpoints or {})}.items():
        app.add_route(PREFIX + "{token}/" + name, served(fn), methods=["POST"], include_in_schema=False)
    app.add_route(PREFIX + "{token}/{rest:path}", other, methods=["GET", "POST", "PUT", "DELETE"],
                  include_in_schema=False)


def _language(request: Request) -> str:
    lang = getattr(request.state, "fusion_language", None)
    return lang if lang in LANGUAGES else "other"
