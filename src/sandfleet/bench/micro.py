"""Micro-benchmark of the sandbox layer, measured side by side in one run.

Figures (keys of the JSON; every median and percentile is :func:`sandfleet.stats.percentile`,
and ``provenance`` says where it ran):
- ``create_exec_close_p50_ms`` / ``_p99_ms``: a fresh sandbox, ``true`` in it, closed;
- ``raw_bwrap_true_p50_ms``: ``bwrap --unshare-all true`` alone, for scale;
- ``acquire_p50_ms``: taking a sandbox from a warm pool;
- ``exec_rtt_ratio``: round trip of ``true`` through the guest agent / a bare
  ``posix_spawn`` + ``waitpid`` of ``true`` on the host (p50s; one of each in turn, after
  the sandbox's first command);
- ``idle_pss_mib``: proportional set size per idle sandbox (all its processes, and its
  writable layer), and ``idle_capacity``: how many such idle sandboxes fit in this host's
  available memory (``idle_created`` says how many were really held at once);
- ``idle_create_per_s_first_1000`` / ``_last_1000``: sandboxes created per second (batches
  of 32) over the first and the last 1,000 of the idle hold (``idle_create_window``: fewer,
  half the hold, where it is under 2,000), and ``idle_create_last_to_first``: how much
  slower the last came (the first rate over the last);
- ``exec_host_cpu_us_mean``: this process's CPU time per round trip of ``true`` (its event
  loop's share of an exec: what a service's one process spends per command);
- ``exec_per_s_64``: ``true`` execs per second across 64 concurrent sandboxes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

from sandfleet.bench.idle import create_rates, hold
from sandfleet.bench.procfs import meminfo, raise_nofile
from sandfleet.provenance import provenance
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.bwrap import raw_bwrap_true_ms
from sandfleet.sandbox.pool import WarmPool
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.stats import percentile

Progress = Callable[[str], None]

log = logging.getLogger(__name__)


def bare_spawn_once_ms() -> float:
    true = shutil.which("true") or "/bin/true"
    t = time.perf_counter()
    pid = os.posix_spawn(true, [true], {})
    os.waitpid(pid, 0)
    return (time.perf_counter() - t) * 1e3


async def exec_rtt_vs_bare_ms(sb: Sandbox, n: int) -> tuple[list[float], list[float], list[float]]:
    """``n`` round trips of ``true`` through ``sb``'s guest agent and ``n`` bare spawns of
    ``true`` on the host, one of each in turn (a load that comes and goes on a shared host
    then weighs on both sides alike; measured one side after the other, the bare spawn's p50
    moved 0.63-2.3 ms between runs a minute apart); and each round trip's CPU time in this
    process (microseconds: what one exec costs the host's side, its event loop)."""
    rtt, bare, cpu = [], [], []
    for _ in range(n):
        c, t = time.process_time(), time.perf_counter()
        await sb.exec(["true"])
        rtt.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e6)
        bare.append(bare_spawn_once_ms())
    return rtt, bare, cpu


async def create_exec_close_ms(spec: SandboxSpec, n: int) -> list[float]:
    """Milliseconds of each of ``n`` cycles: a fresh sandbox of ``spec``, ``true`` in it, closed."""
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        sb = await create_sandbox(spec)
        await sb.exec(["true"])
        await sb.close()
        ts.append((time.perf_counter() - t) * 1e3)
    return ts


async def run_micro(
    backend: str = "auto", *, n: int = 50, idle: int = 256, progress: Progress | None = None
) -> dict[str, Any]:
    say = progress or (lambda _m: None)
    raise_nofile()
    spec = SandboxSpec(backend=backend)
    out: dict[str, Any] = {"backend": backend, "n": n,
                           "provenance": provenance({"bench": "micro", "backend": backend, "n": n, "idle": idle})}
    warm = await create_sandbox(spec)  # builds the agent, warms caches
    out["backend"] = warm.backend
    await warm.close()

    say(f"create+exec+close x{n}")
    ts = await create_exec_close_ms(spec, n)
    out["create_exec_close_p50_ms"] = round(percentile(ts, 50), 2)
    out["create_exec_close_p99_ms"] = round(percentile(ts, 99), 2)
    raw = raw_bwrap_true_ms(n) if out["backend"] == "bwrap" else None
    out["raw_bwrap_true_p50_ms"] = None if raw is None else round(raw, 2)

    say("warm-pool acquire")
    acq = []
    async with WarmPool(spec, size=4, max_busy=8) as pool:
        for _ in range(n):
            await pool.wait_ready(1)
            t = time.perf_counter()
            sb = await pool.acquire()
            acq.append((time.perf_counter() - t) * 1e3)
            await pool.release(sb)
    out["acquire_p50_ms"] = round(percentile(acq, 50), 3)

    say("exec round trip vs bare spawn")
    sb = await create_sandbox(spec)
    try:
        await sb.exec(["true"])  # the sandbox's first command (the guest's command zygote starts)
        rtt, bares, cpu = await exec_rtt_vs_bare_ms(sb, max(n * 4, 200))
    finally:
        await sb.close()
    bare = percentile(bares, 50)
    out["exec_rtt_p50_ms"] = round(percentile(rtt, 50), 3)
    out["bare_spawn_p50_ms"] = round(bare, 3)
    out["exec_rtt_ratio"] = round(percentile(rtt, 50) / bare, 2)
    out["exec_host_cpu_us_mean"] = round(sum(cpu) / len(cpu), 1)

    say(f"{idle} idle sandboxes")
    mem0 = meminfo()
    held = await hold(spec, idle, say)  # this process and, past its open-file limit, helpers
    try:
        await asyncio.sleep(0.5)
        mem1 = meminfo()
        n_held = held.created
        out["idle_created"] = n_held
        out["idle_processes"] = 1 + len(held.helpers)
        rates = create_rates(held.batches)
        if rates:
            out["idle_create_per_s_first_1000"] = round(rates[0], 1)
            out["idle_create_per_s_last_1000"] = round(rates[1], 1)
            out["idle_create_window"] = rates[2]  # 1000, or half of what was held where fewer
            out["idle_create_last_to_first"] = round(rates[0] / rates[1], 2) if rates[1] else None
        if held.stopped:
            out["idle_stopped"] = held.stopped
        if n_held:
            per_pss = held.pss_kib() / 1024
            per_avail = (mem0["MemAvailable"] - mem1["MemAvailable"]) / 1024 / n_held
            out["idle_pss_mib"] = round(per_pss, 3)
            out["idle_mem_drop_mib"] = round(per_avail, 3)
            # kernel memory per sandbox: slab (mounts, namespaces, pipes), page tables, stacks
            for key, name in (("Slab", "idle_slab_kib"), ("PageTables", "idle_pagetables_kib"),
                              ("KernelStack", "idle_kernelstack_kib")):
                if key in mem0 and key in mem1:
                    out[name] = round((mem1[key] - mem0[key]) / n_held, 1)
            per = max(per_pss, per_avail)
            out["idle_capacity"] = int(mem0["MemAvailable"] / 1024 / per) if per > 0 else None
            out["idle_capacity_basis"] = "MemAvailable before / max(PSS, MemAvailable drop) per idle sandbox"

            say("exec/s across 64 sandboxes")
            out["exec_per_s_64"] = await exec_rate(held.own[:64], 3.0) if held.own else None
    finally:
        await held.close()
    return out


async def exec_rate(boxes: list[Sandbox], seconds: float) -> float:
    """Execs of ``true`` per second, every sandbox running one after another for ``seconds``."""
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
