"""SWE-ReX's interactive commands and ``expect`` on a sandfleet session, through a pty.

SWE-ReX types into one long-lived shell; a sandfleet session runs each command in a fresh
bash. A command sent with ``is_interactive_command`` (or with ``expect`` strings) therefore
starts as the session's *program*: the session's bash runs it on a pseudo-terminal in the
guest agent, and the call returns at the first of its ``expect`` strings (SWE-ReX's
``expect_string``), or when it ends. While it runs, the session's next interactive commands
are typed into it (a line each) and read up to an ``expect`` string again;
``is_interactive_quit`` types its command and waits for the program to end. A plain command
sent while a program runs is refused, naming the program. Output is the terminal's, with
escape sequences and carriage returns removed and the echoed line dropped, as SWE-ReX does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from sandfleet.agent.client import ExecResult, RunningCommand
from sandfleet.sandbox.base import Session

PTY_SIZE = (200, 50)
DEFAULT_TIMEOUT_S = 3600.0
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\r")


class ExpectTimeout(Exception):
    """None of the expected strings came (nor the end) in time."""


@dataclass(eq=False)
class Program:
    command: str
    task: asyncio.Task[ExecResult] | None = None
    handle: RunningCommand | None = None
    out: bytearray = field(default_factory=bytearray)
    seen: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ended(self) -> bool:
        return self.task is not None and self.task.done()

    def type_line(self, line: str) -> None:
        if self.handle is None or self.ended:
            raise ExpectTimeout(f"the program {self.command!r} has ended")
        self.handle.send_stdin(line.encode() + b"\n")


def clean(text: str, typed: str = "") -> str:
    """Terminal output as SWE-ReX returns it: no escape sequences or CRs, no echoed line."""
    out = _CONTROL.sub("", text)
    return out.lstrip().removeprefix(typed).strip() if typed else out.strip()


async def start(s: Session, command: str, on_end: Callable[[], None]) -> Program:
    """Run ``command`` as the session's program, on a pty; returns once it has started."""
    p = Program(command=command)

    def on_output(_name: str, data: bytes) -> None:
        p.out += data
        p.changed.set()

    def on_start(h: RunningCommand) -> None:
        p.handle = h
        p.started.set()

    async def run() -> ExecResult:
        try:
            return await s.run(command, pty=PTY_SIZE, on_output=on_output, on_start=on_start, max_output=0)
        finally:
            p.started.set()
            p.changed.set()
            on_end()

    p.task = asyncio.create_task(run())
    await p.started.wait()
    return p


async def expect(p: Program, patterns: list[str], timeout: float | None) -> tuple[str, str]:
    """(output since the last look, up to and without the first pattern found; the pattern,
    or "" when the program ended first). ExpectTimeout after ``timeout`` seconds."""
    needles = [x.encode() for x in patterns if x]
    try:
        async with asyncio.timeout(timeout or DEFAULT_TIMEOUT_S):
            while True:
                p.changed.clear()
                hits = [(i, n) for n in needles if (i := p.out.find(n, p.seen)) >= 0]
                if hits:
                    i, n = min(hits, key=lambda h: h[0])
                    text = bytes(p.out[p.seen:i]).decode(errors="replace")
                    p.seen = i + len(n)
                    return text, n.decode()
                if p.ended:
                    text = bytes(p.out[p.seen:]).decode(errors="replace")
                    p.seen = len(p.out)
                    return text, ""
                await p.changed.wait()
    except TimeoutError:
        raise ExpectTimeout(f"none of {patterns!r} within {timeout}s") from None


async def wait_end(p: Program, timeout: float | None) -> str:
    """The program's output until it ends (ExpectTimeout after ``timeout`` seconds)."""
    if p.task is None:
        return ""
    try:
        async with asyncio.timeout(timeout or DEFAULT_TIMEOUT_S):
            await asyncio.wait({p.task})
    except TimeoutError:
        raise ExpectTimeout(f"the program {p.command!r} did not end within {timeout}s") from None
    text = bytes(p.out[p.seen:]).decode(errors="replace")
    p.seen = len(p.out)
    return text


async def stop(p: Program) -> None:
    if p.task is not None and not p.task.done():
        p.task.cancel()
        await asyncio.wait({p.task})
