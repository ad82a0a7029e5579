"""SandboxFusion ``run_code`` against ``/v1``'s one-shot run, on one service: part of
``sandfleet bench service``, or on its own with ``python -m sandfleet.bench.fusion``.

Figures (keys of the JSON), p50 and p99 in ms, at concurrency 1 and 16 (``c1``, ``c16``):

- ``fusion_run_code_p50_ms_c1`` ...: ``POST /sandbox-fusion/<token>/run_code`` of a python
  snippet (a fresh sandbox, the code written, ``python3 main.py``, the sandbox closed), over
  one keep-alive HTTP client;
- ``v1_oneshot_p50_ms_c1`` ...: the same snippet through sandfleet's own client and ``/v1``:
  create (same image, workdir and memory limit), exec ``python3 -c``, close;
- ``fusion_over_v1_c1`` / ``_c16``: the ratio of the p50s.

The two sides alternate in blocks, so a change in the host's load falls on both alike.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

SNIPPET = "print(sum(i * i for i in range(1000)))\n"
EXPECTED = f"{sum(i * i for i in range(1000))}\n"
LEVELS = (1, 16)


def _p(xs: list[float], q: float) -> float:
    from sandfleet.stats import percentile

    return round(percentile(xs, q), 3)


async def _timed(call: Callable[[], Awaitable[None]], conc: int, n: int) -> list[float]:
    """``n`` calls, ``conc`` at a time; each one's latency in ms."""
    out: list[float] = []
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t = time.perf_counter()
            await call()
            out.append((time.perf_counter() - t) * 1e3)

    await asyncio.gather(*(worker() for _ in range(conc)))
    return out


async def measure_fusion(url: str, token: str, *, n: int = 30, rounds: int = 6, levels: tuple[int, ...] = LEVELS,
                         say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """The figures of the module docstring: per level, ``min(rounds, n)`` blocks a side of
    ``max(level, n // blocks)`` calls each."""
    import httpx

    from sandfleet.client import connect
    from sandfleet.sandbox.spec import Limits, SandboxSpec

    spec = SandboxSpec(image="host", workdir="/work", limits=Limits(memory_mib=1024, ttl_s=120))
    out: dict[str, Any] = {"fusion_n": n}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as http, \
            await connect(url, token, deadline_s=600) as svc:

        async def fusion() -> None:
            r = await http.post(f"{url}/sandbox-fusion/{token}/run_code",
                                json={"code": SNIPPET, "language": "python", "memory_limit_MB": 1024})
            body = r.json()
            if r.status_code != 200 or body["status"] != "Success" or body["run_result"]["stdout"] != EXPECTED:
                raise RuntimeError(f"run_code answered {r.status_code}: {r.text[:300]}")

        async def oneshot() -> None:
            sb = await svc.create_sandbox(spec)
            try:
                res = await sb.exec(["python3", "-c", SNIPPET])
            finally:
                await sb.close()
            if res.exit_code != 0 or res.stdout != EXPECTED:
                raise RuntimeError(f"/v1 one-shot run failed: {res}")

        await fusion()
        await oneshot()  # connections open, caches warm
        blocks = max(1, min(rounds, n))
        for conc in levels:
            say(f"sandbox-fusion run_code and /v1 one-shot, {n} each at concurrency {conc}, alternating blocks")
            times: dict[str, list[float]] = {"fusion": [], "v1": []}
            for _ in range(blocks):
                times["fusion"] += await _timed(fusion, conc, max(conc, n // blocks))
                times["v1"] += await _timed(oneshot, conc, max(conc, n // blocks))
            for side, name in (("fusion", "fusion_run_code"), ("v1", "v1_oneshot")):
                out[f"{name}_p50_ms_c{conc}"] = _p(times[side], 50)
                out[f"{name}_p99_ms_c{conc}"] = _p(times[side], 99)
            v1 = out[f"v1_oneshot_p50_ms_c{conc}"]
            out[f"fusion_over_v1_c{conc}"] = round(out[f"fusion_run_code_p50_ms_c{conc}"] / v1, 3) if v1 else None
    return out


def main(argv: list[str]) -> None:
    """``python -m sandfleet.bench.fusion [N]``: a service on loopback, the figures as JSON."""
    import os

    from sandfleet.provenance import provenance
    from sandfleet.server.testing import running_service

    n = int(argv[0]) if argv else 30

    def say(m: str) -> None:
        sys.stderr.write(f"... {m}\n")

    with tempfile.TemporaryDirectory(prefix="sandfleet-bench-fusion-") as tmp, \
            running_service(Path(tmp), args=["--max-sandboxes", "64"]) as svc:
        result = asyncio.run(measure_fusion(svc.url, svc.token, n=n, say=say))
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    result["provenance"] = provenance({"bench": "fusion", "n": n})
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
