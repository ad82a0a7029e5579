"""Host side of the guest-agent protocol over any asyncio byte stream."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sandfleet.agent.protocol import VERSION, F, Frame, T, decode, encode
from sandfleet.errors import ProtocolError, SandboxDiedError, SandboxTimeoutError, guest_error

OutputCallback = Callable[[str, bytes], None]
"""Called with ("stdout" | "stderr", chunk) as output arrives, when streaming."""


@dataclass
class ExecResult:
    """What a command did. ``exit_code`` is 128+N when killed by signal N."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    signal: int | None = None
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    stdout_bytes: bytes = b""

    @property
    def truncated(self) -> bool:
        """True when output beyond the byte cap was dropped (the text says so too)."""
        return bool(self.stdout_dropped or self.stderr_dropped)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout then stderr, as an agent would show them to a model."""
        return self.stdout + self.stderr


def _text(data: bytes, dropped: int) -> str:
    text = data.decode("utf-8", "replace")
    if dropped:
        text += f"\n[... {dropped} more bytes truncated by sandfleet]\n"
    return text


class AgentClient:
    """Talks to one guest agent. Many requests may be in flight; replies match by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, name: str):
        self._reader = reader
        self._writer = writer
        self._name = name
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Queue[Frame | BaseException]] = {}
        self._dead: BaseException | None = None
        self._reader_task = asyncio.create_task(self._read_loop(), name=f"agent-reader-{name}")
        self.guest_pid: int | None = None
        self.clock_set = False

    @property
    def alive(self) -> bool:
        return self._dead is None

    def mark_dead(self, why: str) -> None:
        if self._dead is None:
            self._dead = SandboxDiedError(f"sandbox {self._name}: {why}")
        for q in self._waiters.values():
            q.put_nowait(self._dead)

    async def _read_loop(self) -> None:
        why = "the guest agent closed its stream (the sandbox died or was killed)"
        try:
            while True:
                head = await self._reader.readexactly(4)
                n = int.from_bytes(head, "big")
                frame = decode(await self._reader.readexactly(n))
                q = self._waiters.get(frame.id)
                if q is not None:
                    q.put_nowait(frame)
                elif frame.type == T.R_ERROR:
                    why = f"guest agent error: {frame.text(F.MESSAGE)}"
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        except ProtocolError as e:
            why = f"protocol error: {e}"
        self.mark_dead(why)

    def _send(self, frame: bytes) -> None:
        if self._dead is not None:
            raise self._dead
        self._writer.write(frame)

    async def _next(self, q: asyncio.Queue[Frame | BaseException]) -> Frame:
        item = await q.get()
        if isinstance(item, BaseException):
            raise item
        if item.type == T.R_ERROR:
            errno = item.int(F.ERRNO, 0) or None
            raise guest_error(item.text(F.ETYPE), item.text(F.MESSAGE), errno)
        return item

    async def call(self, type_: T, fields: Sequence[tuple[F, bytes | str | int]] = ()) -> Frame:
        """One request, one reply."""
        rid = next(self._ids)
        q: asyncio.Queue[Frame | BaseException] = asyncio.Queue()
        self._waiters[rid] = q
        try:
            self._send(encode(type_, rid, fields))
            return await self._next(q)
        finally:
            del self._waiters[rid]

    async def hello(self, *, set_clock: bool = False) -> str:
        """Check the guest speaks our protocol version. ``set_clock`` also sets the guest's
        clock to the host's (for VMs restored from a snapshot; needs CAP_SYS_TIME in the
        guest, so a bwrap sandbox ignores it) and ``clock_set`` says whether it took."""
        fields: list[tuple[F, bytes | str | int]] = []
        if set_clock:
            ns = time.time_ns()
            fields.append((F.TIME, f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"))
        frame = await self.call(T.HELLO, fields)
        self.clock_set = bool(frame.int(F.TIME))
        version = frame.text(F.VERSION)
        if version != VERSION:
            raise ProtocolError(f"guest agent speaks protocol {version!r}, host speaks {VERSION!r}")
        self.guest_pid = frame.int(F.PID)
        return version

    async def exec(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        max_output: int = 1 << 20,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Run argv to completion. The guest kills the whole tree at ``timeout``."""
        fields: list[tuple[F, bytes | str | int]] = [(F.ARGV, a) for a in argv]
        if env is not None:
            fields += [(F.ENV, f"{k}={v}") for k, v in env.items()]
        if cwd is not None:
            fields.append((F.CWD, cwd))
        if timeout is not None:
            fields.append((F.TIMEOUT_MS, max(1, int(timeout * 1000))))
        fields.append((F.MAX_OUTPUT, max_output))
        if on_output is not None:
            fields.append((F.STREAM, 1))
        if stdin:
            fields.append((F.DATA, stdin))
        rid = next(self._ids)
        q: asyncio.Queue[Frame | BaseException] = asyncio.Queue()
        self._waiters[rid] = q
        t0 = time.monotonic()
        started = False
        try:
            self._send(encode(T.EXEC, rid, fields))
            # The guest enforces the timeout; the host waits a grace period more, then
            # declares the guest unresponsive rather than hanging.
            deadline = None if timeout is None else timeout + 10.0
            async with asyncio.timeout(deadline):
                await self._next(q)  # STARTED (or a guest error)
                started = True
                while True:
                    frame = await self._next(q)
                    if frame.type == T.R_OUTPUT:
                        if on_output is not None:
                            name = "stdout" if frame.int(F.STREAM_NO) == 1 else "stderr"
                            on_output(name, frame.get(F.DATA) or b"")
                        continue
                    break
        except TimeoutError:
            self._kill_quietly(rid)
            raise SandboxTimeoutError(
                f"sandbox {self._name}: guest agent did not report the end of {argv[0]!r} "
                f"within {timeout}s + 10s grace"
            ) from None
        except asyncio.CancelledError:
            if started:
                self._kill_quietly(rid)
            raise
        finally:
            del self._waiters[rid]
        out = frame.get(F.STDOUT) or b""
        dropped_out, dropped_err = frame.int(F.DROPPED_OUT), frame.int(F.DROPPED_ERR)
        sig = frame.int(F.SIGNAL) or None
        return ExecResult(
            exit_code=frame.int(F.CODE),
            stdout=_text(out, dropped_out),
            stderr=_text(frame.get(F.STDERR) or b"", dropped_err),
            duration_s=frame.int(F.DURATION_US) / 1e6 or (time.monotonic() - t0),
            timed_out=bool(frame.int(F.TIMED_OUT)),
            signal=sig,
            stdout_dropped=dropped_out,
            stderr_dropped=dropped_err,
            stdout_bytes=out,
        )

    def _kill_quietly(self, target: int) -> None:
        if self._dead is None:
            with contextlib.suppress(Exception):
                frame = encode(T.KILL, next(self._ids), [(F.TARGET, target), (F.SIGNAL, signal.SIGKILL)])
                self._writer.write(frame)

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        frame = await self.call(T.READ, [(F.PATH, path), (F.MAX, max_bytes)])
        return frame.get(F.DATA) or b""

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644, mkdirs: bool = True) -> None:
        await self.call(
            T.WRITE, [(F.PATH, path), (F.DATA, data), (F.MODE, mode), (F.MKDIRS, int(mkdirs))]
        )

    async def shutdown(self, timeout: float = 2.0) -> None:
        """Ask the agent to kill its commands and exit; then close the stream."""
        if self._dead is None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(timeout):
                    await self.call(T.SHUTDOWN)
        await self.close()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()
        self._reader_task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader_task
        self.mark_dead("closed")
