"""Findings 20 (host half), 26 and 30: every host-side call has a deadline, frames from the
guest are bounded, any failure of the read loop wakes every waiter, and an exec cancelled
before STARTED is still killed.

A stopped guest agent is a real one, SIGSTOPped (as a ptrace attach leaves it); a lying or
wedged guest is a small peer on a real socket pair that speaks the wire format.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from sandfleet.agent.client import AgentClient
from sandfleet.agent.protocol import F, Frame, T, decode, encode
from sandfleet.errors import ConfigError, SandboxDiedError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox

HUNG = "hung"


async def outcome(aw: Awaitable[Any], within: float) -> Any:
    """The result or exception of ``aw``, or HUNG when it took longer than ``within`` s."""
    try:
        async with asyncio.timeout(within):
            return await aw
    except TimeoutError as e:
        # asyncio.timeout's own expiry is a bare TimeoutError from the cancelled wait
        if type(e) is TimeoutError and not str(e):
            return HUNG
        return e
    except Exception as e:
        return e


# -- a real guest agent, stopped ------------------------------------------------------------


def agent_host_pid(sb: Any) -> int:
    """The host pid of a local sandbox's guest agent (its pid in its own namespace is
    ``client.guest_pid``; /proc/*/status NSpid maps one to the other)."""
    guest, top = sb.client.guest_pid, sb.agent.proc.pid

    def descends(pid: int) -> bool:
        for _ in range(64):
            if pid == top:
                return True
            if pid <= 1:
                return False
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return False
            pid = int(status.split("\nPPid:", 1)[1].split()[0])
        return False

    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        nspid = next((ln.split()[1:] for ln in text.splitlines() if ln.startswith("NSpid:")), [])
        if nspid and int(nspid[-1]) == guest and descends(int(nspid[0])):
            return int(nspid[0])
    raise AssertionError(f"the guest agent (pid {guest} in the sandbox) is not among the host's processes")


LOCAL = pytest.mark.parametrize("backend", ["process", "bwrap"], indirect=True)
"""Backends whose guest agent is a host process the test can stop (the microVM's runs in
its own kernel)."""


@pytest.fixture
async def local_sb(backend: str) -> AsyncIterator[Sandbox]:
    box: Any = await create_sandbox(backend=backend, ttl_s=120)
    box.client.call_timeout = 1.5  # after start-up: a cold bwrap start may take longer than that
    try:
        yield box
    finally:
        with contextlib.suppress(Exception):
            os.kill(agent_host_pid(box), signal.SIGCONT)
        await box.close()


@LOCAL
async def test_stopped_agent_ends_every_call_within_its_deadline(local_sb: Sandbox) -> None:
    """SIGSTOP the guest agent (what a ptrace attach does): a file read gets no reply and
    raises SandboxUnresponsiveError (reason agent_unresponsive) at its deadline; an exec
    in flight, with no timeout of its own, wakes with the same error; the sandbox is dead."""
    sb: Any = local_sb
    pid = agent_host_pid(sb)
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    longer = asyncio.create_task(outcome(sb.exec(["sleep", "100"]), within=20))
    read = await outcome(sb.read_file("/etc/hostname"), within=20)
    took = time.monotonic() - t0
    assert read is not HUNG, "read_file on a stopped guest agent never returned"
    assert isinstance(read, TimeoutError), f"read_file returned {read!r}"
    assert getattr(read, "reason", None) == "agent_unresponsive", f"no clear reason: {read!r}"
    assert took < 10, f"the deadline was 1.5 s but the read took {took:.1f} s"
    assert not sb.alive, "an unresponsive sandbox still counts as alive"
    other = await longer
    assert other is not HUNG, "an exec in flight stayed blocked after the sandbox was found unresponsive"
    assert getattr(other, "reason", None) == "agent_unresponsive", f"the exec in flight got {other!r}"
    assert time.monotonic() - t0 < 10


@LOCAL
async def test_exec_cancelled_before_started_is_killed(local_sb: Sandbox) -> None:
    """The agent is stopped while the host sends EXEC and the caller gives up; once the agent
    runs again the command must not: the host sent KILL for that request right after it."""
    sb: Any = local_sb
    marker = f"cancelled-marker-{uuid.uuid4().hex[:8]}"  # relative: in the sandbox's workdir
    pid = agent_host_pid(sb)
    os.kill(pid, signal.SIGSTOP)
    try:
        task = asyncio.create_task(sb.exec(["sh", "-c", f"sleep 1; echo ran > {marker}"]))
        await asyncio.sleep(0.2)  # EXEC is written; STARTED can't come from a stopped agent
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        os.kill(pid, signal.SIGCONT)
    await asyncio.sleep(2.0)
    res = await sb.exec(["sh", "-c", f"cat {marker} 2>/dev/null || echo absent; rm -f {marker}"])
    assert res.stdout.strip() == "absent", "a command cancelled before STARTED ran to completion"


async def test_call_timeout_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=a)
    try:
        monkeypatch.setenv("SANDFLEET_CALL_TIMEOUT", "soon")
        with pytest.raises(ConfigError, match="SANDFLEET_CALL_TIMEOUT"):
            AgentClient(reader, writer, name="t")
        monkeypatch.setenv("SANDFLEET_CALL_TIMEOUT", "2.5")
        client = AgentClient(reader, writer, name="t")
        assert getattr(client, "call_timeout", None) == 2.5
        await client.close()
    finally:
        writer.close()
        b.close()


# -- a wedged or lying guest on a real socket pair -----------------------------------------

Reply = Callable[[Frame], list[bytes]]


class Guest:
    """The guest end of a socket pair: answers HELLO, records every request, and replies to
    the others with ``reply(frame)`` (nothing by default: a wedged agent)."""

    def __init__(self, sock: socket.socket, reply: Reply | None = None):
        self.sock = sock
        self.reply = reply or (lambda f: [])
        self.got: list[Frame] = []
        self.task: asyncio.Task[None] | None = None

    async def serve(self) -> None:
        reader, writer = await asyncio.open_connection(sock=self.sock)
        self.writer = writer
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                n = struct.unpack(">I", await reader.readexactly(4))[0]
                frame = decode(await reader.readexactly(n))
                self.got.append(frame)
                if frame.type == T.HELLO:
                    out = [encode(T.R_HELLO, frame.id, [(F.VERSION, "1"), (F.PID, 2)])]
                else:
                    out = self.reply(frame)
                for b in out:
                    writer.write(b)
                await writer.drain()

    def send(self, data: bytes) -> None:
        self.writer.write(data)


@contextlib.asynccontextmanager
async def guest_pair(reply: Reply | None = None, **kw: Any) -> AsyncIterator[tuple[AgentClient, Guest]]:
    a, b = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=a)
    guest = Guest(b, reply)
    guest.task = asyncio.create_task(guest.serve())
    client = AgentClient(reader, writer, name="t", **kw)
    try:
        await client.hello()
        yield client, guest
    finally:
        await client.close()
        guest.task.cancel()
        with contextlib.suppress(BaseException):
            await guest.task
        with contextlib.suppress(Exception):
            guest.writer.close()


async def test_exec_deadline_is_timeout_plus_grace() -> None:
    """The guest never reports the end of a command: the host gives up at timeout + grace,
    sends KILL for it, and marks the sandbox dead."""
    async with guest_pair(call_timeout=5, exec_grace=0.5) as (client, guest):
        t0 = time.monotonic()
        res = await outcome(client.exec(["sleep", "9"], timeout=0.3), within=10)
        took = time.monotonic() - t0
        assert getattr(res, "reason", None) == "agent_unresponsive", res
        assert 0.7 <= took < 3, took
        assert not client.alive
        exec_id = next(f.id for f in guest.got if f.type == T.EXEC)
        await asyncio.sleep(0.05)
        kills = [f for f in guest.got if f.type == T.KILL]
        assert any(f.int(F.TARGET) == exec_id for f in kills), "no KILL for the abandoned command"


async def test_exec_without_timeout_is_bounded_by_the_ttl() -> None:
    async with guest_pair(ttl=0.5, exec_grace=0.3) as (client, _):
        t0 = time.monotonic()
        res = await outcome(client.exec(["sleep", "inf"]), within=10)
        assert getattr(res, "reason", None) == "agent_unresponsive", res
        assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("op", ["read_file", "write_file", "kill_user", "hello"])
async def test_file_ops_and_kills_have_deadlines(op: str) -> None:
    async with guest_pair(reply=lambda f: [], call_timeout=0.4) as (client, _):
        calls = {
            "read_file": lambda: client.read_file("/x"),
            "write_file": lambda: client.write_file("/x", b"y"),
            "kill_user": lambda: client.kill_user("agent"),
            "hello": lambda: client.call(T.SHUTDOWN),
        }
        res = await outcome(calls[op](), within=5)
        assert getattr(res, "reason", None) == "agent_unresponsive", res
        assert not client.alive


async def test_huge_frame_from_the_guest_is_refused() -> None:
    """Finding 26: a frame header of ~4 GiB is refused at once, not buffered; every waiter
    wakes with the reason."""
    async with guest_pair() as (client, guest):
        pending = asyncio.create_task(outcome(client.read_file("/etc/hostname"), within=5))
        second = asyncio.create_task(outcome(client.exec(["true"]), within=5))
        await asyncio.sleep(0.05)
        guest.send(struct.pack(">I", 0xFFFFFFF0) + b"\x85" + b"\0" * 1000)
        for res in (await pending, await second):
            assert res is not HUNG, "a waiter hung after an oversized frame"
            assert isinstance(res, SandboxDiedError), res
            assert "limit" in str(res), res
        assert not client.alive


@pytest.mark.parametrize("exc", [ValueError("bad"), MemoryError(), RuntimeError("boom"), KeyError(1)])
async def test_any_read_loop_failure_wakes_every_waiter(exc: BaseException) -> None:
    """Finding 26: whatever breaks the read loop (here raised by the stream itself, as a
    transport does), mark_dead runs and no waiter hangs."""
    async with guest_pair() as (client, _):
        waiters = [asyncio.create_task(outcome(client.read_file(f"/f{i}"), within=5)) for i in range(3)]
        await asyncio.sleep(0.05)
        client._reader.set_exception(exc)
        for w in waiters:
            res = await w
            assert res is not HUNG, f"a waiter hung after {exc!r} in the read loop"
            assert isinstance(res, SandboxDiedError), res
        assert not client.alive
