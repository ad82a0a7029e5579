"""Policies that make faults happen in real rollouts (tests, chaos runs, demos).

:class:`KillFromHost` kills its sandbox's process from the host (the sandbox dies under the
agent: an infra fault, not its doing); :class:`Staggered` runs one command list in the first
rollout it acts in and another in the rest (one member of a group finishes early while the
others are still running: how a node lost mid-group is shown to keep its finished members).
Both are plain policies (:class:`~sandfleet.rollout.policy.Policy`), picklable for Ray.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Sequence
from typing import Any

from sandfleet.rollout.policy import AgentContext


class KillFromHost:
    """In the first ``kills`` rollouts it acts in, SIGKILL the sandbox's process (bwrap's, or
    the microvm's QEMU) from the host, then run ``commands``; in the others just run them."""

    name = "kill-from-host"

    def __init__(self, kills: int, commands: Sequence[str] = ("echo hello > /app/out.txt",)):
        self.kills = kills
        self.commands = list(commands)

    async def act(self, ctx: AgentContext) -> str:
        if self.kills > 0:
            self.kills -= 1
            kill_from_host(ctx.sandbox)
        for command in self.commands:
            ctx.turns += 1
            await ctx.run(command)
        return "done"


def kill_from_host(sb: Any) -> None:
    """SIGKILL a sandbox's process on this host: its own (bwrap's launcher, the microvm's
    QEMU), or, for a sandbox of a service on this host sharing its state directory, the one
    its marker names. Returns once that process has ended: a command sent after the kill
    never reaches a sandbox still alive for a moment (CI, 2026-12-05: an exec sent at once was
    answered by the agent before bwrap's death took it down)."""
    proc = getattr(getattr(sb, "vm", None), "proc", None) or getattr(getattr(sb, "agent", None), "proc", None)
    if proc is not None:
        pidfd = _pidfd(proc.pid)
        proc.kill()
    else:
        from sandfleet.sandbox.state import read_meta, state_root

        meta = read_meta(state_root() / str(sb.id)) or {}
        pids = meta.get("pids") or []
        if not pids:
            raise TypeError(f"{type(sb).__name__} {sb.id}: no host process to kill here "
                            f"(no marker under {state_root()})")
        pidfd = _pidfd(int(pids[0]))
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    if pidfd >= 0:
        try:  # readable once the process has exited (a zombie included)
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            if not poller.poll(10_000):
                raise TimeoutError(f"{type(sb).__name__} {sb.id}: its process outlived SIGKILL for 10 s")
        finally:
            os.close(pidfd)


def _pidfd(pid: int) -> int:
    """A pidfd of ``pid``, or -1 where it has ended (and been reaped) already."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1


class Staggered:
    """Runs ``first`` in the first rollout it acts in and ``rest`` in every later one."""

    name = "staggered"

    def __init__(self, first: Sequence[str], rest: Sequence[str]):
        self.first, self.rest = list(first), list(rest)
        self.calls = 0

    async def act(self, ctx: AgentContext) -> str:
        self.calls += 1
        for command in self.first if self.calls == 1 else self.rest:
            ctx.turns += 1
            await ctx.run(command)
        return "done"
