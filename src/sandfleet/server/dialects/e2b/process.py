"""envd's ``process.Process`` service on sandfleet: Start, Connect, List, SendSignal,
SendInput, StreamInput, CloseStdin and Update (a pty's size).

A process outlives its stream (envd semantics: its output is buffered; a client that hangs
up does not kill it). Admission takes one busy slot for a process's start and gives it back
once the process runs (``SandboxService.admit_start``): background servers, watchers and
sleeps hold none. stdin is a live pipe when the StartRequest asks for it (``stdin`` true,
or absent: envd's default), and a pty is a real pseudo-terminal in the guest agent.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import signal
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from sandfleet.agent.client import ExecResult, RunningCommand
from sandfleet.server.dialects.e2b.state import Box, Boxes, Proc
from sandfleet.server.dialects.e2b.wire import (
    CONNECT_JSON,
    EnvdError,
    end_stream,
    envelope,
    guest_envd_error,
    parse_envelopes,
    request_message,
)

if TYPE_CHECKING:
    from sandfleet.server.service import Entry

SIGNALS = {9: "killed", 15: "terminated", 2: "interrupt", 1: "hangup"}
SIGNAL_NAMES = {"SIGNAL_SIGKILL": 9, "SIGNAL_SIGTERM": 15, "SIGNAL_SIGINT": 2, "SIGNAL_SIGHUP": 1}
START_WAIT_S = 30.0
"""How long input or a resize waits for a process that is still being admitted."""


def _size(pty: Any) -> tuple[int, int]:
    size = (pty or {}).get("size") or {} if isinstance(pty, dict) else {}
    try:
        cols, rows = int(size.get("cols") or 80), int(size.get("rows") or 24)
    except (TypeError, ValueError, AttributeError):
        raise EnvdError("invalid_argument", "pty.size is {cols, rows}") from None
    if not (0 < cols < 65536 and 0 < rows < 65536):
        raise EnvdError("invalid_argument", f"a terminal of {cols}x{rows} is not a size")
    return cols, rows


def _b64(text: Any, what: str) -> bytes:
    try:
        s = str(text or "")
        return base64.b64decode(s + "=" * (-len(s) % 4), altchars=b"-_" if ("-" in s or "_" in s) else None)
    except (binascii.Error, ValueError):
        raise EnvdError("invalid_argument", f"{what} is not base64") from None


async def _stream_messages(request: Request) -> AsyncIterator[dict[str, Any]]:
    """The messages of a client stream, as they arrive (a chunked body read as it comes)."""
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        while len(buf) >= 5:
            n = int.from_bytes(buf[1:5], "big")
            if len(buf) < 5 + n:
                break
            msgs = parse_envelopes(bytes(buf[:5 + n]))
            del buf[:5 + n]
            for msg in msgs:
                yield msg
    if buf:
        raise EnvdError("invalid_argument", "a torn Connect envelope at the end of the stream")


class ProcessRPC:
    """process.Process of envd, a component of :class:`~.dialect.E2B` over its :class:`~.state.Boxes`."""

    def __init__(self, boxes: Boxes):
        self.boxes = boxes

    async def start(self, request: Request) -> Response:
        e, b, user = self.boxes.envd(request)
        if request.headers.get("content-type", "").split(";")[0].strip() != CONNECT_JSON:
            raise EnvdError("invalid_argument", f"Process/Start is a server-streaming call: {CONNECT_JSON}")
        req = await request_message(request)
        try:
            cfg = req.get("process") or {}
            argv = [str(cfg["cmd"]), *[str(a) for a in cfg.get("args") or []]]
            envs = {str(k): str(v) for k, v in (cfg.get("envs") or {}).items()}
        except (KeyError, TypeError, AttributeError):
            raise EnvdError("invalid_argument", "a StartRequest with process.cmd is needed") from None
        cwd = cfg.get("cwd")
        pty = req.get("pty")
        size = _size(pty) if pty is not None else None
        timeout_ms = request.headers.get("connect-timeout-ms")
        timeout = int(timeout_ms) / 1000 if timeout_ms and timeout_ms.isdigit() and int(timeout_ms) > 0 else None
        pid = b.next_pid
        b.next_pid += 1
        tag = req.get("tag")
        proc = Proc(pid=pid, config={"cmd": argv[0], "args": argv[1:], "envs": envs, **({"cwd": cwd} if cwd else {})},
                    tag=str(tag) if tag else None, pty=size is not None, cap=self.boxes.service.config.e2b_max_output,
                    stdin=size is not None or req.get("stdin") is not False)
        proc.push({"start": {"pid": pid}})
        b.procs[pid] = proc
        env = {**self.boxes.user_env(e, user), **envs}
        proc.task = asyncio.create_task(self._run(e, b, proc, argv, env, cwd, timeout, user, size))
        return StreamingResponse(self._events(proc, 0), media_type=CONNECT_JSON)

    async def _run(self, e: Entry, b: Box, proc: Proc, argv: list[str], env: dict[str, str], cwd: str | None,
                   timeout: float | None, user: str | None, size: tuple[int, int] | None) -> None:
        end: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        release: Callable[[], None] | None = None

        def on_start(h: RunningCommand) -> None:
            proc.handle = h
            if release is not None:
                release()  # it runs: from here on its sandbox's cgroup bounds it, not a slot
            proc.started.set()

        try:
            release = await self.boxes.service.admit_start(e.owner, None, e)
            res: ExecResult = await e.sb.exec(argv, cwd=cwd, env=env, timeout=timeout, on_output=proc.output,
                                              user=user, max_output=0, stdin=True if proc.stdin else None,
                                              pty=size, on_start=on_start)
            if res.timed_out or res.signal:
                sig = res.signal or 9
                end = {"exitCode": -1, "exited": False, "status": f"signal: {SIGNALS.get(sig, str(sig))}"}
            else:
                end = {"exitCode": res.exit_code, "exited": True, "status": f"exit status {res.exit_code}"}
        except asyncio.CancelledError:
            end = {"exitCode": -1, "exited": False, "status": "signal: killed"}
        except Exception as err:
            ee = guest_envd_error(err)
            error = {"code": ee.code, "message": ee.message}
        finally:
            if release is not None:
                release()
            if proc.dropped and error is None:  # never a silent cut: envd's end error, and the stream's
                why = (f"output truncated: {proc.dropped} bytes over the {proc.cap}-byte limit were not "
                       "returned (sandfleet serve --e2b-max-output)")
                error = {"code": "resource_exhausted", "message": why}
                if end is not None:
                    end["error"] = why
            if end is not None:
                proc.push({"end": end})
            proc.events.append(end_stream(error))
            proc.done = True
            proc.started.set()
            proc.changed.set()
            b.procs.pop(proc.pid, None)

    @staticmethod
    async def _events(proc: Proc, idx: int) -> AsyncIterator[bytes]:
        while True:
            while idx < len(proc.events):
                yield proc.events[idx]
                idx += 1
            if proc.done:
                return
            proc.changed.clear()
            if idx < len(proc.events) or proc.done:
                continue
            await proc.changed.wait()

    @staticmethod
    def _select(b: Box, req: dict[str, Any]) -> Proc:
        sel = req.get("process") or {}
        if not isinstance(sel, dict):
            raise EnvdError("invalid_argument", "process is a selector {pid} or {tag}")
        if sel.get("tag") is not None:
            found = [p for p in b.procs.values() if p.tag == str(sel["tag"]) and not p.done]
            if not found:
                raise EnvdError("not_found", f"process with tag {sel['tag']!r} not found")
            return found[0]
        try:
            proc = b.procs.get(int(sel.get("pid") or -1))
        except (TypeError, ValueError):
            proc = None
        if proc is None or proc.done:
            raise EnvdError("not_found", f"process {sel.get('pid')} not found")
        return proc

    @staticmethod
    async def _running(proc: Proc) -> RunningCommand:
        try:
            async with asyncio.timeout(START_WAIT_S):
                await proc.started.wait()
        except TimeoutError:
            raise EnvdError("unavailable", f"process {proc.pid} is still waiting to start") from None
        if proc.handle is None or proc.handle.done or proc.done:
            raise EnvdError("not_found", f"process {proc.pid} not found")
        return proc.handle

    async def connect_process(self, request: Request) -> Response:
        _, b, _ = self.boxes.envd(request)
        proc = self._select(b, await request_message(request))

        async def stream() -> AsyncIterator[bytes]:
            yield envelope(0, {"event": {"start": {"pid": proc.pid}}})
            async for chunk in self._events(proc, len(proc.events)):
                yield chunk

        return StreamingResponse(stream(), media_type=CONNECT_JSON)

    async def send_signal(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        req = await request_message(request)
        proc = self._select(b, req)
        raw = req.get("signal", 9)
        sig = SIGNAL_NAMES.get(raw) if isinstance(raw, str) else raw
        if not isinstance(sig, int) or sig not in SIGNALS:
            raise EnvdError("invalid_argument", f"signal {raw!r} is not one of {sorted(SIGNAL_NAMES)}")
        if sig == signal.SIGKILL:
            if proc.task is not None:
                proc.task.cancel()  # the agent client kills the whole tree
                await asyncio.wait({proc.task})
            return {}
        (await self._running(proc)).signal(sig)
        return {}

    async def list_processes(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        return {"processes": [p.info() for p in b.procs.values() if not p.done]}

    def _feed(self, proc: Proc, h: RunningCommand, inp: Any) -> None:
        if not isinstance(inp, dict) or not ({"stdin", "pty"} & set(inp)):
            raise EnvdError("invalid_argument", "input is {stdin: base64} or {pty: base64}")
        if not proc.stdin:
            raise EnvdError("failed_precondition", f"process {proc.pid} was started without stdin "
                                                   "(commands.run(..., stdin=True) keeps it open)")
        h.send_stdin(_b64(inp.get("pty") if "pty" in inp else inp.get("stdin"), "input"))

    async def send_input(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        req = await request_message(request)
        proc = self._select(b, req)
        self._feed(proc, await self._running(proc), req.get("input"))
        return {}

    async def stream_input(self, request: Request) -> Response:
        """Client-streaming: a start event naming the process, then data events (and
        keepalives), each fed as it arrives; the stream stays open as long as the client's."""
        _, b, _ = self.boxes.envd(request)
        proc: Proc | None = None
        async for msg in _stream_messages(request):
            if "start" in msg:
                proc = self._select(b, msg["start"] or {})
            elif "data" in msg:
                if proc is None:
                    raise EnvdError("invalid_argument", "StreamInput: data before the start event")
                self._feed(proc, await self._running(proc), (msg["data"] or {}).get("input"))
        return Response(envelope(0, {}) + end_stream(), media_type=CONNECT_JSON)

    async def close_stdin(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        proc = self._select(b, await request_message(request))
        h = await self._running(proc)
        if not proc.stdin:
            raise EnvdError("failed_precondition", f"process {proc.pid} was started without stdin")
        h.close_stdin()
        return {}

    async def update(self, request: Request) -> dict[str, Any]:
        _, b, _ = self.boxes.envd(request)
        req = await request_message(request)
        proc = self._select(b, req)
        if req.get("pty") is None:
            return {}
        if not proc.pty:
            raise EnvdError("failed_precondition", f"process {proc.pid} has no pty to resize")
        cols, rows = _size(req["pty"])
        try:
            await (await self._running(proc)).resize(cols, rows)
        except Exception as err:
            raise guest_envd_error(err) from None
        return {}
