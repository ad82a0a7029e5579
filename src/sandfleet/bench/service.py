"""The service's cost, side by side with in-process, in one run (``sandfleet bench service``).

Figures (keys of the JSON), each the p50 unless named otherwise:

- ``create_exec_close_p50_ms_remote`` / ``_local``: a fresh sandbox, ``true`` in it, closed,
  through the service (HTTP on loopback) and in this process; ``create_exec_close_ratio``
  is remote / local, and ``create_exec_close_goal_met`` says whether remote <= 1.5 x local
  + 3 ms;
- ``exec_rtt_p50_ms_remote`` / ``_local``: ``true`` in a warm sandbox, request to exit
  record; ``exec_rtt_goal_met``: remote <= 3 ms;
- ``execs_per_s_64_remote`` / ``_local``: ``true`` execs per second, 64 sandboxes at once;
- ``e2b_create_run_kill_p50_ms``: through the real ``e2b`` SDK (async) pointed at the service,
  ``AsyncSandbox.create()``, ``commands.run("true")``, ``kill()``; ``e2b_create_run_kill_goal_met``:
  at most 30 ms (E2B's cloud create alone is about 150 ms); ``e2b_create_p50_ms``,
  ``e2b_run_p50_ms`` and ``e2b_kill_p50_ms`` split it by phase;
- ``e2b_exec_rtt_p50_ms``: ``commands.run("true")`` in a warm sandbox through envd (the SDK
  runs it as ``/bin/bash -l -c true``), beside ``v1_bash_login_rtt_p50_ms``, the same argv
  through ``/v1`` exec, in alternating blocks. Skipped (None) without the ``e2b`` package;
- ``e2b_bg8_fg_p50_ms`` / ``_idle``: ``commands.run("true")`` in one sandbox while 8 background
  processes (4 ``sleep``, 4 listening web servers) run in 8 others, and on an idle service, in
  alternating blocks; ``e2b_bg8_ratio`` and ``e2b_bg8_goal_met`` (at most 1.5x);
  ``e2b_bg8_busy_slots_held``: the service's busy slots in use while they run (0: a
  background process holds none).
- ``fusion_run_code_p50_ms_c1`` / ``_c16`` and ``v1_oneshot_p50_ms_c1`` / ``_c16``: a python
  snippet through SandboxFusion's ``run_code`` and through ``/v1`` (create, exec, close), at
  concurrency 1 and 16 (or ``--concurrency`` where lower; :mod:`sandfleet.bench.fusion`).

Remote and local rounds alternate, so a change in the host's load falls on both sides alike.
The service is a real ``sandfleet serve`` started on 127.0.0.1 for the run (same backend),
or the one given with ``--remote`` (its token in $SANDFLEET_TOKEN).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

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
    from sandfleet.bench.idle import close_all
    from sandfleet.bench.micro import exec_rate
    from sandfleet.sandbox.base import create_many

    boxes = await create_many([make] * conc)
    try:
        return await exec_rate(boxes, seconds)
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
    out.update(await measure_e2b(url, token, svc_spec=spec, n=n, rtt_n=rtt_n, say=say))
    out.update(await measure_e2b_background(url, token, n=max(n, 30), say=say))
    from sandfleet.bench.fusion import measure_fusion

    out.update(await measure_fusion(url, token, n=n, levels=(1, min(16, conc)), say=say))
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def measure_e2b(url: str, token: str, *, svc_spec: Any, n: int, rtt_n: int,
                      say: Callable[[str], None]) -> dict[str, Any]:
    """The E2B figures of the module docstring (None where the e2b SDK is not installed)."""
    keys = ("e2b_create_run_kill_p50_ms", "e2b_create_run_kill_p99_ms", "e2b_exec_rtt_p50_ms",
            "e2b_exec_rtt_p99_ms", "v1_bash_login_rtt_p50_ms", "e2b_create_p50_ms", "e2b_run_p50_ms",
            "e2b_kill_p50_ms", "e2b_create_run_kill_goal_met")
    try:
        from e2b import AsyncSandbox
    except ImportError:
        return dict.fromkeys(keys)
    from sandfleet.client import connect

    conn = {"api_key": token, "api_url": url, "sandbox_url": url}
    say(f"e2b SDK: create+run+kill x{n}")

    phases: dict[str, list[float]] = {"create": [], "run": [], "kill": []}

    async def crk() -> float:
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.create(timeout=600, **conn)  # type: ignore[arg-type]
        t1 = time.perf_counter()
        try:
            await sbx.commands.run("true")
        finally:
            t2 = time.perf_counter()
            await sbx.kill()
        t3 = time.perf_counter()
        for k, a, b in (("create", t0, t1), ("run", t1, t2), ("kill", t2, t3)):
            phases[k].append((b - a) * 1e3)
        return (t3 - t0) * 1e3

    await crk()  # connections open, caches warm
    for v in phases.values():
        v.clear()
    times = [await crk() for _ in range(n)]
    say(f"e2b SDK: exec round trip x{rtt_n} through envd, alternating with /v1")
    e2b_rtt: list[float] = []
    v1_rtt: list[float] = []
    sbx = await AsyncSandbox.create(timeout=600, **conn)  # type: ignore[arg-type]
    async with await connect(url, token, deadline_s=600) as svc:
        sb = await svc.create_sandbox(svc_spec)
        try:
            await sbx.commands.run("true")
            await sb.exec(["/bin/bash", "-l", "-c", "true"])
            for _ in range(10):
                for _ in range(rtt_n // 10):
                    t = time.perf_counter()
                    await sbx.commands.run("true")
                    e2b_rtt.append((time.perf_counter() - t) * 1e3)
                for _ in range(rtt_n // 10):
                    t = time.perf_counter()
                    await sb.exec(["/bin/bash", "-l", "-c", "true"])
                    v1_rtt.append((time.perf_counter() - t) * 1e3)
        finally:
            await sb.close()
            await sbx.kill()
    p50 = _p(times, 50)
    return {"e2b_create_run_kill_p50_ms": p50, "e2b_create_run_kill_p99_ms": _p(times, 99),
            "e2b_exec_rtt_p50_ms": _p(e2b_rtt, 50), "e2b_exec_rtt_p99_ms": _p(e2b_rtt, 99),
            "v1_bash_login_rtt_p50_ms": _p(v1_rtt, 50),
            **{f"e2b_{k}_p50_ms": _p(v, 50) for k, v in phases.items()}, "e2b_create_run_kill_goal_ms": 30.0,
            "e2b_create_run_kill_goal_met": p50 <= 30.0}


BACKGROUND = 8
"""Background processes (half sleep, half listen on a port) in other sandboxes."""
SETTLE_S = 3.0
"""Seconds the background processes get to start before the loaded block (a web server's
start is work; the figure is about what they cost once they sleep or listen)."""


async def measure_e2b_background(url: str, token: str, *, n: int, say: Callable[[str], None],
                                 rounds: int = 3) -> dict[str, Any]:
    """A foreground ``commands.run("true")``'s latency in one sandbox, on an idle service and
    while BACKGROUND processes sleep or listen in others (started with ``background=True``,
    the E2B pattern for dev servers and watchers), in alternating blocks; the goal is at most
    1.5x. Admission takes a busy slot only for a process's start, so they hold none."""
    keys = ("e2b_bg8_fg_p50_ms_idle", "e2b_bg8_fg_p50_ms", "e2b_bg8_ratio", "e2b_bg8_goal_met",
            "e2b_bg8_busy_slots_held")
    try:
        from e2b import AsyncSandbox
    except ImportError:
        return dict.fromkeys(keys)
    import httpx

    conn = {"api_key": token, "api_url": url, "sandbox_url": url}
    say(f"e2b SDK: foreground run x{n}, idle and beside {BACKGROUND} background processes")
    probe = await AsyncSandbox.create(timeout=600, **conn)  # type: ignore[arg-type]
    others = [await AsyncSandbox.create(timeout=600, **conn) for _ in range(BACKGROUND)]  # type: ignore[arg-type]
    times: dict[str, list[float]] = {"idle": [], "loaded": []}
    held: list[int] = []
    try:
        await probe.commands.run("true")

        async def block(side: str, k: int) -> None:
            for _ in range(k):
                t = time.perf_counter()
                await probe.commands.run("true")
                times[side].append((time.perf_counter() - t) * 1e3)

        for _ in range(rounds):
            await block("idle", n // rounds)
            handles = []
            for i, sb in enumerate(others):
                cmd = "sleep 600" if i % 2 == 0 else f"python3 -m http.server {8000 + i} --bind 127.0.0.1"
                handles.append((sb, await sb.commands.run(cmd, background=True)))
            await asyncio.sleep(SETTLE_S)  # started (python's imports done): sleeping or listening
            async with httpx.AsyncClient(timeout=30) as client:
                info = (await client.get(f"{url}/v1/info", headers={"Authorization": f"Bearer {token}"})).json()
            held.append(int(info["busy"]))
            await block("loaded", n // rounds)
            for sb, handle in handles:
                await sb.commands.kill(handle.pid)
    finally:
        for sb in [probe, *others]:
            await sb.kill()
    idle, loaded = _p(times["idle"], 50), _p(times["loaded"], 50)
    ratio = round(loaded / idle, 3) if idle else None
    return {"e2b_bg8_fg_p50_ms_idle": idle, "e2b_bg8_fg_p50_ms": loaded, "e2b_bg8_ratio": ratio,
            "e2b_bg8_goal_met": ratio is not None and ratio <= 1.5, "e2b_bg8_busy_slots_held": max(held)}
