"""SWE-ReX's ``swerex-remote`` API, per sandbox, under ``/swerex/<sandbox-id>/``.

SWE-ReX's own ``RemoteRuntime`` (and SWE-agent's ``remote`` deployment) drive a sandfleet
sandbox when its ``host`` is ``http://<service>/swerex/<sandbox-id>`` (``port`` unset) and its
``auth_token`` is a service token (sent as ``X-API-Key``). The sandbox is made first (``/v1``,
``sandfleet sandbox create --remote``, or E2B). Commands, sessions and files run as root, as in
SWE-ReX's own containers. Errors are SWE-ReX's: a runtime exception is HTTP 511
``{"swerexception": {"message", "class_path", "traceback", "extra_info"}}``, which the client
raises again as the class it names (``swerex.exceptions.CommandTimeoutError``,
``NonZeroExitCodeError``, ...); auth and unknown sandboxes are 401/404 ``{"detail"}``.

Sessions are sandfleet sessions: each command runs in a fresh bash that loads the state the
last one saved (cwd, variables, functions). ``BashInterruptAction`` sends SIGINT to the
session's running command (SIGKILL if it ignores it for ``n_retry`` x ``timeout``);
``close`` ends the sandbox. Output over ``--swerex-max-output`` (1 MiB) is cut: the output
ends with "[... N more bytes truncated by sandfleet]" and ``failure_reason`` says so.
Interactive commands (``is_interactive_command``, ``expect``, ``is_interactive_quit``) run
on a pty as the session's program (``swerex_pty``).
"""

from __future__ import annotations

import asyncio
import io
import json
import posixpath
import shlex
import signal
import tarfile
import time
import zipfile
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

import sandfleet.server.dialects.swerex.pty as swerex_pty
from sandfleet.agent.client import ExecResult, RunningCommand
from sandfleet.errors import SandboxError, SandfleetError, ServiceError
from sandfleet.sandbox.base import Session
from sandfleet.server.auth import Tokens
from sandfleet.server.dialects.swerex.models import (
    Body,
    CloseSession,
    CreateSession,
    Empty,
    Execute,
    ReadFile,
    RunInSession,
    WriteFile,
    parse,
)
from sandfleet.server.service import Entry, SandboxService
from sandfleet.server.wire import FormError, Problem, check_tar, form_parts, problem_for

USER = "root"
EXC = "swerex.exceptions."
REPLAYS_KEPT = 64


class SwerexError(Exception):
    def __init__(self, class_path: str, message: str):
        super().__init__(message)
        self.class_path = class_path
        self.message = message


class HTTPError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(eq=False)
class Runtime:
    sessions: dict[str, Session] = field(default_factory=dict)
    replies: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)
    running: dict[str, tuple[RunningCommand, asyncio.Event]] = field(default_factory=dict)
    """Per session: the command running now, and an event set when it ends."""
    programs: dict[str, swerex_pty.Program] = field(default_factory=dict)
    """Per session: the program an interactive command started, while it runs."""
    pending: Counter[str] = field(default_factory=Counter)
    """Per session: commands sent and not yet ended (started or still starting)."""


def _guest(e: BaseException) -> SwerexError:
    p = problem_for(e) if isinstance(e, SandfleetError | Problem) else None
    if p is not None and p.extra.get("errno") == 2:
        return SwerexError("builtins.FileNotFoundError", p.message)
    if p is not None and p.extra.get("errno") == 13:
        return SwerexError("builtins.PermissionError", p.message)
    if p is not None and p.status_code == 410:
        return SwerexError(EXC + "SwerexException", p.message)
    return SwerexError("builtins.RuntimeError", f"{type(e).__name__}: {e}")


