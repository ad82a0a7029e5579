"""``sandfleet bench interpreter``: the code interpreter's cell against an exec of ``true``, and
many kernels against fresh ``python3 -c`` processes, each pair measured side by side in one run.

Figures (keys of the JSON; p50 and p90 are :func:`sandfleet.stats.percentile`, in ms):

- round trips, ``n`` of each, one of each in turn in one sandbox (after ``x = 0``):
  - ``local_cell_p50_ms``: ``Kernel(sb).run("x += 1")`` in process (no HTTP), against
    ``local_exec_true_p50_ms``: ``sb.exec(["true"])`` on the same sandbox;
  - ``v1_cell_p50_ms``: ``RemoteSandbox.run_code("x += 1")`` through a ``sandfleet serve`` on
    loopback, against ``v1_exec_true_p50_ms``: ``RemoteSandbox.exec(["true"])``;
  - ``e2b_cell_p50_ms``: the e2b-code-interpreter SDK's ``run_code("x += 1")`` through the same
    service, against ``e2b_exec_true_p50_ms``: the e2b SDK's ``commands.run("true")`` (left out,
    with ``e2b_skipped`` saying why, where the SDK is not installed);
  - ``*_cell_over_exec_true``: the ratio of each pair's p50s (issue 47's target: within 3);
- SandboxFusion's own two ways, through the same service (``fusion_rounds`` rounds, the order
  turned each round): ``fusion_jupyter_cell_p50_ms``, a ``run_jupyter`` request of ``cells`` cells
  (``x = 0``, then ``x += 1``: one stateful Python in a fresh sandbox) per cell, against
  ``fusion_run_code_cell_p50_ms``, the same cells as ``run_code`` requests (a fresh sandbox and
  ``python3`` each, SandboxFusion's way), and ``fusion_run_code_over_jupyter``, their ratio;
  ``fusion_jupyter_request_p50_ms`` is a whole request;
- many kernels (``concurrent`` sandboxes at once, each running ``cells`` cells):
  - ``kernel_cells_per_s``: cells per second with each sandbox's kernel running ``x = 0`` and
    then ``x += 1`` (the kernel's start counted), the median of ``rounds`` rounds;
  - ``fresh_cells_per_s``: the same sandboxes each running ``cells`` fresh ``python3 -c`` processes
    (SandboxFusion's way: one interpreter per call);
  - ``kernels_over_fresh``: the ratio (issue 47's target: at least 5).

The two sides of a pair alternate (in turn per call, or per round with the order turned), so a
load that comes and goes on a shared host weighs on both alike.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sandfleet.interpreter import Kernel
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.stats import percentile

Progress = Callable[[str], None]

CELL_TARGET = 3.0
"""A cell's round trip within this many exec round trips of ``true`` (issue 47)."""
KERNELS_TARGET = 5.0
"""Kernels at least this many times the cells per second of fresh processes (issue 47)."""


def _pair(prefix: str, got: dict[str, list[float]]) -> dict[str, Any]:
    """``{prefix}_cell_p50_ms`` ... from the two sides' round trips (keys ``cell``, ``exec``)."""
    out: dict[str, Any] = {}
    for side, name in (("cell", "cell"), ("exec", "exec_true")):
        out[f"{prefix}_{name}_p50_ms"] = round(percentile(got[side], 50), 3)
        out[f"{prefix}_{name}_p90_ms"] = round(percentile(got[side], 90), 3)
    ex = out[f"{prefix}_exec_true_p50_ms"]
    out[f"{prefix}_cell_over_exec_true"] = round(out[f"{prefix}_cell_p50_ms"] / ex, 3) if ex else None
    return out


async def _alternate(n: int, cell: Callable[[], Awaitable[object]],
                     exec_true: Callable[[], Awaitable[object]]) -> dict[str, list[float]]:
    """``n`` round trips of each, one of each in turn, the order turned every time."""
    got: dict[str, list[float]] = {"cell": [], "exec": []}
    ways = [("cell", cell), ("exec", exec_true)]
    for i in range(n):
        for side, way in (ways if i % 2 == 0 else ways[::-1]):
            t = time.perf_counter()
            await way()
            got[side].append((time.perf_counter() - t) * 1e3)
    return got


async def local_roundtrips(n: int, backend: str = "bwrap") -> dict[str, Any]:
    """``local_*``: a cell through :class:`Kernel` against ``sb.exec(["true"])``, in process."""
    sb = await create_sandbox(backend=backend, ttl_s=600)
    k = Kernel(sb)
    try:
        await k.run("x = 0")
        await sb.exec(["true"])
        return _pair("local", await _alternate(n, lambda: k.run("x += 1"), lambda: sb.exec(["true"])))
    finally:
        await k.close()
        await sb.close()


