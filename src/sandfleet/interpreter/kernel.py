"""The host's side of a sandbox's stateful Python: :class:`Kernel` starts the REPL server of
:mod:`.repl` in the sandbox on first use (one long-lived exec: requests on its stdin, events
on its stdout) and runs cells in it, one at a time.

What uses it: the service's kernels (``sandfleet.server.kernels``: the E2B code
interpreter's ``/execute`` and ``/contexts``, ``POST /v1/sandboxes/{id}/run_code``),
SandboxFusion's ``run_jupyter``, and Python code holding a local sandbox
(``await Kernel(sb).run("x = 1")``; a ``RemoteSandbox`` has ``run_code`` instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import resources
from typing import Any, Protocol, Unpack

from sandfleet.agent.client import ExecResult, RunningCommand
from sandfleet.client.models import CodeExecution as Execution
from sandfleet.errors import GuestExecError
from sandfleet.sandbox.base import ExecOptions

log = logging.getLogger(__name__)

SOURCE = resources.files("sandfleet.interpreter").joinpath("repl.py").read_text()
START_TIMEOUT_S = 60.0
INTERRUPT_GRACE_S = 5.0
"""How long a cell past its timeout has, after SIGINT, before its kernel is killed."""
STDERR_KEEP = 8192


class Execing(Protocol):
    """What a kernel needs of a sandbox: a local backend's ``exec`` (a live stdin)."""

    async def exec(self, cmd: str | Sequence[str], **opts: Unpack[ExecOptions]) -> ExecResult: ...


class KernelError(GuestExecError):
    """The kernel could not be started (no python3 in the image, ...): on the wire, the
    GuestExecError a command that cannot start is."""


def add(ex: Execution, ev: dict[str, Any]) -> None:
    """Fold one event into a cell's execution."""
    kind = ev.get("type")
    if kind in ("stdout", "stderr"):
        (ex.stdout if kind == "stdout" else ex.stderr).append(ev.get("text", ""))
    elif kind == "result":
        ex.results.append({k: v for k, v in ev.items() if k not in ("type", "id")})
    elif kind == "error":
        ex.error = {k: str(ev.get(k, "")) for k in ("name", "value", "traceback")}
    elif kind == "end":
        ex.execution_count = ev.get("execution_count")