def error_response(err: BaseException) -> JSONResponse | None:
    """The one place an error becomes SWE-ReX's wire error (None: not one of ours, the app's
    handlers answer it): auth, an unknown sandbox and a malformed body are ``{"detail"}``
    (401/404/422); the rest is HTTP 511 ``{"swerexception"}``, which the client raises again as
    the class it names: what a handler raises (:class:`SwerexError`), and what the sandbox or
    the service does (a missing file is ``builtins.FileNotFoundError``, a denied one
    ``builtins.PermissionError``, a gone sandbox ``SwerexException``, anything else
    ``builtins.RuntimeError``)."""
    if isinstance(err, HTTPError):
        return JSONResponse({"detail": err.detail}, status_code=err.status)
    if isinstance(err, SandfleetError | Problem):
        err = _guest(err)
    if isinstance(err, SwerexError):
        return JSONResponse({"swerexception": {"message": err.message, "class_path": err.class_path,
                                               "traceback": "", "extra_info": {}}}, status_code=511)
    if isinstance(err, ValidationError):
        return JSONResponse({"detail": f"malformed body: {err}"}, status_code=422)
    if isinstance(err, ValueError):  # the JSON itself
        return JSONResponse({"detail": f"malformed body: {err}"}, status_code=422)
    return None


