"""sandfleet.reaping's waits for pinned children (bwrap's own child at a sandbox's close)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from sandfleet.reaping import wait_adopted


def _child(seconds: float) -> tuple[int, int]:
    """A child of this process that exits after ``seconds``, and a pidfd that pins it."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    pid = os.posix_spawn(sleep, [sleep, str(seconds)], {})
    return pid, os.pidfd_open(pid)


def _gone(pid: int, fd: int) -> None:
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped already: no zombie left
    try:  # its pidfd closed (the number may be taken again already, by a thread of this worker: no pidfd then)
        held = str(Path(f"/proc/self/fd/{fd}").readlink())
    except OSError:
        return
    assert "pidfd" not in held, (fd, held)


async def test_waits_on_the_loop_then_reaps_and_closes() -> None:
    (a, fa), (b, fb) = _child(0), _child(0.3)
    ticks = 0

    async def ticker() -> None:  # the loop keeps running while it waits: no thread, no blocking
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    await wait_adopted([fa, fb])
    t.cancel()
    assert ticks >= 10, ticks
    _gone(a, fa)
    _gone(b, fb)


async def test_cancelled_it_still_reaps_every_child_and_closes_every_pidfd() -> None:
    kids = [_child(0.3), _child(0.3)]
    task = asyncio.create_task(wait_adopted([fd for _, fd in kids]))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for pid, fd in kids:
        _gone(pid, fd)
