"""A sandbox closes cleanly in an owner that holds more than FD_SETSIZE (1024) descriptors:
a busy owner (the service, `bench micro`'s idle sandboxes) has them, and select() refuses
any fd past 1024 ("filedescriptor out of range in select()" on every close once it had)."""

from __future__ import annotations

import os

import pytest

from conftest import backend_skip
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.spec import SandboxSpec


async def test_create_exec_close_with_fds_past_fd_setsize() -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        assert max(held) > 1024
        for _ in range(2):
            sb = await create_sandbox(SandboxSpec(backend="bwrap", limits={"ttl_s": 60}))
            try:
                assert (await sb.exec(["echo", "ok"], timeout=30)).stdout == "ok\n"
            finally:
                await sb.close()  # raised ValueError from select() in the reaper before
    finally:
        for fd in held:
            os.close(fd)
