"""``sandfleet bench service``: the service's cost, side by side with in-process, in one run.

Figures (keys of the JSON), each the p50 unless named otherwise:

- ``create_exec_close_p50_ms_remote`` / ``_local``: a fresh sandbox, ``true`` in it, closed,
  through the service (HTTP on loopback) and in this process; ``create_exec_close_ratio``
  is remote / local, and ``create_exec_close_goal_met`` says whether remote <= 1.5 x local
  + 3 ms;
- ``exec_rtt_p50_ms_remote`` / ``_local``: ``true`` in a warm sandbox, request to exit
  record; ``exec_rtt_goal_met``: remote <= 3 ms;
- ``execs_per_s_64_remote`` / ``_local``: ``true`` execs per second, 64 sandboxes at once.

Remote and local rounds alternate, so a change in the host's load falls on both sides alike.
The service is a real ``sandfleet serve`` started on 127.0.0.1 for the run (same backend),
or the one given with ``--remote`` (its token in $SANDFLEET_TOKEN).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import click

from sandfleet.sandbox.base import Sandbox

Make = Callable[[], Awaitable[Sandbox]]


def _p(xs: list[float], q: float) -> float:
    from sandfleet.stats import percentile

    return round(percentile(xs, q), 3)


async def _cec(make: Make) -> float:
    t = time.perf_counter()
    sb = await make()
    try:
        await sb.exec(["true"])
    finally:
        await sb.close()
    return (time.perf_counter() - t) * 1e3


async def _rtts(sb: Sandbox, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await sb.exec(["true"])
        out.append((time.perf_counter() - t) * 1e3)
    return out


async def _rate(make: Make, conc: int, seconds: float) -> float:
    from sandfleet.bench.micro import close_all
    from sandfleet.sandbox.base import create_many

    boxes = await create_many([make] * conc)
    try:
        count = 0
        stop = time.perf_counter() + seconds

        async def loop(b: Sandbox) -> None:
            nonlocal count
            while time.perf_counter() < stop:
                await b.exec(["true"])
                count += 1

        t = time.perf_counter()
        await asyncio.gather(*(loop(b) for b in boxes))
        return round(count / (time.perf_counter() - t), 1)
    finally:
        await close_all(boxes)


async def measure(url: str, token: str, *, backend: str = "auto", n: int = 30, rtt_n: int = 300,
                  conc: int = 64, seconds: float = 3.0, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The figures of the module docstring, for the service at ``url`` and this process."""
    from sandfleet.client import connect
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.spec import SandboxSpec

    spec = SandboxSpec(backend=backend, limits={"ttl_s": 600})
    out: dict[str, Any] = {"url": url, "n": n, "rtt_n": rtt_n, "concurrency": conc}
    async with await connect(url, token, deadline_s=600) as svc:

        async def remote() -> Sandbox:
            return await svc.create_sandbox(spec)

        async def local() -> Sandbox:
            return await create_sandbox(spec)

        warm_r, warm_l = await remote(), await local()  # agents built, caches warm, connections open
        out["backend_remote"], out["backend_local"] = warm_r.backend, warm_l.backend
        say(f"create+exec+close x{n}, alternating")
        cec: dict[str, list[float]] = {"remote": [], "local": []}
        for _ in range(n):
            cec["local"].append(await _cec(local))
            cec["remote"].append(await _cec(remote))
        say(f"exec round trip x{rtt_n}, alternating blocks")
        rtt: dict[str, list[float]] = {"remote": [], "local": []}
        for _ in range(10):
            rtt["local"] += await _rtts(warm_l, rtt_n // 10)
            rtt["remote"] += await _rtts(warm_r, rtt_n // 10)
        await warm_r.close()
        await warm_l.close()
        say(f"execs/s at concurrency {conc}")
        rate_l = await _rate(local, conc, seconds)
        rate_r = await _rate(remote, conc, seconds)
    for side in ("remote", "local"):
        out[f"create_exec_close_p50_ms_{side}"] = _p(cec[side], 50)
        out[f"create_exec_close_p99_ms_{side}"] = _p(cec[side], 99)
        out[f"exec_rtt_p50_ms_{side}"] = _p(rtt[side], 50)
        out[f"exec_rtt_p99_ms_{side}"] = _p(rtt[side], 99)
    out["execs_per_s_64_remote" if conc == 64 else f"execs_per_s_{conc}_remote"] = rate_r
    out["execs_per_s_64_local" if conc == 64 else f"execs_per_s_{conc}_local"] = rate_l
    loc, rem = out["create_exec_close_p50_ms_local"], out["create_exec_close_p50_ms_remote"]
    out["create_exec_close_ratio"] = round(rem / loc, 3) if loc else None
    out["create_exec_close_goal_ms"] = round(1.5 * loc + 3, 3)
    out["create_exec_close_goal_met"] = rem <= 1.5 * loc + 3
    out["exec_rtt_goal_ms"] = 3.0
    out["exec_rtt_goal_met"] = out["exec_rtt_p50_ms_remote"] <= 3.0
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


@click.command("service")
@click.option("--backend", type=click.Choice(["auto", "bwrap", "process"]), default="auto", show_default=True,
              help="Backend of the service started for the run, and of the in-process side.")
@click.option("-n", "n", default=30, show_default=True, help="create+exec+close rounds per side.")
@click.option("--rtt-n", default=300, show_default=True, help="exec round trips per side.")
@click.option("--concurrency", default=64, show_default=True, help="Sandboxes at once for execs/s.")
@click.option("--seconds", default=3.0, show_default=True, help="Duration of the execs/s phase per side.")
@click.option("--remote", metavar="URL", default=None,
              help="Measure this running service (token in $SANDFLEET_TOKEN) instead of starting one.")
@click.option("--json", "as_json", is_flag=True)
def service(backend: str, n: int, rtt_n: int, concurrency: int, seconds: float, remote: str | None,
            as_json: bool) -> None:
    """The sandbox service against in-process: create/exec/close, exec RTT, execs/s."""
    from sandfleet.bench.procfs import raise_nofile
    from sandfleet.errors import SandfleetError
    from sandfleet.provenance import provenance

    raise_nofile()
    say = (lambda _m: None) if as_json else (lambda m: click.echo(f"... {m}", err=True))
    try:
        if remote is not None:
            from sandfleet.client.remote import token_from_env

            result = asyncio.run(measure(remote, token_from_env(), backend=backend, n=n, rtt_n=rtt_n,
                                         conc=concurrency, seconds=seconds, say=say))
        else:
            from sandfleet.server.testing import running_service

            with tempfile.TemporaryDirectory(prefix="sandfleet-bench-service-") as tmp, \
                    running_service(Path(tmp), args=["--backend", backend,
                                                     "--max-sandboxes", str(max(256, 2 * concurrency))]) as svc:
                say(f"service at {svc.url}")
                result = asyncio.run(measure(svc.url, svc.token, backend=backend, n=n, rtt_n=rtt_n,
                                             conc=concurrency, seconds=seconds, say=say))
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    result["provenance"] = provenance({"bench": "service", "backend": backend, "n": n, "rtt_n": rtt_n,
                                       "concurrency": concurrency, "seconds": seconds, "remote": remote})
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for k, v in result.items():
        if k != "provenance":
            click.echo(f"{k:34} {v}")
