"""Idle density: idle sandboxes created until a memory budget, and PSS per sandbox.

Sandboxes are created in batches of 32 and held until the host's available memory has
dropped by the budget (default a quarter of what was available) or ``max_sandboxes`` are
held. ``projected`` is how many would fit in all the memory available at the start, at
the larger of the measured PSS and the measured drop in available memory per sandbox.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sandfleet.bench.idle import close_all
from sandfleet.bench.load import Progress
from sandfleet.bench.procfs import meminfo, raise_nofile, sandbox_pss_kib
from sandfleet.sandbox import create_sandbox, make_spec
from sandfleet.sandbox.base import Sandbox, create_many

BATCH = 32


async def run_density(backend: str, *, budget_mib: float | None = None, max_sandboxes: int = 1024,
                      say: Progress | None = None) -> dict[str, Any]:
    raise_nofile()
    spec = make_spec(image="host", backend=backend, ttl_s=3600.0, labels={"bench": "density"})
    avail0 = meminfo()["MemAvailable"] / 1024
    budget = budget_mib if budget_mib is not None else avail0 / 4
    boxes: list[Sandbox] = []
    t0 = time.perf_counter()
    stopped_by = "max_sandboxes"
    try:
        while len(boxes) < max_sandboxes:
            n = min(BATCH, max_sandboxes - len(boxes))
            boxes += await create_many([lambda: create_sandbox(spec)] * n)  # a failed one leaks no other
            drop = avail0 - meminfo()["MemAvailable"] / 1024
            if say is not None and len(boxes) % (BATCH * 4) == 0:
                say(f"density: {len(boxes)} idle sandboxes, {drop:.0f} MiB used")
            if drop >= budget:
                stopped_by = "memory_budget"
                break
        create_s = time.perf_counter() - t0
        await asyncio.sleep(1.0)
        alive = sum(b.alive for b in boxes)
        drop = avail0 - meminfo()["MemAvailable"] / 1024
        pss = await asyncio.to_thread(sandbox_pss_kib, boxes) / 1024
        per = max(pss, drop / max(1, len(boxes)))
        return {"created": len(boxes), "alive": alive, "stopped_by": stopped_by,
                "budget_mib": round(budget, 1), "pss_mib": round(pss, 3),
                "mem_drop_per_sandbox_mib": round(drop / max(1, len(boxes)), 3),
                "mem_available_mib": round(avail0, 1),
                "projected": int(avail0 / per) if per > 0 else None,
                "create_per_s": round(len(boxes) / create_s, 1)}
    finally:
        failed = await close_all(boxes)
        if failed and say is not None:
            say(f"density: {failed} sandboxes failed to close (see the log)")
