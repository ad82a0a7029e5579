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

``scripts/bench-interpreter.py --concurrent K CELLS`` (issue 47's "64 concurrent kernels each
running 20 cells"): K bwrap sandboxes at once, each running CELLS cells (``x += 1``) in its
kernel, against the same K sandboxes each running CELLS fresh ``python3 -c`` processes
(SandboxFusion's way: one interpreter per call), alternating the two in rounds; prints cells
per second of each (the kernels' start counted in theirs) and the ratio.
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


async def concurrent(k: int, cells: int, rounds: int = 3, backend: str = "bwrap") -> None:
    sbs = await asyncio.gather(*(create_sandbox(backend=backend, ttl_s=1800) for _ in range(k)))
    try:
        async def kernel(sb: object) -> None:
            kern = Kernel(sb)  # type: ignore[arg-type]
            try:
                await kern.run("x = 0")
                for _ in range(cells - 1):
                    r = await kern.run("x += 1")
                    assert r.error is None, r.error
            finally:
                await kern.close()

        async def fresh(sb: object) -> None:
            for _ in range(cells):
                r = await sb.exec(["python3", "-c", "x = 0; x += 1"])  # type: ignore[attr-defined]
                assert r.exit_code == 0, r.output

        got: dict[str, list[float]] = {"kernel cells": [], "fresh python3 -c": []}
        for i in range(rounds):
            ways = [("kernel cells", kernel), ("fresh python3 -c", fresh)]
            for name, way in (ways if i % 2 == 0 else ways[::-1]):
                t = time.perf_counter()
                await asyncio.gather(*(way(sb) for sb in sbs))
                got[name].append(k * cells / (time.perf_counter() - t))
        for name, rates in got.items():
            print(f"{k} sandboxes x {cells} cells  {name:18} {percentile(rates, 50):8.1f} cells/s"  # noqa: T201
                  f"  (rounds: {', '.join(f'{r:.1f}' for r in rates)})")
        ratio = percentile(got["kernel cells"], 50) / percentile(got["fresh python3 -c"], 50)
        print(f"kernels / fresh processes: {ratio:.2f}x  (load {os.getloadavg()[0]:.1f})")  # noqa: T201
    finally:
        await asyncio.gather(*(sb.close() for sb in sbs))


def main(n: int) -> None:
    asyncio.run(in_process(n, "bwrap"))
    through_service(n)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--concurrent":
        asyncio.run(concurrent(int(sys.argv[2]) if len(sys.argv) > 2 else 64,
                               int(sys.argv[3]) if len(sys.argv) > 3 else 20))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
