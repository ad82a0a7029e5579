"""Round XII (2026-12-05): the guest agent's own stream to the host. Every verdict rests on the
frames the host reads from the agent; a process of the sandbox that could write there could answer
the reward's read with a 1. Under gVisor root's commands could open the agent's stdin and stdout
pipes again through ``/proc/1/fd`` (for reading and writing) and its log (a host file, without a
cap); on bwrap and microvm the kernel refuses (the agent is not dumpable). The stream, the log and
the agent's wake-up pair are sockets now, which ``/proc`` can't open again (ENXIO)."""

from __future__ import annotations

import pytest

from conftest import backend_skip
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.spec import SandboxSpec

REACH = r'''
import os
pid1 = open("/proc/1/cmdline", "rb").read()
print("agent" if b"sandfleet-agent" in pid1 or b"/run/sandfleet/agent" in pid1 else "other", pid1[:40])
for n in (0, 1, 2, 3, 4):
    for mode in (os.O_WRONLY, os.O_RDONLY):
        try:
            fd = os.open(f"/proc/1/fd/{n}", mode | os.O_NONBLOCK)
        except OSError as e:
            print(n, mode, "refused", e.errno)
        else:
            os.close(fd)
            print(n, mode, "OPENED", os.readlink(f"/proc/1/fd/{n}"))
'''


@pytest.mark.parametrize("backend", ["bwrap", "gvisor"])
async def test_root_in_the_sandbox_cant_open_the_agents_stream_log_or_wakeups(backend: str) -> None:
    why = backend_skip(backend)
    if why:
        pytest.skip(why)
    sb = await create_sandbox(SandboxSpec(backend=backend, image="host"))
    try:
        res = await sb.exec(["python3", "-c", REACH], user="root")
    finally:
        await sb.close()
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("agent"), lines[0]  # pid 1 is the guest agent: what is probed is its table
    opened = [line for line in lines[1:] if "OPENED" in line]
    assert not opened, f"{backend}: root opened the guest agent's descriptors: {opened}"
