"""The microvm micro-benchmark (``sandfleet bench micro --backend microvm``).

Figures: restore-to-ready p50/p99 (the create call to an answering agent with its clock set),
cold (QEMU started by the restore) and prestarted (``prestart``: the restore takes a QEMU
started ahead), measured alternating in one run; exec round trip of ``true``, PSS per idle VM
and how many idle VMs this host holds at that PSS, and the wall time of ``n`` concurrent
restores.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from sandfleet.sandbox.microvm.backend import MicrovmBackend, MicrovmSandbox
from sandfleet.sandbox.spec import MicrovmConfig, make_spec
from sandfleet.stats import percentile


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


PRESTART = 2
"""QEMUs started ahead for the prestarted restores (``MicrovmOptions.prestart``)."""


async def _bench(n: int, memory_mib: int, restores: int, execs: int) -> dict[str, Any]:
    backend = MicrovmBackend()
    spec = make_spec(backend="microvm", memory_mib=memory_mib, ttl_s=600)
    t0 = time.monotonic()
    await backend.template(spec)
    template_s = time.monotonic() - t0

    ready: list[float] = []
    ready_pre: list[float] = []
    ahead = MicrovmBackend(MicrovmConfig(options={"prestart": PRESTART}))
    try:
        for i in range(restores):
            for b, into in ((backend, ready), (ahead, ready_pre))[:: 1 if i % 2 else -1]:
                t = time.monotonic()
                sb = await b.create(spec)
                into.append(time.monotonic() - t)
                await sb.close()
                await asyncio.sleep(0.2)  # the refill of the spare (prestart) is not measured
    finally:
        await ahead.aclose()

    rtt: list[float] = []
    sb = await backend.create(spec)
    try:
        for _ in range(3):
            await sb.exec(["true"])
        for _ in range(execs):
            t = time.monotonic()
            await sb.exec(["true"])
            rtt.append(time.monotonic() - t)
    finally:
        await sb.close()

    boxes: list[MicrovmSandbox] = []
    try:
        t = time.monotonic()
        boxes = list(await asyncio.gather(*(backend.create(spec) for _ in range(n))))
        concurrent_s = time.monotonic() - t
        await asyncio.sleep(2.0)  # idle: let the guests settle
        pss = [_kib(b.vm.proc.pid, "Pss") for b in boxes]
        rss = [_kib(b.vm.proc.pid, "Rss") for b in boxes]
        available = _mem_available_kib()
    finally:
        await asyncio.gather(*(b.close() for b in boxes), return_exceptions=True)
    pss_mib = statistics.mean(pss) / 1024
    return {
        "backend": "microvm",
        "accel": backend.accel(),
        "guest_memory_mib": memory_mib,
        "template_s": round(template_s, 3),
        "restore_to_ready_p50_s": round(percentile(ready, 50), 4),
        "restore_to_ready_p99_s": round(percentile(ready, 99), 4),
        "restore_to_ready_prestarted_p50_s": round(percentile(ready_pre, 50), 4),
        "restore_to_ready_prestarted_p99_s": round(percentile(ready_pre, 99), 4),
        "prestart": PRESTART,
        "restores": restores,
        "exec_rtt_p50_s": round(percentile(rtt, 50), 4),
        "exec_rtt_p99_s": round(percentile(rtt, 99), 4),
        "pss_per_idle_vm_mib": round(pss_mib, 1),
        "rss_per_idle_vm_mib": round(statistics.mean(rss) / 1024, 1),
        "idle_vms_host_holds": int((available / 1024 + pss_mib * n) / pss_mib),
        "concurrent_restores": n,
        "concurrent_restores_s": round(concurrent_s, 3),
    }


def run(n: int = 20, *, memory_mib: int = 128, restores: int = 20, execs: int = 50) -> dict[str, Any]:
    """Run the micro-benchmark; ``n`` is the number of concurrent restores (and idle VMs)."""
    return asyncio.run(_bench(n, memory_mib, restores, execs))
