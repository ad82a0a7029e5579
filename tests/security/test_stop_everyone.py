"""The verifier's stop of a root agent (or of root tests) in one request: the guest agent's KILL
of USER ``*`` (docs/protocol.md), every process but its own, whatever its uid. Before it, the
verifier killed root's, the agent's and the verifier's, listed the uids /proc showed with a bash
and a sort (85-130 ms on gVisor), then killed each: round XIII's daemons hunted that list.

What root leaves here, from its own sandbox: daemons under a uid no kill_user names (4242, and
65534, the overflow uid the agent itself shows as in S), one stopped, one in a pid namespace of its
own, and a chain that forks itself under a new uid every few milliseconds. After the stop nothing
of them is left, the sandbox still runs commands, and a sandbox whose runtime can't ask it in one
request (a remote or held one) says so: the verifier then goes user by user."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from conftest import backend_skip
from sandfleet.errors import ConfigError
from sandfleet.rollout.verifier import stop_everything_of
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from test_rollout_support import make_task

BACKENDS = pytest.mark.parametrize("backend", [
    pytest.param("bwrap", marks=pytest.mark.skipif(bool(backend_skip("bwrap")), reason=str(backend_skip("bwrap")))),
    pytest.param("gvisor", marks=[pytest.mark.slow, pytest.mark.skipif(
        bool(backend_skip("gvisor")), reason=str(backend_skip("gvisor")))]),
    pytest.param("microvm", marks=[pytest.mark.slow, pytest.mark.skipif(
        bool(backend_skip("microvm")), reason=str(backend_skip("microvm")))]),
])

LEAVE = r"""
import os, signal, sys, time

def daemon(uid, then):
    if os.fork():
        return
    os.setsid()
    if os.fork():
        os._exit(0)
    if uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    then()
    os._exit(0)

def sleep():
    while True:
        time.sleep(1)

def stopped():
    os.kill(os.getpid(), signal.SIGSTOP)
    sleep()

def chain():
    uid = 5000
    while True:  # a root link leaves a process under a new uid, forks the next link and exits
        uid = 5000 + (uid - 4999) % 20000
        if os.fork() == 0:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            time.sleep(0.2)
            os._exit(0)
        if os.fork():
            os._exit(0)
        time.sleep(0.005)

def own_pid_namespace():
    import ctypes
    if ctypes.CDLL(None, use_errno=True).unshare(0x20000000) != 0:  # CLONE_NEWPID
        print(f"no pid namespace: errno {ctypes.get_errno()}", file=sys.stderr)
        sleep()
    if os.fork() == 0:
        sleep()
    sleep()

for uid, then in ((0, sleep), (4242, sleep), (65534, sleep), (4343, stopped), (0, own_pid_namespace), (0, chain)):
    daemon(uid, then)
time.sleep(0.5)
print("left")
"""

LIST = r"""
import os
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        status = dict(line.split(":", 1) for line in open(f"/proc/{p}/status").read().splitlines() if ":" in line)
        cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").replace(b"\n", b" ")
        cmd = cmd.decode(errors="replace")[:60]
    except OSError:
        continue
    # (pid 1: the guest agent, also a microVM's init; no command line: a microVM's kernel threads)
    agent = "sandfleet-agent" in cmd or "/run/sandfleet/agent" in cmd
    if status["State"].split()[0] != "Z" and p != "1" and cmd and not agent:
        print(p, status["Uid"].split()[0], status["State"].split()[0], cmd)
"""


async def others(sb: Sandbox) -> list[str]:
    """Every live process /proc shows, but the guest agent's own (its command zygote's too) and this
    listing's: "pid uid state cmdline"."""
    res = await sb.exec(["python3", "-c", LIST], cwd="/", user="root", timeout=60)
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


@BACKENDS
async def test_root_leaves_nothing_the_stop_does_not_kill(backend: str, tmp_path: Path,
                                                         with_python_base_cache: Path) -> None:
    from sandfleet.tasks.images import build_task_image

    image = build_task_image(make_task(tmp_path)).hash if backend != "bwrap" else "host"  # (a python3)
    sb = await create_sandbox(backend=backend, image=image, ttl_s=300, user="root")
    try:
        res = await sb.exec(["python3", "-c", LEAVE], cwd="/", user="root", timeout=60)
        assert res.exit_code == 0 and "left" in res.stdout, res.output
        await asyncio.sleep(0.3)
        left = await others(sb)
        uids = {line.split()[1] for line in left}
        assert {"0", "4242", "65534"} <= uids, left  # the daemons run, under their uids (and one stopped)
        assert await sb.kill_everyone() is True
        assert await others(sb) == []
        # and once more through the verifier's own stop, after another round of daemons
        await sb.exec(["python3", "-c", LEAVE], cwd="/", user="root", timeout=60)
        await stop_everything_of(sb, "root")
        assert await others(sb) == []
        res = await sb.exec(["sh", "-c", "echo still"], cwd="/", user="root", timeout=30)
        assert res.stdout == "still\n", res.output
    finally:
        await sb.close()


@pytest.mark.skipif(bool(backend_skip("bwrap")), reason=str(backend_skip("bwrap")))
async def test_through_the_service_too(running_services: Any) -> None:
    """``/kill`` of user ``*``: the remote sandbox's stop is one request as well (a service older than it
    refuses ``*`` as a user name, 400, and the verifier goes user by user)."""
    from sandfleet.client import ServiceClient

    svc = running_services.view()
    async with ServiceClient(svc.url, svc.token) as client:
        sb = await client.create_sandbox(backend="bwrap", ttl_s=120, user="root")
        try:
            res = await sb.exec(["python3", "-c", LEAVE], cwd="/", user="root", timeout=60)
            assert res.exit_code == 0 and "left" in res.stdout, res.output
            await asyncio.sleep(0.3)
            assert {line.split()[1] for line in await others(sb)} >= {"0", "4242", "65534"}
            assert await sb.kill_everyone() is True
            assert await others(sb) == []
            with pytest.raises(ConfigError, match="invalid user name"):  # "*" and nothing else
                await sb.kill_user("**")
        finally:
            await sb.close()


@pytest.mark.skipif(bool(backend_skip("bwrap")), reason=str(backend_skip("bwrap")))
async def test_a_command_right_after_the_stop_starts() -> None:
    """The stop's kill(-1) ends the guest's command zygote too, which the next command starts anew: it
    is reaped before the stop answers. Before, the next command now and then went to the dying zygote and
    failed to start ("the sandbox's command zygote was lost": 2 of 300 here at ffa025d, and a rollout of
    round XV's core-pattern-helper in --verify separate)."""
    sb = await create_sandbox(backend="bwrap", ttl_s=120, user="root")
    try:
        for _ in range(300):
            await sb.exec(["true"], user="root")
            assert await sb.kill_everyone() is True
            assert (await sb.exec(["true"], user="root")).exit_code == 0
    finally:
        await sb.close()