class SweRex:
    def __init__(self, service: SandboxService, tokens: Tokens):
        self.service = service
        self.tokens = tokens
        self.runtimes: dict[str, Runtime] = {}

    def target(self, request: Request) -> tuple[Entry, Runtime]:
        key = request.headers.get("x-api-key")
        owner = self.tokens.owner(f"Bearer {key}") if key else None
        if owner is None:
            raise HTTPError(401, "Invalid API key: X-API-Key must be a token of this service")
        sid = request.path_params["sid"]
        try:
            e = self.service.entry(owner, sid)
        except SandfleetError as err:
            p = problem_for(err)
            if p is None:
                raise
            raise HTTPError(p.status_code, p.message) from None
        rt = self.runtimes.get(sid)
        if rt is None:
            for gone in [k for k in self.runtimes if k not in self.service.live]:
                del self.runtimes[gone]
            rt = self.runtimes[sid] = Runtime()
        return e, rt

    async def is_alive(self, request: Request, e: Entry, rt: Runtime, body: Empty) -> dict[str, Any]:
        return {"is_alive": e.sb.alive, "message": "" if e.sb.alive else f"sandbox {e.sb.id} is not alive"}

    async def create_session(self, request: Request, e: Entry, rt: Runtime, body: CreateSession) -> dict[str, Any]:
        name = body.name
        if body.session_type != "bash":
            raise SwerexError("builtins.ValueError", f"unknown session type: {body.session_type!r}")
        if name in rt.sessions:
            raise SwerexError(EXC + "SessionExistsError", f"session {name} already exists")
        s = e.sb.session(cwd="/", env={}, user=USER)
        rt.sessions[name] = s
        output = ""
        for src in body.startup_source or []:
            res = await self._session_run(s, f"source {shlex.quote(src)}", None)
            output += res.output
        return {"output": output, "session_type": "bash"}

    async def _session_run(self, s: Session, command: str, timeout: float | None, rt: Runtime | None = None,
                           name: str = "") -> ExecResult:
        ended = asyncio.Event()

        def on_start(h: RunningCommand) -> None:
            if rt is not None:
                rt.running[name] = (h, ended)

        if rt is not None:
            rt.pending[name] += 1
        try:
            return await s.run("{\n" + command + "\n} 2>&1", timeout=timeout, on_start=on_start,
                               max_output=self.service.config.swerex_max_output)
        finally:
            ended.set()
            if rt is not None:
                rt.pending[name] -= 1
                if rt.pending[name] <= 0:
                    del rt.pending[name]
                if rt.running.get(name, (None, None))[1] is ended:
                    del rt.running[name]

    async def _interrupt(self, rt: Runtime, name: str, body: RunInSession) -> dict[str, Any]:
        """SIGINT to the session's foreground command (its process group), as a terminal's ^C;
        after ``n_retry`` x ``timeout`` seconds without it ending, SIGKILL to its whole tree."""
        obs = {"output": "", "exit_code": 0, "failure_reason": "", "expect_string": "", "session_type": "bash"}
        wait = max(0.05, body.timeout or 0.2) * max(1, body.n_retry or 3)
        t_end = time.monotonic() + wait
        while name not in rt.running and name in rt.pending and time.monotonic() < t_end:
            await asyncio.sleep(0.02)  # a command sent just before is still starting
        cur = rt.running.get(name)
        if cur is None:
            return {**obs, "failure_reason": "no command was running in the session"}
        h, ended = cur
        h.signal(signal.SIGINT)
        try:
            async with asyncio.timeout(wait):
                await ended.wait()
        except TimeoutError:
            h.signal(signal.SIGKILL)
            await ended.wait()
            return {**obs, "failure_reason": f"the command ignored SIGINT for {wait:g}s and was killed"}
        return obs

    async def run_in_session(self, request: Request, e: Entry, rt: Runtime, body: RunInSession) -> dict[str, Any]:
        name = body.name
        s = rt.sessions.get(name)
        if s is None:
            raise SwerexError(EXC + "SessionDoesNotExistError", f"session {name!r} does not exist")
        if body.action_type == "bash_interrupt":
            return await self._interrupt(rt, name, body)
        prog = rt.programs.get(name)
        if prog is not None and prog.ended:  # it ended on its own since the last call
            rt.programs.pop(name, None)
        if body.interactive or name in rt.programs:
            return await self._interactive(s, rt, name, body)
        command = body.command or ""
        timeout = body.timeout
        res = await self._session_run(s, command, timeout or None, rt, name)
        if res.timed_out:
            raise SwerexError(EXC + "CommandTimeoutError",
                              f"timeout after {timeout} seconds while running command {command!r}")
        check = body.check
        output = res.stdout
        if check == "raise" and res.exit_code != 0:
            msg = f"Command {command!r} failed with exit code {res.exit_code}. Here is the output:\n{output!r}"
            if body.error_msg:
                msg = f"{body.error_msg}: {msg}"
            raise SwerexError(EXC + "NonZeroExitCodeError", msg)
        return {"output": output, "exit_code": None if check == "ignore" else res.exit_code,
                "failure_reason": self._cut(res), "expect_string": "", "session_type": "bash"}

    async def _interactive(self, s: Session, rt: Runtime, name: str, body: RunInSession) -> dict[str, Any]:
        """SWE-ReX's interactive commands, ``expect`` and ``is_interactive_quit`` (swerex_pty)."""
        command = body.command or ""
        expect = body.expect or []
        timeout = body.timeout or None
        quit_ = bool(body.is_interactive_quit)
        obs = {"exit_code": 0, "failure_reason": "", "session_type": "bash"}
        prog = rt.programs.get(name)
        try:
            if prog is None:
                if quit_:
                    raise SwerexError(EXC + "SwerexException",
                                      f"is_interactive_quit: no interactive program runs in session {name!r}")
                prog = await swerex_pty.start(s, command, lambda: None)
                rt.programs[name] = prog
                text, hit = await swerex_pty.expect(prog, expect, timeout)
                if hit == "":
                    rt.programs.pop(name, None)
                    err = prog.task.exception() if prog.task is not None and not prog.task.cancelled() else None
                    if err is not None:
                        raise err
                    code = prog.task.result().exit_code if prog.task is not None else None
                    return {**obs, "output": swerex_pty.clean(text), "expect_string": "",
                            "exit_code": 0 if body.is_interactive_command else code}
                return {**obs, "output": swerex_pty.clean(text), "expect_string": hit,
                        "exit_code": 0 if body.is_interactive_command else None}
            if not (body.is_interactive_command or quit_):
                raise SwerexError(EXC + "SwerexException",
                                  f"session {name!r} is running the interactive program {prog.command!r}: send "
                                  "is_interactive_command input to it, or is_interactive_quit to end it")
            prog.type_line(command)
            if quit_:
                text = await swerex_pty.wait_end(prog, timeout)
                rt.programs.pop(name, None)
                return {**obs, "output": swerex_pty.clean(text, command), "expect_string": ""}
            text, hit = await swerex_pty.expect(prog, expect, timeout)
            if hit == "":
                rt.programs.pop(name, None)
            return {**obs, "output": swerex_pty.clean(text, command), "expect_string": hit}
        except swerex_pty.ExpectTimeout as err:
            raise SwerexError(EXC + "CommandTimeoutError",
                              f"timeout after {timeout} seconds while running command {command!r}: {err}") from None

    def _cut(self, res: ExecResult) -> str:
        """What the response says when output was over --swerex-max-output (the output itself
        ends with "[... N more bytes truncated by sandfleet]")."""
        if not res.truncated:
            return ""
        return (f"output truncated: {res.stdout_dropped + res.stderr_dropped} bytes over the "
                f"{self.service.config.swerex_max_output}-byte limit were not returned "
                "(sandfleet serve --swerex-max-output)")

    async def close_session(self, request: Request, e: Entry, rt: Runtime, body: CloseSession) -> dict[str, Any]:
        name = body.name
        s = rt.sessions.pop(name, None)
        if s is None:
            raise SwerexError(EXC + "SessionDoesNotExistError", f"session {name!r} does not exist")
        prog = rt.programs.pop(name, None)
        if prog is not None:
            await swerex_pty.stop(prog)
        await s.close()
        return {"session_type": "bash"}

    async def execute(self, request: Request, e: Entry, rt: Runtime, body: Execute) -> dict[str, Any]:
        cmd = body.command
        if isinstance(cmd, list):
            argv = list(cmd)
            if body.shell:
                argv = ["bash", "-c", " ".join(argv)]
        elif body.shell:
            argv = ["bash", "-c", cmd or ""]
        else:
            argv = shlex.split(cmd or "")
        if not argv:
            raise SwerexError("builtins.ValueError", "an empty command")
        if body.merge_output_streams:
            argv = ["sh", "-c", 'exec "$@" 2>&1', "sh", *argv]
        timeout = body.timeout
        res = await e.sb.exec(argv, user=USER, cwd=body.cwd or "/", env=body.env or None, timeout=timeout or None,
                              max_output=self.service.config.swerex_max_output)
        if res.timed_out:
            raise SwerexError(EXC + "CommandTimeoutError", f"Timeout ({timeout}s) exceeded while running command")
        if body.check and res.exit_code != 0:
            msg = (f"Command {cmd!r} failed with exit code {res.exit_code}. "
                   f"Stdout:\n{res.stdout!r}\nStderr:\n{res.stderr!r}")
            if body.error_msg:
                msg = f"{body.error_msg}: {msg}"
            raise SwerexError(EXC + "NonZeroExitCodeError", msg)
        return {"stdout": res.stdout, "stderr": res.stderr, "exit_code": res.exit_code}

    async def read_file(self, request: Request, e: Entry, rt: Runtime, body: ReadFile) -> dict[str, Any]:
        data = await e.sb.read_file(body.path, user=USER)
        try:
            return {"content": data.decode(body.encoding or "utf-8", body.errors or "strict")}
        except (UnicodeDecodeError, LookupError) as err:
            raise SwerexError("builtins.ValueError", str(err)) from None

    async def _write(self, e: Entry, path: str, data: bytes) -> None:
        try:
            await e.sb.write_file(path, data, user=USER)
        except SandfleetError as err:
            if getattr(err, "errno", None) != 2:
                raise
            await e.sb.exec(["mkdir", "-p", posixpath.dirname(path)], cwd="/", user=USER)
            await e.sb.write_file(path, data, user=USER)

    async def write_file(self, request: Request, e: Entry, rt: Runtime, body: WriteFile) -> dict[str, Any]:
        await self._write(e, body.path, (body.content or "").encode())
        return {}

    async def upload(self, request: Request, e: Entry, rt: Runtime, body: Empty) -> dict[str, Any]:
        try:
            form = await form_parts(request.headers, await request.body(), max_part_size=1 << 20)
        except FormError as err:
            raise HTTPError(422, f"upload needs a multipart form: {err}") from None
        parts = {name: data for name, _, data in form}
        target = parts.get("target_path", b"").decode()
        data = parts.get("file")
        if not target or data is None:
            raise HTTPError(422, "upload needs the form fields file and target_path")
        if parts.get("unzip", b"false").decode().lower() != "true":
            await self._write(e, target, data)
            return {}
        tar = zip_to_tar(data)
        check_tar(tar)
        res = await e.sb.exec(["sh", "-c", 'mkdir -p "$1" && tar -x --no-same-owner -C "$1"', "sh", target],
                              user=USER, stdin=tar, cwd="/")
        if res.exit_code != 0:
            raise SwerexError("builtins.OSError", f"unpacking into {target} failed: {res.stderr.strip()}")
        return {}

    async def close(self, request: Request, e: Entry, rt: Runtime, body: Empty) -> dict[str, Any]:
        """The runtime's end is the sandbox's (SWE-agent's remote deployment stops by closing)."""
        rt.sessions.clear()
        rt.running.clear()
        for prog in rt.programs.values():
            await swerex_pty.stop(prog)
        rt.programs.clear()
        self.runtimes.pop(e.sb.id, None)
        try:
            await self.service.delete(e.owner, e.sb.id)
        except (ServiceError, SandboxError):
            pass  # gone already (its TTL, a delete through /v1): closed either way
        return {}