class Kernel:
    """A stateful Python in sandbox ``sb``, started on first use. Contexts are separate globals
    dicts (each with its working directory) in the one process; cells run one at a time."""

    def __init__(self, sb: Execing, *, cwd: str | None = None, env: dict[str, str] | None = None,
                 user: str | int | None = None, python: str = "python3"):
        self.sb = sb
        self.cwd = cwd
        self.env = env
        self.user = user
        self.python = python
        self._task: asyncio.Task[None] | None = None
        self._handle: RunningCommand | None = None
        self._ready: asyncio.Future[None] | None = None
        self._start_lock = asyncio.Lock()
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Queue[dict[str, Any] | None]] = {}
        self._buf = bytearray()
        self._stderr = bytearray()
        self.exit: str | None = None
        """Why the last kernel process ended (None while it runs or before it started)."""

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Start the REPL server unless it runs; raise KernelError if it does not come up."""
        async with self._start_lock:
            if self.alive and self._ready is not None and self._ready.done() and self._ready.exception() is None:
                return
            loop = asyncio.get_running_loop()
            self._ready = loop.create_future()
            self._buf.clear()
            self._stderr.clear()
            self.exit = None
            self._task = asyncio.create_task(self._run())
            try:
                async with asyncio.timeout(START_TIMEOUT_S):
                    await asyncio.shield(self._ready)
            except TimeoutError:
                await self.close()
                raise KernelError(f"the interpreter did not start within {START_TIMEOUT_S:g}s") from None

    async def _run(self) -> None:
        def on_start(h: RunningCommand) -> None:
            self._handle = h

        try:
            res = await self.sb.exec([self.python, "-u", "-c", SOURCE], cwd=self.cwd, env=self.env, stdin=True,
                                     max_output=0, on_output=self._output, user=self.user, on_start=on_start)
            self.exit = (f"signal {res.signal}" if res.signal else f"exit code {res.exit_code}")
        except asyncio.CancelledError:
            self.exit = "killed"
            raise
        except Exception as err:
            self.exit = f"{type(err).__name__}: {err}"
        finally:
            self._handle = None
            tail = self._stderr.decode("utf-8", "replace").strip()
            why = f"the interpreter exited ({self.exit})" + (f": {tail[-2000:]}" if tail else "")
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(KernelError(why))
            for q in self._waiters.values():
                q.put_nowait(None)

    def _output(self, name: str, data: bytes) -> None:
        if name != "stdout":
            self._stderr += data
            del self._stderr[:-STDERR_KEEP]
            return
        self._buf += data
        while True:
            at = self._buf.find(b"\n")
            if at < 0:
                return
            line = bytes(self._buf[:at])
            del self._buf[:at + 1]
            try:
                ev = json.loads(line)
            except ValueError:
                log.warning("interpreter: a line that is not JSON: %r", line[:200])
                continue
            if ev.get("type") == "ready":
                if self._ready is not None and not self._ready.done():
                    self._ready.set_result(None)
                continue
            q = self._waiters.get(ev.get("id"))
            if q is not None:
                q.put_nowait(ev)

    def _send(self, req: dict[str, Any]) -> None:
        if self._handle is None:
            raise KernelError(f"the interpreter is not running ({self.exit or 'not started'})")
        self._handle.send_stdin((json.dumps(req) + "\n").encode())

    def interrupt(self) -> None:
        """SIGINT to the kernel: the running cell raises KeyboardInterrupt."""
        if self._handle is not None:
            self._handle.signal(signal.SIGINT)

    async def events(self, code: str, *, context: str = "default", cwd: str | None = None,
                     env: dict[str, str] | None = None, timeout: float | None = None,
                     language: str = "python") -> AsyncIterator[dict[str, Any]]:
        """Run a cell and yield its events as they come (``stdout``, ``stderr``, ``result``,
        ``error``, last ``end``). Past ``timeout`` the cell is interrupted (its error is
        KeyboardInterrupt; a bash cell's is its status, 130), and its kernel is killed if it
        does not stop. A caller that stops early leaves the cell to be interrupted in the
        background. ``language`` ``bash`` on a context's first cell makes it a bash context
        (a long-lived bash; a failed cell's error has no name and its exit status as value)."""
        req = {"op": "run", "ctx": context, "code": code, "env": env, "cwd": cwd}
        if language != "python":
            req["lang"] = language
        async for ev in self._request(req, timeout):
            yield ev

    async def run(self, code: str, *, context: str = "default", cwd: str | None = None,
                  env: dict[str, str] | None = None, timeout: float | None = None,
                  on_event: Callable[[dict[str, Any]], None] | None = None, language: str = "python") -> Execution:
        """Run a cell to its end: its :class:`Execution`."""
        out = Execution()
        async for ev in self.events(code, context=context, cwd=cwd, env=env, timeout=timeout, language=language):
            add(out, ev)
            if on_event is not None:
                on_event(ev)
        return out

    async def reset(self, context: str = "default") -> None:
        """A fresh globals dict for ``context`` (its working directory stays)."""
        if self.alive:
            async for _ in self._request({"op": "reset", "ctx": context}, None):
                pass

    async def drop(self, context: str) -> None:
        if self.alive:
            async for _ in self._request({"op": "drop", "ctx": context}, None):
                pass

    async def _request(self, req: dict[str, Any], timeout: float | None) -> AsyncIterator[dict[str, Any]]:
        await self.start()
        await self._lock.acquire()
        rid = next(self._ids)
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._waiters[rid] = q
        finished = False
        try:
            self._send({**req, "id": rid})
            deadline = None if timeout is None else time.monotonic() + timeout
            interrupted = False
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    ev = await asyncio.wait_for(q.get(), left)
                except TimeoutError:
                    if interrupted:  # it did not stop: a new kernel next time
                        await self.close()
                        yield {"type": "error", "name": "TimeoutError", "traceback": "",
                               "value": "the cell ran past its timeout and did not stop on SIGINT; "
                                        "the interpreter was restarted (its state is lost)"}
                        finished = True
                        yield {"type": "end", "execution_count": None}
                        return
                    self.interrupt()
                    interrupted = True
                    deadline = time.monotonic() + INTERRUPT_GRACE_S
                    continue
                if ev is None:
                    finished = True
                    yield {"type": "error", "name": "KernelDied", "traceback": "",
                           "value": f"the interpreter exited ({self.exit}); its state is lost"}
                    yield {"type": "end", "execution_count": None}
                    return
                if ev.get("type") == "end":
                    finished = True
                yield ev
                if finished:
                    return
        finally:
            if finished or not self.alive:
                self._waiters.pop(rid, None)
                self._lock.release()
            else:  # abandoned mid-cell (a client hung up): stop the cell, then free the kernel
                asyncio.get_running_loop().create_task(self._abandon(rid, q))

    async def _abandon(self, rid: int, q: asyncio.Queue[dict[str, Any] | None]) -> None:
        try:
            self.interrupt()
            try:
                async with asyncio.timeout(INTERRUPT_GRACE_S):
                    while (ev := await q.get()) is not None and ev.get("type") != "end":
                        pass
            except TimeoutError:
                await self.close()
        finally:
            self._waiters.pop(rid, None)
            self._lock.release()

    async def close(self) -> None:
        """Kill the kernel (its state is lost; the next cell starts a new one)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