async def v1_roundtrips(n: int, url: str, token: str) -> dict[str, Any]:
    """``v1_*``: ``RemoteSandbox.run_code`` against ``RemoteSandbox.exec(["true"])`` (``/v1``)."""
    from sandfleet.client import connect

    async with await connect(url, token) as c:
        sb = await c.create_sandbox(ttl_s=600)
        try:
            await sb.run_code("x = 0")
            await sb.exec(["true"])
            return _pair("v1", await _alternate(n, lambda: sb.run_code("x += 1"), lambda: sb.exec(["true"])))
        finally:
            await sb.close()


def e2b_roundtrips(n: int, url: str, token: str) -> dict[str, Any]:
    """``e2b_*``: the e2b-code-interpreter SDK's ``run_code`` against the e2b SDK's
    ``commands.run("true")`` on one sandbox of the service (the SDKs are synchronous)."""
    if importlib.util.find_spec("e2b_code_interpreter") is None:
        return {"e2b_skipped": "the e2b-code-interpreter SDK is not installed (pip install e2b-code-interpreter)"}
    from e2b_code_interpreter import Sandbox as E2BSandbox

    async def call(f: Callable[[], object]) -> object:
        return f()

    # what E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL would say, in the SDK's default (non-debug) mode
    sbx = E2BSandbox.create(timeout=600, api_key=token, api_url=url, sandbox_url=url, debug=False)
    try:
        sbx.run_code("x = 0")
        sbx.commands.run("true")
        got = asyncio.run(_alternate(n, lambda: call(lambda: sbx.run_code("x += 1")),
                                     lambda: call(lambda: sbx.commands.run("true"))))
    finally:
        sbx.kill()
    return _pair("e2b", got)


async def fusion_roundtrips(url: str, token: str, cells: int, rounds: int) -> dict[str, Any]:
    """``fusion_*``: SandboxFusion's ``run_jupyter`` of ``cells`` cells against as many
    ``run_code`` requests, per cell, ``rounds`` rounds (the order turned each round)."""
    import httpx

    code = ["x = 0"] + ["x += 1"] * (cells - 1)
    base = f"{url}/sandbox-fusion/{token}"
    times: dict[str, list[float]] = {"jupyter": [], "run_code": []}
    async with httpx.AsyncClient(timeout=600) as http:

        async def jupyter() -> None:
            t = time.perf_counter()
            r = await http.post(f"{base}/run_jupyter", json={"cells": code + ["x"], "total_timeout": 300})
            took = (time.perf_counter() - t) * 1e3
            body = r.json()
            if r.status_code != 200 or body.get("status") != "Success" or \
                    body["cells"][-1]["display"][0].get("text/plain") != str(cells - 1):
                raise RuntimeError(f"run_jupyter answered {r.status_code}: {r.text[:300]}")
            times["jupyter"].append(took / len(code))

        async def run_code() -> None:
            for i, cell in enumerate(code):
                t = time.perf_counter()
                # no state between calls: each carries what the kernel's cell found in x
                r = await http.post(f"{base}/run_code", json={"code": "x = 0\n" if i == 0 else f"x = {i - 1}\n{cell}\n",
                                                               "language": "python"})
                times["run_code"].append((time.perf_counter() - t) * 1e3)
                if r.status_code != 200 or r.json().get("status") != "Success":
                    raise RuntimeError(f"run_code answered {r.status_code}: {r.text[:300]}")

        await jupyter()  # the image and connections warm
        times["jupyter"].clear()
        for i in range(rounds):
            for way in ((jupyter, run_code) if i % 2 == 0 else (run_code, jupyter)):
                await way()
        request = [c * len(code) for c in times["jupyter"]]
    out: dict[str, Any] = {"fusion_cells": cells, "fusion_rounds": rounds,
           "fusion_jupyter_cell_p50_ms": round(percentile(times["jupyter"], 50), 3),
           "fusion_jupyter_request_p50_ms": round(percentile(request, 50), 3),
           "fusion_run_code_cell_p50_ms": round(percentile(times["run_code"], 50), 3)}
    jc = out["fusion_jupyter_cell_p50_ms"]
    out["fusion_run_code_over_jupyter"] = round(out["fusion_run_code_cell_p50_ms"] / jc, 3) if jc else None
    return out


