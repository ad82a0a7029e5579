"""A command's run and its answer, shared by the exec and session routes and the fast exec
path: NDJSON records (chunks, then exit or error), a buffered answer killed when the client
hangs up, and a streamed one that gives back its busy slot however it ends."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sandfleet.agent.client import ExecResult, OutputCallback
from sandfleet.client import models
from sandfleet.errors import SandfleetError
from sandfleet.server.metrics import Metrics
from sandfleet.server.service import Entry, SandboxService, check_argv, check_env
from sandfleet.server.wire import NDJSON_TYPE, Problem, b64_field, ndjson_line, problem_for

log = logging.getLogger(__name__)
Run = Callable[[OutputCallback | None], Coroutine[Any, Any, ExecResult]]
"""A command ready to run: called with the output callback of a streamed answer, or None."""


def error_record(e: BaseException) -> dict[str, Any]:
    p = problem_for(e) if isinstance(e, SandfleetError | Problem) else None
    if p is None:
        log.error("command failed inside the service: %s: %s", type(e).__name__, e, exc_info=e)
        p = Problem(500, "internal", f"{type(e).__name__}: {e}")
    return {"type": "error", "status": p.status_code, **p.body()}


def exit_record(res: ExecResult, streamed: bool) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "type": "exit", "exit_code": res.exit_code, "timed_out": res.timed_out, "signal": res.signal,
        "duration_s": res.duration_s, "stdout_dropped": res.stdout_dropped, "stderr_dropped": res.stderr_dropped,
    }  # fmt: skip
    if res.detached:  # the verifier's tests under their warden: processes that left their tree
        rec["detached"] = res.detached
    if not streamed:  # stdout as bytes (an archive, say), stderr as the text ExecResult has
        rec["stdout_b64"] = base64.b64encode(res.stdout_bytes).decode()
        rec["stderr"] = res.stderr
    return rec


async def command_lines(run: Run, stream: bool,
                        metrics: Metrics) -> AsyncIterator[bytes]:
    """Run a command in a task; yield its NDJSON records. Closed early (the client went
    away), it cancels the task, and the agent client kills the command."""
    q: asyncio.Queue[bytes | None] = asyncio.Queue()

    def on_output(name: str, data: bytes) -> None:
        q.put_nowait(ndjson_line(chunk_record(name, data)))

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
            yield ndjson_line(error_record(e))
        else:
            metrics.exec_seconds.observe(time.perf_counter() - t0)
            yield ndjson_line(exit_record(res, stream))
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        elif not task.cancelled():
            task.exception()  # retrieved (it was reported, or nobody is left to tell)


async def buffered_command(receive: Receive, run: Run,
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
        return Response(ndjson_line({"type": "error", "status": 410, "code": "sandbox_lost",
                               "message": "the service stopped: the command was killed after the drain grace"}),
                        media_type=NDJSON_TYPE)
    if task.cancelled():
        return Response(status_code=499)  # nobody is left to read it
    try:
        res = task.result()
    except Exception as e:
        line = ndjson_line(error_record(e))
    else:
        metrics.exec_seconds.observe(time.perf_counter() - t0)
        line = ndjson_line(exit_record(res, False))
    return Response(line, media_type=NDJSON_TYPE)


def exec_runner(e: Entry, body: models.ExecRequest) -> Run:
    """The command of an exec request, checked (a Problem names what is wrong), ready to run."""
    stdin = b64_field(body.stdin_b64, "stdin_b64")
    check_argv(body.cmd)
    check_env(body.env)
    if body.cwd is not None and "\x00" in body.cwd:
        raise Problem(400, "bad_path", "cwd holds a NUL byte")

    def run(on_output: OutputCallback | None) -> Coroutine[Any, Any, ExecResult]:
        return e.sb.exec(body.cmd, cwd=body.cwd, env=body.env, stdin=stdin, timeout=body.timeout,
                         max_output=body.max_output, on_output=on_output, user=body.user,
                         network=body.network, pid_namespace=body.pid_namespace)

    return run


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


async def answer(service: SandboxService, metrics: Metrics, e: Entry, owner: str, deadline: str | None,
                 stream: bool, run: Run, request: Request) -> Response:
    """Run ``run`` in one busy slot of ``e``: one record when not streamed, else NDJSON
    chunks as they come (the slot held until the stream ends)."""
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


def chunk_record(stream: str, data: bytes) -> dict[str, Any]:
    return {"type": stream, "b64": base64.b64encode(data).decode()}