def zip_to_tar(data: bytes) -> bytes:
    """A zip archive (what SWE-ReX sends for a directory) as an uncompressed tar stream."""
    buf = io.BytesIO()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z, tarfile.open(fileobj=buf, mode="w") as tar:
            for info in z.infolist():
                ti = tarfile.TarInfo(info.filename.rstrip("/") or ".")
                mode = (info.external_attr >> 16) & 0o7777
                if info.is_dir():
                    ti.type = tarfile.DIRTYPE
                    ti.mode = mode or 0o755
                    tar.addfile(ti)
                else:
                    content = z.read(info)
                    ti.size = len(content)
                    ti.mode = mode or 0o644
                    tar.addfile(ti, io.BytesIO(content))
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise SwerexError("zipfile.BadZipFile", f"upload: not a zip archive: {err}") from None
    return buf.getvalue()


def install_routes(app: FastAPI, service: SandboxService, tokens: Tokens) -> SweRex:
    rex = SweRex(service, tokens)

    def route(fn: Any, model: type[Body], replayable: bool = True) -> Any:
        async def handler(request: Request) -> Response:
            try:
                e, rt = rex.target(request)
                rid = request.headers.get("x-request-id")
                if replayable and rid and rid in rt.replies:
                    return JSONResponse(rt.replies[rid])
                loaded: Any = {}
                if request.method == "POST" and not request.headers.get("content-type", "").startswith("multipart/"):
                    raw = await request.body()
                    if raw:
                        loaded = json.loads(raw)
                out = await fn(request, e, rt, parse(model, loaded))
                if replayable and rid:
                    rt.replies[rid] = out
                    while len(rt.replies) > REPLAYS_KEPT:
                        rt.replies.popitem(last=False)
                return JSONResponse(out)
            except Exception as err:
                answer = error_response(err)
                if answer is None:
                    raise
                return answer
        return handler

    async def hello(request: Request, e: Entry, rt: Runtime, body: Empty) -> dict[str, Any]:
        return {"message": "hello world"}

    app.add_api_route("/swerex/{sid}/", route(hello, Empty, False), methods=["GET"], include_in_schema=False)
    app.add_api_route("/swerex/{sid}/is_alive", route(rex.is_alive, Empty, False), methods=["GET"],
                      include_in_schema=False)
    posts: dict[str, type[Body]] = {
        "create_session": CreateSession, "run_in_session": RunInSession, "close_session": CloseSession,
        "execute": Execute, "read_file": ReadFile, "write_file": WriteFile, "upload": Empty, "close": Empty}
    for name, model in posts.items():
        app.add_api_route(f"/swerex/{{sid}}/{name}", route(getattr(rex, name), model), methods=["POST"],
                          include_in_schema=False)
    return rex