async def concurrent_cells(k: int, cells: int, rounds: int = 3, backend: str = "bwrap") -> dict[str, Any]:
    """``k`` sandboxes at once, each running ``cells`` cells in its kernel (started afresh each
    round) against ``cells`` fresh ``python3 -c`` each; ``rounds`` rounds, the order turned."""
    from sandfleet.bench.procfs import raise_nofile

    raise_nofile()
    sbs: list[Sandbox] = list(await asyncio.gather(*(create_sandbox(backend=backend, ttl_s=1800)
                                                     for _ in range(k))))
    try:
        async def kernel(sb: Sandbox) -> None:
            kern = Kernel(sb)
            try:
                await kern.run("x = 0")
                for _ in range(cells - 1):
                    r = await kern.run("x += 1")
                    if r.error is not None:
                        raise RuntimeError(f"a cell failed: {r.error}")
            finally:
                await kern.close()

        async def fresh(sb: Sandbox) -> None:
            for _ in range(cells):
                r = await sb.exec(["python3", "-c", "x = 0; x += 1"])
                if r.exit_code != 0:
                    raise RuntimeError(f"python3 -c failed: {r.output[-300:]!r}")

        got: dict[str, list[float]] = {"kernel": [], "fresh": []}
        ways: list[tuple[str, Callable[[Sandbox], Awaitable[None]]]] = [("kernel", kernel), ("fresh", fresh)]
        for i in range(rounds):
            for name, way in (ways if i % 2 == 0 else ways[::-1]):
                t = time.perf_counter()
                await asyncio.gather(*(way(sb) for sb in sbs))
                got[name].append(k * cells / (time.perf_counter() - t))
    finally:
        await asyncio.gather(*(sb.close() for sb in sbs), return_exceptions=True)
    out: dict[str, Any] = {"concurrent": k, "cells": cells, "rounds": rounds}
    for name in ("kernel", "fresh"):
        out[f"{name}_cells_per_s"] = round(percentile(got[name], 50), 1)
        out[f"{name}_cells_per_s_rounds"] = [round(r, 1) for r in got[name]]
    out["kernels_over_fresh"] = round(out["kernel_cells_per_s"] / out["fresh_cells_per_s"], 2) \
        if out["fresh_cells_per_s"] else None
    return out


def targets(result: dict[str, Any]) -> dict[str, bool]:
    """Issue 47's targets, each met or not, for the figures the run has."""
    met = {f"{p}_cell_within_{CELL_TARGET:g}x_exec_true": result[f"{p}_cell_over_exec_true"] <= CELL_TARGET
           for p in ("local", "v1", "e2b") if result.get(f"{p}_cell_over_exec_true") is not None}
    if result.get("kernels_over_fresh") is not None:
        met[f"kernels_at_least_{KERNELS_TARGET:g}x_fresh"] = result["kernels_over_fresh"] >= KERNELS_TARGET
    return met


def run_interpreter_bench(*, backend: str = "bwrap", n: int = 200, concurrent: int = 64, cells: int = 20,
                          rounds: int = 3, service: bool = True, fusion_rounds: int = 6,
                          say: Progress = lambda _m: None) -> dict[str, Any]:
    """All the figures of the module docstring in one run: in process, then through a service
    started on loopback for the run (unless ``service`` is False), then the many kernels."""
    out: dict[str, Any] = {"backend": backend, "n": n}
    say(f"in process ({backend}): {n} cells x += 1 and {n} execs of true, in turn")
    out |= asyncio.run(local_roundtrips(n, backend))
    if service:
        from sandfleet.server.testing import running_service

        with tempfile.TemporaryDirectory(prefix="sandfleet-bench-interpreter-") as tmp, \
                running_service(Path(tmp), args=["--backend", backend, "--max-ttl", "1800"]) as svc:
            say(f"service at {svc.url}: /v1 run_code and exec true, {n} each")
            out |= asyncio.run(v1_roundtrips(n, svc.url, svc.token))
            say(f"service at {svc.url}: e2b SDKs' run_code and commands.run('true'), {n} each")
            out |= e2b_roundtrips(n, svc.url, svc.token)
            say(f"service at {svc.url}: SandboxFusion run_jupyter of {cells} cells against {cells} run_code, "
                f"{fusion_rounds} rounds")
            out |= asyncio.run(fusion_roundtrips(svc.url, svc.token, cells, fusion_rounds))
    say(f"{concurrent} sandboxes at once, {cells} kernel cells each against {cells} fresh python3 -c each, "
        f"{rounds} rounds")
    out |= asyncio.run(concurrent_cells(concurrent, cells, rounds, backend))
    out["targets_met"] = targets(out)
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out
