"""``sandfleet bench run``: the capacity benchmark, mode by mode, into one results dict.

Modes run in this order: ``single``, ``sweep`` (``capacity`` is derived from it),
``baseline``, ``evals``, ``soak``, ``density``. The results dict is filled in place and
handed to ``save`` after every mode, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.bench import load
from sandfleet.bench.load import Progress
from sandfleet.bench.throttle import Throttle
from sandfleet.bench.workers import SandboxFleet, Worker, bare_workers, close_all
from sandfleet.bench.workload import Command, missing_programs, prepare_workload, select
from sandfleet.errors import HostUnsupportedError
from sandfleet.sandbox import resolve_backend

SCHEMA = "sandfleet.bench/1"
MODES = ("single", "sweep", "capacity", "baseline", "evals", "soak", "density")
DEFAULT_MODES = ("single", "sweep", "capacity", "baseline", "evals", "density")


@dataclass
class BenchConfig:
    """What one ``bench run`` measures."""

    backend: str = "auto"
    modes: tuple[str, ...] = DEFAULT_MODES
    duration_s: float = 60.0
    """Seconds of each timed phase: every sweep level, each baseline side, evals, soak."""
    repeats: int = 5
    """Timed rounds of the mix in ``single``."""
    min_samples: int = 10
    """Each sweep level runs on past its duration until every command ran this often."""
    ns: tuple[int, ...] = ()
    """Load levels of the sweep; default 1, 2, 4, ... up to 2x the hardware threads."""
    target: float = 1.5
    commands: tuple[str, ...] = ()
    throttle: float | None = None
    """Run inside a cgroup giving this fraction of every hardware thread (slower-host emulation)."""
    eval_task: str = "implement-roman-numerals"
    density_max: int = 1024
    density_budget_mib: float | None = None
    threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))


def default_ns(threads: int) -> tuple[int, ...]:
    ns = {threads, 2 * threads}
    k = 1
    while k < 2 * threads:
        ns.add(k)
        k *= 2
    return tuple(sorted(ns))


def host_facts(backend: str) -> dict[str, Any]:
    """What the figures depend on: CPU, threads, kernel, page size, memory, backend."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "cpu model", "processor\t: arm")):
                model = line.split(":", 1)[1].strip()
                break
    from sandfleet.sandbox import cgroups

    mem = 0
    with contextlib.suppress(OSError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {"hostname": platform.node(), "cpu_model": model or platform.processor(),
            "arch": platform.machine(), "threads": len(os.sched_getaffinity(0)),
            "cpu_count": os.cpu_count(), "kernel": platform.release(),
            "page_size": os.sysconf("SC_PAGE_SIZE"), "mem_total_mib": mem, "backend": backend,
            "cgroup": cgroups.detect().version, "python": platform.python_version(),
            "loadavg_start": list(os.getloadavg())}


def _geo_ratio(a: dict[str, Any], b: dict[str, Any]) -> tuple[float | None, dict[str, float]]:
    per = {c: round(a[c]["median_s"] / b[c]["median_s"], 4) for c in a
           if c in b and a[c].get("median_s") and b[c].get("median_s")}
    if not per:
        return None, per
    return round(math.exp(statistics.fmean(math.log(r) for r in per.values())) - 1, 4), per


async def run_bench(cfg: BenchConfig, results: dict[str, Any], *, progress: Progress | None = None,
                    save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the configured modes, filling ``results``; returns it."""
    say = progress or (lambda _m: None)
    unknown = set(cfg.modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    modes = set(cfg.modes) | ({"sweep"} if "capacity" in cfg.modes else set())
    commands = select(list(cfg.commands))
    if missing := missing_programs(commands):
        raise HostUnsupportedError(f"the bench commands need {', '.join(missing)} on this host")
    backend = resolve_backend(cfg.backend)
    ns = cfg.ns or default_ns(cfg.threads)
    results.update(schema=SCHEMA, host=host_facts(backend), started=time.time(),
                   config={**asdict(cfg), "ns": list(ns), "commands": [c.name for c in commands]})
    results.setdefault("single", {})
    results.setdefault("sweep", {})
    results.setdefault("capacity", None)
    results.setdefault("evals_per_min", None)
    results.setdefault("baseline_overhead", None)
    results["host"]["throttle"] = cfg.throttle
    keep = save or (lambda _r: None)
    say("preparing the workload")
    workload = await asyncio.to_thread(prepare_workload)
    stack = contextlib.ExitStack()
    throttle = None
    if cfg.throttle:  # sandboxes: under one throttled parent; bare workers and we: our own group
        from sandfleet.sandbox import cgroups

        stack.enter_context(cgroups.throttled_parent(cfg.throttle, cfg.threads))
        throttle = Throttle(cfg.throttle, cfg.threads)
    fleet = SandboxFleet(workload, backend)
    try:
        if "single" in modes:
            say(f"single: {len(commands)} commands x {cfg.repeats}")
            (w,) = await fleet.workers(1)
            try:
                samples = await load.run_single(w, commands, cfg.repeats, lambda m: say(f"single {m}"))
            finally:
                await close_all([w])
            results["single"] = load.summarize(samples)
            results["single_failures"] = load.failures_of(samples)
            keep(results)
        if "sweep" in modes:
            await _sweep(cfg, fleet, commands, ns, results, say, keep)
        if "baseline" in modes:
            await _baseline(cfg, fleet, workload, commands, throttle, results, say)
            keep(results)
        if "evals" in modes:
            from sandfleet.bench.evals import run_evals

            say(f"evals: {cfg.eval_task} x {cfg.threads} workers for {cfg.duration_s:.0f}s")
            ev = await run_evals(cfg.eval_task, backend, cfg.threads, cfg.duration_s, say=say)
            results["evals"], results["evals_per_min"] = ev, ev["evals_per_min"]
            keep(results)
        if "soak" in modes:
            say(f"soak: {cfg.threads} busy sandboxes for {cfg.duration_s:.0f}s")
            ws = await fleet.workers(cfg.threads)
            try:
                samples = await load.drive(ws, commands, cfg.duration_s, say, "soak:")
            finally:
                await close_all(ws)
            results["soak"] = {"duration_s": cfg.duration_s, "sandboxes": cfg.threads,
                               "commands_run": len(samples), "failures": load.failures_of(samples),
                               **load.drift(samples, cfg.duration_s)}
            keep(results)
        if "density" in modes:
            from sandfleet.bench.density import run_density

            say("density: idle sandboxes")
            results["density"] = await run_density(backend, budget_mib=cfg.density_budget_mib,
                                                   max_sandboxes=cfg.density_max, say=say)
            keep(results)
    finally:
        fleet.close()
        if throttle is not None:
            throttle.close()
        stack.close()
        results["finished"] = time.time()
        results["host"]["loadavg_end"] = list(os.getloadavg())
    return results


async def _sweep(cfg: BenchConfig, fleet: SandboxFleet, commands: list[Command], ns: tuple[int, ...],
                 results: dict[str, Any], say: Progress, keep: Callable[[dict[str, Any]], None]) -> None:
    ws = await fleet.workers(max(ns))
    try:
        for n in ns:
            say(f"sweep: {n} busy sandboxes for {cfg.duration_s:.0f}s")
            samples = await load.drive(ws[:n], commands, cfg.duration_s, say, f"sweep N={n}:", cfg.min_samples)
            results["sweep"][str(n)] = {"commands": load.summarize(samples),
                                        "failures": load.failures_of(samples)}
            ref = results["sweep"].get("1", {}).get("commands") or results["single"]
            for row in results["sweep"].values():
                row["slowdown"] = load.slowdowns(row["commands"], ref)
            if "capacity" in cfg.modes:
                results["capacity"] = load.capacity(results["sweep"], cfg.target, cfg.threads)
            keep(results)
    finally:
        await close_all(ws)


async def _interleaved(sb: Worker, bare: Worker, commands: list[Command], repeats: int) -> dict[str, list[Any]]:
    """Each command in a sandbox and bare, back to back (order alternating), after a warm-up."""
    out: dict[str, list[Any]] = {"sandbox": [], "bare": []}
    t0 = time.perf_counter()
    for r in range(repeats + 1):
        for i, cmd in enumerate(commands):
            pair = [("sandbox", sb), ("bare", bare)]
            for kind, w in pair if (r + i) % 2 else pair[::-1]:
                sample = await w.run(cmd, t0)
                if r:
                    out[kind].append(sample)
    return out


async def _baseline(cfg: BenchConfig, fleet: SandboxFleet, workload: Path, commands: list[Command],
                    throttle: Throttle | None, results: dict[str, Any], say: Progress) -> None:
    """Sandboxes and bare processes at full load, in halves A B B A; then one of each, interleaved."""
    n, half = cfg.threads, cfg.duration_s / 2
    sbs = await fleet.workers(n)
    bare = bare_workers(workload, n, throttle)
    got: dict[str, list[Any]] = {"sandbox": [], "bare": []}
    try:
        for kind in ("sandbox", "bare", "bare", "sandbox"):
            ws: list[Worker] = list(sbs) if kind == "sandbox" else list(bare)
            say(f"baseline: {n} {kind} workers for {half:.0f}s")
            got[kind] += await load.drive(ws, commands, half, say, f"baseline {kind}:")
        say(f"baseline: one sandbox and one bare worker, interleaved, x {cfg.repeats}")
        single = await _interleaved(sbs[0], bare[0], commands, cfg.repeats)
    finally:
        await close_all(sbs)
        await close_all(bare)
    sb_full, bare_full = load.summarize(got["sandbox"]), load.summarize(got["bare"])
    sb_single, bare_single = load.summarize(single["sandbox"]), load.summarize(single["bare"])
    full, per_full = _geo_ratio(sb_full, bare_full)
    one, per_one = _geo_ratio(sb_single, bare_single)
    results["baseline"] = {"n": n, "sandbox_full": sb_full, "bare_full": bare_full, "sandbox_single": sb_single,
                           "bare_single": bare_single, "failures": load.failures_of(
                               got["sandbox"] + got["bare"] + single["sandbox"] + single["bare"])}
    results["baseline_overhead"] = {"full_load": full, "single": one, "n": n, "per_command": {
        c: {"full_load": per_full.get(c), "single": per_one.get(c)} for c in sorted(set(per_full) | set(per_one))}}
