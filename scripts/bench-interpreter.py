#!/usr/bin/env python3
"""One cell against one command, round trip, in the same run and the same sandbox:
``x += 1`` in the sandbox's kernel (:class:`sandfleet.interpreter.Kernel`) against an exec
of ``true``, alternating, two ways:

- in process: ``Kernel(sb).run`` vs ``sb.exec(["true"])`` on a bwrap sandbox (no HTTP);
- through ``sandfleet serve`` on loopback with the unmodified SDKs: the
  e2b-code-interpreter SDK's ``run_code`` vs the e2b SDK's ``commands.run("true")``;
- through the same service with sandfleet's client: ``RemoteSandbox.run_code`` (``/v1``)
  vs ``RemoteSandbox.exec(["true"])``.

``scripts/bench-interpreter.py [N]`` (default 200): prints p50 and p90 in ms of each.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from sandfleet.interpreter import Kernel  # noqa: E402
from sandfleet.sandbox import create_sandbox  # noqa: E402
from sandfleet.stats import percentile  # noqa: E402


def show(where: str, got: dict[str, list[float]]) -> None:
    for name, ts in got.items():
        print(f"{where:11} {name:28} p50 {percentile(ts, 50):7.2f} ms  p90 {percentile(ts, 90):7.2f} ms"  # noqa: T201
              f"  over {len(ts)}")


async def in_process(n: int, backend: str) -> None:
    sb = await create_sandbox(backend=backend, ttl_s=600)
    k = Kernel(sb)
    try:
        await k.run("x = 0")
        got: dict[str, list[float]] = {"cell x += 1": [], "exec true": []}
        for i in range(n):
            for name in (list(got) if i % 2 == 0 else list(reversed(got))):
                t = time.perf_counter()
                if name == "exec true":
                    await sb.exec(["true"])
                else:
                    await k.run("x += 1")
                got[name].append((time.perf_counter() - t) * 1e3)
        show(f"{backend}", got)
    finally:
        await k.close()
        await sb.close()


async def through_v1(n: int, url: str, token: str) -> None:
    from sandfleet.client import connect

    async with await connect(url, token) as c, await c.create_sandbox(ttl_s=600) as sb:
        await sb.run_code("x = 0")
        got: dict[str, list[float]] = {"run_code('x += 1')": [], "exec(['true'])": []}
        for i in range(n):
            for name in (list(got) if i % 2 == 0 else list(reversed(got))):
                t = time.perf_counter()
                if name == "exec(['true'])":
                    await sb.exec(["true"])
                else:
                    await sb.run_code("x += 1")
                got[name].append((time.perf_counter() - t) * 1e3)
        show("/v1 client", got)


def through_service(n: int) -> None:
    from e2b_code_interpreter import Sandbox

    from sandfleet.server.testing import running_service

    with running_service(Path(tempfile.mkdtemp(prefix="bench-ci-")), args=["--max-ttl", "900"]) as s:
        asyncio.run(through_v1(n, s.url, s.token))
        os.environ.update({"E2B_API_URL": s.url, "E2B_SANDBOX_URL": s.url, "E2B_API_KEY": s.token})
        sbx = Sandbox.create(timeout=600)
        try:
            sbx.run_code("x = 0")
            ways: dict[str, Callable[[], object]] = {"run_code('x += 1')": lambda: sbx.run_code("x += 1"),
                                                     "commands.run('true')": lambda: sbx.commands.run("true")}
            got: dict[str, list[float]] = {k: [] for k in ways}
            for i in range(n):
                for name in (list(ways) if i % 2 == 0 else list(reversed(ways))):
                    t = time.perf_counter()
                    ways[name]()
                    got[name].append((time.perf_counter() - t) * 1e3)
            show("e2b SDK", got)
        finally:
            sbx.kill()


def main(n: int) -> None:
    asyncio.run(in_process(n, "bwrap"))
    through_service(n)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
