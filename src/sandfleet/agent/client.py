"""Host side of the guest-agent protocol over any asyncio byte stream."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import SupportsIndex, TypedDict, Unpack

from sandfleet.agent.protocol import (
    MAX_OUTPUT,
    MAX_READ,
    MAX_REPLY_FRAME,
    VERSION,
    F,
    Frame,
    T,
    decode,
    encode,
)
from sandfleet.errors import (
    ConfigError,
    GuestError,
    HostUnsupportedError,
    ProtocolError,
    SandboxDiedError,
    SandboxEnd,
    SandboxError,
    SandboxUnresponsiveError,
    guest_error,
)
from sandfleet.settings import current as current_settings

OutputCallback = Callable[[str, bytes], None]
"""Called with ("stdout" | "stderr", chunk) as output arrives, when streaming."""
StartCallback = Callable[["RunningCommand"], None]
"""Called once a command has started, with its handle (input, signals, terminal size)."""


class CommandOptions(TypedDict, total=False):
    """The keyword options every ``exec`` takes at every level (a sandbox, its runtime, the
    guest agent's client): a new option is one line here, plus what each backend does with it.
    Left out, each has the default its comment gives."""

    cwd: str | None  # the sandbox's workdir
    env: dict[str, str] | None  # added to the sandbox's environment
    timeout: float | None  # none: until the sandbox's TTL
    max_output: int  # 1 MiB (DEFAULT_MAX_OUTPUT) a stream; more is cut and ``truncated`` set
    on_output: OutputCallback | None  # stream output as it comes
    user: str | int | None  # the sandbox's user
    network: bool  # True; False: a network namespace of its own, only a loopback
    pid_namespace: bool  # False; True: pid 1 of a pid namespace of its own


class RunOptions(CommandOptions, total=False):
    """What a :class:`~sandfleet.agent.runtime.Runtime`'s ``exec`` takes besides argv."""

    stdin: bytes | None  # bytes to feed, then EOF


class FrameSplitter:
    """The guest's byte stream cut into frames: every whole frame of what has arrived, in order;
    a frame over :data:`MAX_REPLY_FRAME` is a :class:`ProtocolError`."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        if buf:  # the rest of a frame that came in parts: cut only once one is whole (a big one not copied per part)
            buf += data
            if len(buf) < 4 or len(buf) - 4 < (n := int.from_bytes(buf[:4], "big")) <= MAX_REPLY_FRAME:
                return []
            data = bytes(buf)
            buf.clear()
        out, off, end = [], 0, len(data)
        while end - off >= 4:  # (the usual case, whole frames: cut from what arrived, no copy of it first)
            n = int.from_bytes(data[off:off + 4], "big")
            if n > MAX_REPLY_FRAME:
                raise ProtocolError(f"the guest sent a frame of {n} bytes, over the {MAX_REPLY_FRAME}-byte limit")
            if end - off - 4 < n:
                break
            out.append(decode(data[off + 4:off + 4 + n]))
            off += 4 + n
        if off < end:
            buf += memoryview(data)[off:]
        return out


class FrameReader(asyncio.StreamReader):
    """A stream reader for :class:`AgentClient` that cuts what arrives into frames inside the
    transport's own callback and hands each to the client there: no reading task between the
    socket and the command waiting for its reply (a wake-up of the event loop less per reply,
    issue 46). What a plain :class:`asyncio.StreamReader` gets, the client reads with a task."""

    def __init__(self, limit: int = 1 << 16, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(limit=limit, loop=loop)
        self._frames = FrameSplitter()
        self._sink: Callable[[Frame], None] | None = None
        self._early: list[Frame] = []  # frames before a sink was attached
        self._ended: asyncio.Future[BaseException | None] = (loop or asyncio.get_running_loop()).create_future()

    def attach(self, sink: Callable[[Frame], None]) -> asyncio.Future[BaseException | None]:
        """Hand every frame to ``sink`` from now on (those that came before first); the future
        ends with None at EOF or with the error that ended the stream (as its result)."""
        self._sink = sink
        early, self._early = self._early, []
        for frame in early:
            sink(frame)
        return self._ended

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        if self._ended.done():
            return
        try:
            for frame in self._frames.feed(bytes(data)):
                if self._sink is None:
                    self._early.append(frame)
                else:
                    self._sink(frame)
        except Exception as e:  # a malformed frame: the stream can't be trusted any more
            self._end(e)

    def feed_eof(self) -> None:
        self._end(None)

    def set_exception(self, exc: BaseException) -> None:
        self._end(exc)

    def _end(self, why: BaseException | None) -> None:
        if not self._ended.done():
            self._ended.set_result(why)


class RunningCommand:
    """A command while it runs: feed its stdin (``exec(..., stdin=True)``), signal it,
    resize its terminal (``exec(..., pty=(cols, rows))``). Valid until its exec returns;
    after that, input and signals are dropped (the command is gone)."""

    def __init__(self, client: AgentClient, rid: int, pid: int, pty: bool):
        self._client = client
        self.rid = rid
        self.pid = pid
        """The command's pid inside the sandbox."""
        self.pty = pty
        self.done = False

    def send_stdin(self, data: bytes) -> None:
        """Queue ``data`` for the command's stdin (its terminal, with a pty)."""
        if data and not self.done:
            self._client._send(encode(T.STDIN, next(self._client._ids), [(F.TARGET, self.rid), (F.DATA, data)]))

    def close_stdin(self) -> None:
        """Close the command's stdin once what was sent is written (EOF for the command);
        with a pty, send the terminal's end-of-file character instead."""
        if self.done:
            return
        if self.pty:
            self.send_stdin(b"\x04")
            return
        self._client._send(encode(T.STDIN, next(self._client._ids), [(F.TARGET, self.rid), (F.DATA, b"")]))

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the command's process group (SIGKILL: the whole tree, background too)."""
        if not self.done:
            self._client._send(encode(T.KILL, next(self._client._ids), [(F.TARGET, self.rid), (F.SIGNAL, int(sig))]))

    async def resize(self, cols: int, rows: int) -> None:
        """Set the terminal's size (the command gets SIGWINCH); an error without a pty."""
        if not (0 < cols < 65536 and 0 < rows < 65536):
            raise ConfigError(f"a terminal size is 1..65535 columns and rows, not {cols}x{rows}")
        await self._client.call(T.RESIZE, [(F.TARGET, self.rid), (F.PTY, f"{cols} {rows}")], expect=T.R_OK,
                                what="RESIZE")


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
    detached: int = 0
    """For a command run with ``pid_namespace=True``: how many of its processes outlived the
    process that started them while it ran (re-parented to its namespace's warden: a daemon),
    or left its session and were still there at its end. 0 otherwise."""

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


DEFAULT_CALL_TIMEOUT = 60.0
"""Seconds HELLO, READ, WRITE and KILL wait for their reply (env SANDFLEET_CALL_TIMEOUT)."""
EXEC_GRACE = 10.0
"""Seconds past a command's own timeout (or the sandbox's TTL) before the guest agent
counts as unresponsive: the guest kills the command at its timeout and reports at once."""
DEATH_DETAIL_S = 1.0
"""Seconds a stream that ended unasked waits for its owner's account of the death."""

class _Expired(Exception):
    """A request's own deadline, as its reply queue's item (a timer per request, not
    :func:`asyncio.timeout`'s task lookup and rescheduling: issue 46)."""


class ReplyQueue:
    """The replies of one request, in the order they came: what :class:`asyncio.Queue` does for
    one reader, without its bookkeeping for many (its getters, putters, size and unfinished-task
    event, made for every request: a few microseconds of each exec round trip, issue 46)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Frame | BaseException] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Frame | BaseException) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def expire(self) -> None:
        """The request's deadline passed (a timer's callback): its waiter raises :class:`_Expired`."""
        self.put_nowait(_Expired())

    async def get(self) -> Frame | BaseException:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


def default_call_timeout() -> float:
    """$SANDFLEET_CALL_TIMEOUT, or 60 s."""
    raw = current_settings().call_timeout
    return DEFAULT_CALL_TIMEOUT if not raw else _seconds("SANDFLEET_CALL_TIMEOUT", raw)


def _seconds(name: str, value: object) -> float:
    try:
        s = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        s = math.nan
    if not 0 < s < math.inf:
        raise ConfigError(f"{name} must be a positive number of seconds, not {value!r}")
    return s


class AgentClient:
    """Talks to one guest agent. Many requests may be in flight; replies match by id.

    Every call has a deadline: ``call_timeout`` for HELLO, file operations and kills;
    a command's own timeout plus ``exec_grace`` for exec (a command without a timeout is
    bounded by the sandbox's ``ttl`` plus the grace, when the client knows it). A call
    that gets no reply in time raises :class:`SandboxUnresponsiveError` and marks the
    sandbox dead. So does any malformed or oversized frame from the guest: every waiter
    then wakes with the error, whatever broke the read loop.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        name: str,
        call_timeout: float | None = None,
        exec_grace: float = EXEC_GRACE,
        ttl: float | None = None,
    ):
        self._reader = reader
        self._writer = writer
        self._name = name
        self.call_timeout = default_call_timeout() if call_timeout is None else _seconds("call_timeout", call_timeout)
        self.exec_grace = _seconds("exec_grace", exec_grace)
        self._expires = None if ttl is None else time.monotonic() + _seconds("ttl", ttl)
        self._ids = itertools.count(1)
        self._waiters: dict[int, ReplyQueue] = {}
        self._dead: BaseException | None = None
        self._guest_said: str | None = None  # the last error the guest sent outside any request
        self._reader_task = asyncio.create_task(self._read_loop(), name=f"agent-reader-{name}")
        self.guest_pid: int | None = None
        self.clock_set = False
        self.describe_death: Callable[[], Awaitable[SandboxEnd]] | None = None
        """What the owner can add when the stream ends unasked (a local sandbox: how its
        process ended, its memory cgroup's OOM kills, its log's tail), so that a death
        under load names its cause; awaited for at most DEATH_DETAIL_S."""
        self._end: SandboxEnd | None = None
        self.before_first_command: Callable[[], None] | None = None
        """What the owner does before the sandbox's first command is sent (a bwrap sandbox's CPU
        quota, left out of its creation: :meth:`sandfleet.sandbox.cgroups.Cgroup.limit_cpu`);
        an OSError there fails that command, unsent, and the next one tries again."""

    @property
    def alive(self) -> bool:
        return self._dead is None

    @property
    def error(self) -> BaseException | None:
        """Why the sandbox is dead (a SandboxUnresponsiveError, SandboxDiedError, ...); None while alive."""
        return self._dead

    def mark_dead(self, why: str, *, error: BaseException | None = None) -> None:
        """Mark the sandbox dead (the first reason sticks) and wake every waiter with it."""
        if self._dead is None and error is None and self._end is not None:  # how it ended, carried
            text, tail = f"sandbox {self._name}: {why}", f"; its log ends: {self._end.log_tail}"
            error = SandboxDiedError(text, end=self._end, head=text.removesuffix(tail) if self._end.log_tail else text)
        if self._dead is None:
            self._dead = error if error is not None else SandboxDiedError(f"sandbox {self._name}: {why}")
        for q in self._waiters.values():
            q.put_nowait(self._dead)

    def _dispatch(self, frame: Frame) -> None:
        q = self._waiters.get(frame.id)
        if q is not None:
            q.put_nowait(frame)
        elif frame.type == T.R_ERROR:
            self._guest_said = f"guest agent error: {frame.text(F.MESSAGE)}"

    async def _frames(self) -> None:
        """Until the stream ends: every frame to its waiter. A :class:`FrameReader` hands them
        over in the transport's callback; a plain reader is read here."""
        if isinstance(self._reader, FrameReader):
            why = await self._reader.attach(self._dispatch)
            if why is not None:
                raise why
            return
        frames = FrameSplitter()
        while chunk := await self._reader.read(1 << 20):
            for frame in frames.feed(chunk):  # every whole frame that arrived, in one wake-up
                self._dispatch(frame)

    async def _read_loop(self) -> None:
        why = "the guest agent closed its stream (the sandbox died or was killed)"
        try:
            await self._frames()
            why = self._guest_said or why
            why += await self._death_detail()
        except (ConnectionError, OSError):
            why += await self._death_detail()
        except ProtocolError as e:
            why = f"protocol error: {e}"
        except asyncio.CancelledError:
            why = "closed"
            raise
        except Exception as e:  # MemoryError, ValueError, ...: whatever it is, the stream is unusable
            why = f"reading from the guest agent failed: {type(e).__name__}: {e}"
        finally:
            self.mark_dead(why)

    async def _death_detail(self) -> str:
        if self.describe_death is None:
            return ""
        try:
            async with asyncio.timeout(DEATH_DETAIL_S):
                self._end = await self.describe_death()
        except Exception:  # a diagnosis must never be what fails
            return ""
        return f"; {self._end.describe()}"

    def _send(self, frame: bytes) -> None:
        if self._dead is not None:
            raise self._dead
        self._writer.write(frame)

    def _unresponsive(self, what: str, seconds: float) -> SandboxUnresponsiveError:
        """Mark the sandbox dead because ``what`` got no reply in ``seconds``; stop writing to it."""
        err = SandboxUnresponsiveError(
            f"sandbox {self._name}: the guest agent did not answer {what} within {seconds:g}s "
            "(stopped, wedged or lying); the sandbox is marked dead"
        )
        self.mark_dead(str(err), error=err)
        with contextlib.suppress(Exception):
            self._writer.close()  # a guest that wakes up reads EOF: it kills its commands and exits
        return err

    def _violation(self, e: ProtocolError) -> ProtocolError:
        """A reply that breaks the protocol: the stream can't be trusted any more."""
        self.mark_dead(f"protocol error: {e}")
        return e

    async def _next(self, q: ReplyQueue) -> Frame:
        item = await q.get()
        if isinstance(item, BaseException):
            raise item
        if item.type == T.R_ERROR:
            errno = item.int(F.ERRNO, 0) or None
            raise guest_error(item.text(F.ETYPE), item.text(F.MESSAGE), errno)
        return item

    async def call(
        self,
        type_: T,
        fields: Sequence[tuple[F, bytes | str | int]] = (),
        *,
        expect: T | None = None,
        timeout: float | None = None,
        what: str | None = None,
    ) -> Frame:
        """One request, one reply, within ``timeout`` (default ``call_timeout``) seconds."""
        limit = self.call_timeout if timeout is None else timeout
        rid = next(self._ids)
        q = ReplyQueue()
        self._waiters[rid] = q
        try:
            self._send(encode(type_, rid, fields))
            timer = None if limit is None else asyncio.get_running_loop().call_later(limit, q.expire)
            try:
                frame = await self._next(q)
            except _Expired:
                raise self._unresponsive(what or type_.name, limit) from None
            except ProtocolError as e:
                raise self._violation(e) from None
            finally:
                if timer is not None:
                    timer.cancel()
            if expect is not None and frame.type != expect:
                raise self._violation(
                    ProtocolError(f"the guest answered {type_.name} with frame type {frame.type:#x}")
                )
            return frame
        finally:
            del self._waiters[rid]

    async def hello(self, *, set_clock: bool = False, timeout: float | None = None,
                    seccomp: bytes | None = None) -> str:
        """Check the guest speaks our protocol version. ``set_clock`` also sets the guest's
        clock to the host's (for VMs restored from a snapshot; needs CAP_SYS_TIME in the
        guest, so a bwrap sandbox ignores it) and ``clock_set`` says whether it took.
        ``seccomp``: the filter program every later command runs under
        (:func:`sandfleet.sandbox.seccomp.filter_program`); HostUnsupportedError when the
        guest can't install it (a kernel without seccomp, or an agent too old to know it)."""
        fields: list[tuple[F, bytes | str | int]] = []
        if set_clock:
            ns = time.time_ns()
            fields.append((F.TIME, f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"))
        if seccomp is not None:
            fields.append((F.SECCOMP, seccomp))
        frame = await self.call(T.HELLO, fields, expect=T.R_HELLO, timeout=timeout, what="HELLO")
        if seccomp is not None and (frame.get(F.SECCOMP) is None or frame.int(F.SECCOMP) * 8 != len(seccomp)):
            why = frame.text(F.MESSAGE) or "an agent built before it knew one?"
            raise HostUnsupportedError(f"sandbox {self._name}: the guest agent did not take the seccomp filter: {why}")
        try:
            self.clock_set = bool(frame.int(F.TIME))
            version = frame.text(F.VERSION)
            if version != VERSION:
                raise ProtocolError(f"guest agent speaks protocol {version!r}, host speaks {VERSION!r}")
            self.guest_pid = frame.int(F.PID)
        except ProtocolError as e:
            raise self._violation(e) from None
        return version

    async def exec(
        self,
        argv: Sequence[str],
        *,
        keep_stdin: bool = False,
        pty: tuple[int, int] | None = None,
        on_start: StartCallback | None = None,
        **opts: Unpack[RunOptions],
    ) -> ExecResult:
        """Run argv to completion, as ``user`` (a name or uid in the sandbox; the guest's
        default when None). The guest kills the whole tree at ``timeout``; the host waits
        ``exec_grace`` more (or, without a timeout, until the sandbox's TTL plus the grace),
        then raises :class:`SandboxUnresponsiveError`. However the wait ends early
        (cancelled, an ``on_output`` error), the command is killed.

        ``keep_stdin`` leaves stdin open after ``stdin`` is written, ``pty=(cols, rows)``
        runs the command on a new pseudo-terminal (its stdin, stdout and stderr; output comes
        as "stdout"), and ``on_start`` gets the :class:`RunningCommand` to feed it, signal it
        or resize it.
        ``network=False`` runs it in a network namespace of its own (only a loopback) that the
        guest makes before installing its seccomp filter. ``pid_namespace=True`` runs it as the
        first process of a pid namespace of its own: when it exits, the kernel kills every
        process it left (the verifier's tests, docs/security.md)."""
        if not argv:
            raise ConfigError("exec: empty command")
        if (first := self.before_first_command) is not None:
            try:
                first()
            except OSError as e:
                raise SandboxError(f"sandbox {self._name}: what comes before its first command failed, so "
                                   f"{argv[0]!r} was not sent: {e}") from None
            self.before_first_command = None
        env, cwd, stdin, timeout = opts.get("env"), opts.get("cwd"), opts.get("stdin"), opts.get("timeout")
        on_output, user = opts.get("on_output"), opts.get("user")
        fields: list[tuple[F, bytes | str | int]] = [(F.ARGV, a) for a in argv]
        if env is not None:
            fields += [(F.ENV, f"{k}={v}") for k, v in env.items()]
        if cwd is not None:
            fields.append((F.CWD, cwd))
        if timeout is not None:
            fields.append((F.TIMEOUT_MS, max(1, int(_seconds("timeout", timeout) * 1000))))
        fields.append((F.MAX_OUTPUT, min(max(0, opts.get("max_output", 1 << 20)), MAX_OUTPUT)))
        if on_output is not None:
            fields.append((F.STREAM, 1))
        if user is not None:
            fields.append((F.USER, user))
        if not opts.get("network", True):
            fields.append((F.NETWORK, 0))
        if opts.get("pid_namespace", False):
            fields.append((F.PIDNS, 1))
        if stdin:
            fields.append((F.DATA, stdin))
        if keep_stdin or pty is not None:
            fields.append((F.STDIN_MODE, "pipe"))
        if on_start is None:  # nothing here needs the pid: the guest sends EXIT (and OUTPUT) alone
            fields.append((F.NOSTART, 1))
        if pty is not None:
            cols, rows = pty
            if not (0 < cols < 65536 and 0 < rows < 65536):
                raise ConfigError(f"a terminal size is 1..65535 columns and rows, not {cols}x{rows}")
            fields.append((F.PTY, f"{cols} {rows}"))
        if timeout is not None:
            limit: float | None = timeout + self.exec_grace
            what = f"the end of {argv[0]!r} (timeout {timeout:g}s + {self.exec_grace:g}s grace)"
        elif self._expires is not None:
            limit = max(0.0, self._expires - time.monotonic()) + self.exec_grace
            what = f"the end of {argv[0]!r} (the sandbox's TTL + {self.exec_grace:g}s grace)"
        else:
            limit, what = None, ""
        rid = next(self._ids)
        q = ReplyQueue()
        self._waiters[rid] = q
        t0 = time.monotonic()
        sent = started = finished = False
        handle: RunningCommand | None = None
        timer: asyncio.TimerHandle | None = None
        try:
            self._send(encode(T.EXEC, rid, fields))
            sent = True
            if limit is not None:
                timer = asyncio.get_running_loop().call_later(limit, q.expire)
            try:
                while True:
                    frame = await self._next(q)
                    if frame.type == T.R_STARTED and not started:  # (an agent may send it unasked)
                        started = True
                        if on_start is not None:
                            handle = RunningCommand(self, rid, frame.int(F.PID), pty is not None)
                            on_start(handle)
                        continue
                    if not started and on_start is not None:
                        raise ProtocolError(f"the guest answered EXEC with frame type {frame.type:#x}")
                    started = True
                    if frame.type == T.R_OUTPUT:
                        if on_output is not None:
                            name = "stdout" if frame.int(F.STREAM_NO) == 1 else "stderr"
                            on_output(name, frame.get(F.DATA) or b"")
                        continue
                    if frame.type != T.R_EXIT:
                        raise ProtocolError(f"the guest sent frame type {frame.type:#x} for a running command")
                    break
                result = self._exec_result(frame, t0)
                finished = True
            except _Expired:
                self._kill_quietly(rid)
                raise self._unresponsive(what, math.inf if limit is None else limit) from None
            except ProtocolError as e:
                raise self._violation(e) from None
            except GuestError:
                finished = not started  # refused before it started: nothing to kill
                raise
        finally:
            del self._waiters[rid]
            if timer is not None:
                timer.cancel()
            if handle is not None:
                handle.done = True
            if sent and not finished:
                # Cancelled (even before STARTED), or the wait failed: kill the command. The
                # guest handles frames in order, so this KILL finds the job EXEC created.
                self._kill_quietly(rid)
        return result

    @staticmethod
    def _exec_result(frame: Frame, t0: float) -> ExecResult:
        out = frame.get(F.STDOUT) or b""
        dropped_out, dropped_err = frame.int(F.DROPPED_OUT), frame.int(F.DROPPED_ERR)
        return ExecResult(
            exit_code=frame.int(F.CODE),
            stdout=_text(out, dropped_out),
            stderr=_text(frame.get(F.STDERR) or b"", dropped_err),
            duration_s=frame.int(F.DURATION_US) / 1e6 or (time.monotonic() - t0),
            timed_out=bool(frame.int(F.TIMED_OUT)),
            signal=frame.int(F.SIGNAL) or None,
            stdout_dropped=dropped_out,
            stderr_dropped=dropped_err,
            stdout_bytes=out,
            detached=frame.int(F.DETACHED),
        )

    def _kill_quietly(self, target: int) -> None:
        if self._dead is None:
            with contextlib.suppress(Exception):
                frame = encode(T.KILL, next(self._ids), [(F.TARGET, target), (F.SIGNAL, signal.SIGKILL)])
                self._writer.write(frame)

    async def kill_user(self, user: str | int, *, timeout: float | None = None) -> None:
        """Kill every process of ``user`` in the sandbox; returns once they are all gone
        (KILL with TARGET 0 and USER). An agent older than this request answers OK at once
        without killing anything."""
        if user == "" or user is None:
            raise ConfigError("kill_user: no user given")
        await self.call(
            T.KILL, [(F.TARGET, 0), (F.USER, user)], expect=T.R_OK, timeout=timeout, what=f"KILL of user {user!r}"
        )

    async def kill_everyone(self, *, timeout: float | None = None) -> bool:
        """Kill every process in the sandbox but the guest agent's own and its helpers', whatever
        their uid; returns once they are all gone (KILL with TARGET 0 and USER ``*``). False where
        the agent does not know the request (older than it: it killed nothing)."""
        frame = await self.call(T.KILL, [(F.TARGET, 0), (F.USER, "*")], expect=T.R_OK, timeout=timeout,
                                what="KILL of every user")
        return frame.int(F.CODE) == 1

    async def read_file(
        self,
        path: str,
        *,
        max_bytes: int = 64 << 20,
        user: str | int | None = None,
        nofollow: bool = False,
        timeout: float | None = None,
    ) -> bytes:
        """A file's bytes (at most ``max_bytes``, else the guest raises), read as ``user``;
        ``nofollow`` refuses a symbolic link as the last path component."""
        limit = min(max(0, max_bytes), MAX_READ)
        fields: list[tuple[F, bytes | str | int]] = [(F.PATH, path), (F.MAX, limit)]
        if user is not None:
            fields.append((F.USER, user))
        if nofollow:
            fields.append((F.NOFOLLOW, 1))
        frame = await self.call(T.READ, fields, expect=T.R_DATA, timeout=timeout, what=f"READ of {path}")
        data = frame.get(F.DATA) or b""
        if len(data) > limit:
            raise self._violation(ProtocolError(f"the guest returned {len(data)} bytes for a {limit}-byte READ"))
        return data

    async def write_file(
        self,
        path: str,
        data: bytes,
        *,
        mode: int = 0o644,
        mkdirs: bool = True,
        user: str | int | None = None,
        timeout: float | None = None,
    ) -> None:
        fields: list[tuple[F, bytes | str | int]] = [(F.PATH, path), (F.DATA, data), (F.MODE, mode),
                                                    (F.MKDIRS, int(mkdirs))]
        if user is not None:
            fields.append((F.USER, user))
        await self.call(T.WRITE, fields, expect=T.R_OK, timeout=timeout, what=f"WRITE of {path}")

    async def shutdown(self, timeout: float = 2.0) -> None:
        """Ask the agent to kill its commands and exit; then close the stream."""
        if self._dead is None:
            with contextlib.suppress(Exception):
                await self.call(T.SHUTDOWN, timeout=timeout, what="SHUTDOWN")
        await self.close()

    async def close(self) -> None:
        """Close the stream; returns at once (nothing here waits on the guest)."""
        with contextlib.suppress(Exception):
            self._writer.close()
        self._reader_task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader_task
        self.mark_dead("closed")
