"""The command zygote of the guest agent (issue 46; docs/security.md, "Syscall filter"): a bwrap
sandbox's plain commands are forked from a process that installed the seccomp filter once,
instead of each installing it. It must keep every property of the old path: the commands
filtered and the agent's children, the zygote out of reach of root of the sandbox (no
ptrace, no memory, no descriptors), and a zygote that a command kills or stops costs the
next command nothing but a new zygote."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator

import pytest

from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.spec import make_spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"),
                                reason="needs bubblewrap as root")

ZYGOTES = "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = sandfleet-zygot ] && basename $p; done; true"


@contextlib.asynccontextmanager
async def sandbox() -> AsyncIterator[Sandbox]:
    sb = await create_sandbox(make_spec(backend="bwrap", ttl_s=300))
    try:
        yield sb
    finally:
        await sb.close()


async def zygotes(sb: Sandbox) -> list[str]:
    res = await sb.exec(ZYGOTES, user="root", timeout=30)
    assert res.exit_code == 0, res.output
    return res.stdout.split()


async def filtered_child_of_the_agent(sb: Sandbox, user: str = "agent") -> None:
    res = await sb.exec("grep -E '^(Seccomp|PPid):' /proc/self/status", user=user, timeout=30)
    assert res.exit_code == 0, res.output
    assert res.stdout.split() == ["PPid:", "1", "Seccomp:", "2"], res.output


async def test_commands_come_from_one_filtered_zygote_that_root_cannot_reach() -> None:
    async with sandbox() as sb:
        for user in ("agent", "root", "verifier"):
            await filtered_child_of_the_agent(sb, user)
        zs = await zygotes(sb)
        assert len(zs) == 1, zs  # one, made at the first command, kept for the next
        z = zs[0]
        res = await sb.exec(f"grep -E '^(Seccomp|Uid):' /proc/{z}/status", user="root", timeout=30)
        # filtered; its uid (the agent's) is unmapped in the sandbox's user namespace
        assert res.stdout.split()[:2] == ["Uid:", "65534"] and res.stdout.split()[-2:] == ["Seccomp:", "2"], res.output
        # root of the sandbox reaches none of it (as with the agent): its memory, environment, its
        # descriptors (it may list their numbers, as the agent's, but neither read nor open them), ptrace
        for probe in (f"cat /proc/{z}/environ", f"head -c1 /proc/{z}/mem", f"readlink /proc/{z}/fd/64",
                      f"cat /proc/{z}/fd/0 </dev/null",
                      f"python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); "
                      f"sys.exit(0 if l.ptrace(16,{z},0,0)==0 else 1)'"):
            res = await sb.exec(probe, user="root", timeout=30)
            assert res.exit_code != 0, (probe, res.output)
        assert await zygotes(sb) == [z]


async def test_a_killed_zygote_is_replaced_at_the_next_command() -> None:
    async with sandbox() as sb:
        await filtered_child_of_the_agent(sb)
        (z,) = await zygotes(sb)
        res = await sb.exec(f"kill -9 {z}", user="root", timeout=30)  # root of the sandbox may signal it
        assert res.exit_code == 0, res.output
        for _ in range(5):
            await filtered_child_of_the_agent(sb)
        zs = await zygotes(sb)
        assert len(zs) == 1 and zs != [z], (z, zs)


async def test_a_stopped_zygote_holds_up_no_command() -> None:
    async with sandbox() as sb:
        await filtered_child_of_the_agent(sb)
        (z,) = await zygotes(sb)
        assert (await sb.exec(f"kill -STOP {z}", user="root", timeout=30)).exit_code == 0
        t = time.monotonic()
        await filtered_child_of_the_agent(sb)  # the request was never read: forked by the agent itself
        assert time.monotonic() - t < 20
        for _ in range(3):
            await filtered_child_of_the_agent(sb)
        zs = await zygotes(sb)
        assert len(zs) == 1 and zs != [z], (z, zs)  # the stopped one killed, a new one made


async def test_kill_all_as_root_then_commands_at_once() -> None:
    """`kill -9 -1` as root of the sandbox (a cleanup script's line) takes the zygote with the rest;
    commands started right after, some at the same time, all run filtered."""
    async with sandbox() as sb:
        await filtered_child_of_the_agent(sb)
        res = await sb.exec("kill -9 -1; true", user="root", timeout=30)
        assert res.exit_code in (0, -9, 137), res.output
        await asyncio.gather(*(filtered_child_of_the_agent(sb) for _ in range(8)))


async def test_a_large_environment_and_a_terminal_run_filtered() -> None:
    async with sandbox() as sb:
        big = {"BIG": "x" * (100 * 1024)}  # more than the zygote takes: forked by the agent itself
        res = await sb.exec("echo ${#BIG}; grep -E '^(PPid|Seccomp):' /proc/self/status", env=big, timeout=30)
        assert res.stdout.split() == [str(100 * 1024), "PPid:", "1", "Seccomp:", "2"], res.output
        res = await sb.exec("tty >/dev/null && grep '^Seccomp:' /proc/self/status", pty=(80, 24), timeout=30)
        assert res.exit_code == 0 and "Seccomp:\t2" in res.stdout.replace(" ", "\t"), res.output
