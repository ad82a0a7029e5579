"""A sandbox's close finishes in a forked child of a process that closed sandboxes before
(the blocking part of a close runs on per-process cleanup threads; a child that inherited
the parent's executor without its threads hung in close). The process backend: the close
path is every local backend's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import asyncio, os, sys
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.spec import SandboxSpec

    async def one():
        sb = await create_sandbox(SandboxSpec(backend="process", limits={"ttl_s": 60}))
        assert (await sb.exec(["echo", "ok"])).stdout == "ok\\n"
        await sb.close()

    asyncio.run(one())  # the parent's cleanup threads exist now
    pid = os.fork()
    if pid == 0:
        try:
            asyncio.run(asyncio.wait_for(one(), 30))
        except BaseException as e:
            print("child:", type(e).__name__, e, flush=True)
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    asyncio.run(one())  # and the parent's still work
    sys.exit(os.waitstatus_to_exitcode(status))
""")


def test_close_in_a_forked_child() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
