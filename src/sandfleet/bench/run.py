"""``sandfleet bench run``: the capacity benchmark, mode by mode, into one results dict.

Modes run in this order: ``single``, ``sweep`` (with the interleaved single baseline, and
``capacity`` derived from it, on a finer grid around the crossing), ``baseline``, ``evals``,
``soak``, ``density``. The results dict is filled in place and handed to ``save`` after every
mode and sweep level, so an interrupted run keeps what it measured. ``results["provenance"]``
(:func:`sandfleet.provenance.provenance`) says where and with what configuration it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pwd
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sandfleet.bench import load
from sandfleet.bench.compare import SCHEMA
from sandfleet.bench.load import Progress
from sandfleet.bench.throttle import Throttle
from sandfleet.bench.workers import (
    MAX_OUTPUT,
    Sample,
    SandboxFleet,
    Worker,
    alive,
    bare_workers,
    close_all,
    cpu_quota,
    layer_kind,
    tmpfs_dir,
)
from sandfleet.bench.workload import Command, missing_programs, prepare_workload, select, workload_id
from sandfleet.errors import ConfigError, HostUnsupportedError
from sandfleet.provenance import provenance
from sandfleet.sandbox import resolve_backend

MODES = ("single", "sweep", "capacity", "baseline", "evals", "soak", "density")
DEFAULT_MODES = ("single", "sweep", "capacity", "baseline", "evals", "density")
MIN_SAMPLES = 40
"""Successful samples per command and load level (and in the interleaved single baseline)
that a p95 is taken from, unless the level's time cap comes first."""


@dataclass
class BenchConfig:
    """What one ``bench run`` measures."""

    backend: str = "auto"
    modes: tuple[str, ...] = DEFAULT_MODES
    duration_s: float = 60.0
    """Seconds of each timed phase: every sweep level, each baseline side, evals, soak."""
    repeats: int = 5
    """Timed rounds of the mix in ``single``."""
    min_samples: int = MIN_SAMPLES
    """Each sweep level runs on past its duration until every command ran this often (or
    ``level_cap_s`` passes); the interleaved single baseline runs until each has this many."""
    level_cap_s: float | None = None
    """Longest a sweep level runs to reach ``min_samples``; default 10 x ``duration_s``."""
    ns: tuple[int, ...] = ()
    """Coarse load levels of the sweep; default 1, 2, 4, ... up to 2x the hardware threads."""
    refine: int = 3
    """Most levels added between the last coarse level within the target and the first past it."""
    target: float = 1.5
    commands: tuple[str, ...] = ()
    throttle: float | None = None
    """Run inside a cgroup giving this fraction of every hardware thread (slower-host emulation)."""
    eval_task: str = "implement-roman-numerals"
    density_max: int = 1024
    density_budget_mib: float | None = None
    threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

    def check(self) -> None:
        """Refuse a configuration that can't measure anything, naming the field."""
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ConfigError(f"unknown modes {sorted(bad)}; known: {', '.join(MODES)}")
        for name in ("duration_s", "target"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")
        if self.target < 1:
            raise ConfigError(f"target is a slowdown (>= 1, e.g. 1.5), not {self.target}")
        for name in ("repeats", "min_samples", "refine"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.level_cap_s is not None and self.level_cap_s <= 0:
            raise ConfigError(f"level_cap_s must be positive, not {self.level_cap_s}")
        if any(n < 1 for n in self.ns):
            raise ConfigError(f"load levels must be >= 1, not {list(self.ns)}")
        if self.threads < 1:
            raise ConfigError(f"threads must be >= 1, not {self.threads}")

    @property
    def cap_s(self) -> float:
        return self.level_cap_s if self.level_cap_s is not None else 10 * self.duration_s


def default_ns(threads: int) -> tuple[int, ...]:
    ns = {threads, 2 * threads}
    k = 1
    while k < 2 * threads:
        ns.add(k)
        k *= 2
    return tuple(sorted(ns))


def host_facts(backend: str, throttle: float | None = None) -> dict[str, Any]:
    """:func:`sandfleet.provenance.host` (CPU, threads, kernel, memory, ...) and what else the
    bench's figures depend on: page size, backend, cgroup layout, throttle, load average."""
    from sandfleet.provenance import host
    from sandfleet.sandbox import cgroups

    return {**host(), "page_size": os.sysconf("SC_PAGE_SIZE"), "backend": backend,
            "cgroup": cgroups.detect().version, "throttle": throttle, "loadavg_start": loadavg()}


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, to two decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def bench_provenance(cfg: BenchConfig, backend: str, commands: list[Command], ns: tuple[int, ...]) -> dict[str, Any]:
    """The run's provenance: host (with the bench's own facts), kernel, commit, and the
    configuration with the workload's identity (compare refuses runs whose differ)."""
    config = {**asdict(cfg), "modes": list(cfg.modes), "ns": list(ns), "commands": [c.name for c in commands],
              "min_samples": cfg.min_samples, "level_cap_s": cfg.cap_s, "workload": workload_id(commands)}
    prov = provenance(config)
    prov["host"] = {**prov["host"], **host_facts(backend, cfg.throttle)}
    return prov


def _geo_ratio(a: dict[str, Any], b: dict[str, Any]) -> tuple[float | None, dict[str, float]]:
    per = {c: round(a[c]["median_s"] / b[c]["median_s"], 4) for c in a
           if c in b and a[c].get("median_s") and b[c].get("median_s")}
    if not per:
        return None, per
    return round(math.exp(statistics.fmean(math.log(r) for r in per.values())) - 1, 4), per


def _geo_ratio_ci(a: dict[str, list[float]], b: dict[str, list[float]], *, level: float = load.CI_LEVEL,
                  resamples: int = 2000, seed: int = 0) -> list[float] | None:
    """[low, high] of a ``level`` percentile-bootstrap interval of :func:`_geo_ratio`'s overhead:
    each command's latencies of each side resampled on their own, the medians' ratios taken,
    their geometric mean over the commands, minus 1. None without a command both sides ran."""
    common = sorted(c for c in a if a[c] and b.get(c))
    if not common:
        return None
    rng = np.random.default_rng(seed)
    logs = np.zeros(resamples)
    for c in common:
        med = []
        for xs in (a[c], b[c]):
            x = np.asarray(xs, dtype=float)
            med.append(np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1))
        logs += np.log(med[0] / med[1])
    g = np.exp(logs / len(common)) - 1
    lo, hi = np.percentile(g, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return [round(float(lo), 4), round(float(hi), 4)]


async def run_bench(cfg: BenchConfig, results: dict[str, Any], *, progress: Progress | None = None,
                    save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the configured modes, filling ``results``; returns it."""
    say = progress or (lambda _m: None)
    cfg.check()
    modes = set(cfg.modes) | ({"sweep"} if "capacity" in cfg.modes else set())
    commands = select(list(cfg.commands))
    if missing := missing_programs(commands):
        raise HostUnsupportedError(f"the bench commands need {', '.join(missing)} on this host")
    backend = resolve_backend(cfg.backend)
    ns = tuple(sorted(set(cfg.ns or default_ns(cfg.threads))))
    results.update(schema=SCHEMA, provenance=bench_provenance(cfg, backend, commands, ns), started=time.time())
    results.setdefault("single", {})
    results.setdefault("sweep", {})
    results.setdefault("capacity", None)
    results.setdefault("evals_per_min", None)
    results.setdefault("baseline_overhead", None)
    host = results["provenance"]["host"]
    keep = save or (lambda _r: None)
    say("preparing the workload")
    workload = await asyncio.to_thread(prepare_workload)
    stack = contextlib.ExitStack()
    throttle = None
    if cfg.throttle:  # sandboxes and bare workers: under one throttled parent; we: our own group
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
            await _baseline(cfg, workload, backend, commands, results, say)
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
        host["loadavg_end"] = loadavg()
    return results


def _rounded(xs: dict[str, list[float]]) -> dict[str, list[float]]:
    return {c: [round(x, 5) for x in v] for c, v in sorted(xs.items())}


async def _sweep(cfg: BenchConfig, fleet: SandboxFleet, commands: list[Command], ns: tuple[int, ...],
                 results: dict[str, Any], say: Progress, keep: Callable[[dict[str, Any]], None]) -> None:
    """Coarse levels, then up to ``cfg.refine`` finer ones around the crossing; before every
    level and after the last, rounds of the mix in one sandbox alone (the interleaved single
    baseline every slowdown is taken against)."""
    ws = await fleet.workers(max(ns))
    pool: list[Sample] = []
    raw: dict[str, dict[str, list[float]]] = {}
    slots = len(ns) + 1
    rounds = max(1, math.ceil(cfg.min_samples / slots))
    sweep = results["sweep"]

    async def heal() -> None:
        """Replace sandboxes that died (their level counted the failure) with fresh forks."""
        dead = [i for i, w in enumerate(ws) if not alive(w)]
        if dead:
            say(f"sweep: replacing {len(dead)} dead sandbox(es)")
            await close_all([ws[i] for i in dead])
            fresh = await fleet.workers(len(dead))
            for i, w in zip(dead, fresh, strict=True):
                ws[i] = w
            results["sweep_sandboxes_replaced"] = results.get("sweep_sandboxes_replaced", 0) + len(dead)

    async def single_slot(final: bool = False) -> None:
        await heal()
        r = rounds
        if final:  # and as many more as it takes for every command to have min_samples
            have = load.latencies(pool)
            r = max(rounds, cfg.min_samples - min(len(have.get(c.name, [])) for c in commands))
        say(f"interleaved single: one sandbox alone, {r} round(s) of {len(commands)} commands")
        pool.extend(await load.run_rounds(ws[0], commands, r, warmup=not pool))

    def reduce(with_ci: bool) -> None:
        ref = load.summarize(pool, ci=with_ci)
        ref_raw = load.latencies(pool)
        results["interleaved_single"] = {"commands": ref, "failures": load.failures_of(pool),
                                         "rounds_per_slot": rounds, "samples_s": _rounded(ref_raw)}
        for n, row in sweep.items():
            row["slowdown"] = load.slowdowns(row["commands"], ref, raw.get(n) if with_ci else None,
                                             ref_raw if with_ci else None)
        if "capacity" in cfg.modes:
            results["capacity"] = load.capacity(sweep, cfg.target, cfg.threads)

    async def level(n: int, kind: str) -> None:
        await single_slot()
        say(f"sweep ({kind}): {n} busy sandboxes for {cfg.duration_s:.0f}s, on until {cfg.min_samples} samples "
            f"per command or {cfg.cap_s:.0f}s")
        await heal()
        t = time.perf_counter()
        samples = await load.drive(ws[:n], commands, cfg.duration_s, say, f"sweep N={n}:", cfg.min_samples, cfg.cap_s)
        wall = time.perf_counter() - t
        summary = load.summarize(samples)
        short = sorted(c.name for c in commands if (summary.get(c.name) or {}).get("n", 0) < cfg.min_samples)
        raw[str(n)] = load.latencies(samples)
        sweep[str(n)] = {"commands": summary, "failures": load.failures_of(samples), "grid": kind,
                         "wall_s": round(wall, 2), "short_of_min_samples": short,
                         "samples_s": _rounded(raw[str(n)])}
        if short:
            say(f"sweep N={n}: {', '.join(short)} below {cfg.min_samples} samples at the {cfg.cap_s:.0f}s cap")
        reduce(with_ci=False)
        keep(results)

    try:
        for n in ns:
            await level(n, "coarse")
        if "capacity" in cfg.modes:
            for n in load.finer_levels(sweep, cfg.target, cfg.refine):
                await level(n, "fine")
        await single_slot(final=True)
        results["sweep"] = dict(sorted(sweep.items(), key=lambda kv: int(kv[0])))
        sweep = results["sweep"]
        reduce(with_ci=True)
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


async def _baseline(cfg: BenchConfig, workload: Path, backend: str, commands: list[Command],
                    results: dict[str, Any], say: Progress) -> None:
    """Sandboxes and bare processes at full load, in halves A B B A; then one of each,
    interleaved. The bare workers get the sandboxes' limits, a tmpfs working copy, and the
    same output handling; the sandboxes a tmpfs writable layer."""
    from sandfleet.sandbox import cgroups

    n, half = cfg.threads, cfg.duration_s / 2
    per_half = math.ceil(cfg.min_samples / 2)  # each side: two halves, min_samples in all
    fleet = SandboxFleet(workload, backend, layer="tmpfs")
    sbs: list[Any] = []
    bare: list[Any] = []
    got: dict[str, list[Any]] = {"sandbox": [], "bare": []}
    try:
        sbs = await fleet.workers(n)
        bare = await bare_workers(workload, n, fleet.limits)
        lim = fleet.limits
        base, fstype = tmpfs_dir()
        setup = {
            "processes": {"full_load": n, "single": 1,
                          "schedule": f"{n} sandboxes, {n} bare, {n} bare, {n} sandboxes, {half:g}s each and on "
                                      f"until {per_half} samples per command (cap {cfg.cap_s / 2:g}s); "
                                      f"then one of each, each command back to back, order alternating, "
                                      f"x {cfg.repeats}"},
            "quota": {"limits": {"cpus": lim.cpus, "memory_mib": lim.memory_mib, "pids": lim.pids},
                      "cpu_fraction": cgroups.cpu_fraction(), "cgroup": cgroups.detect().version,
                      "sandbox": cpu_quota(getattr(sbs[0].sb, "cgroup", None)),
                      "bare": cpu_quota(bare[0].cgroup)},
            "working_copy": {
                "sandbox": f"{layer_kind(backend, 'tmpfs')} writable layer of {lim.disk_mib} MiB; the workload "
                           f"copied in from the fleet's snapshot",
                "bare": f"{fstype} at {base}, a private copy per worker (cp -a by a process of its cgroup)"},
            "output": {"stdout": "captured", "stderr": "captured", "cap_bytes_each": MAX_OUTPUT,
                       "beyond_cap": "read, counted and dropped"},
            "user": {"sandbox": fleet.spec.user, "bare": pwd.getpwuid(os.geteuid()).pw_name},
            "timing": "host wall clock from sending the command to having its exit status",
        }
        for kind in ("sandbox", "bare", "bare", "sandbox"):
            ws: list[Worker] = list(sbs) if kind == "sandbox" else list(bare)
            say(f"baseline: {n} {kind} workers for {half:.0f}s, on until {per_half} samples per command")
            got[kind] += await load.drive(ws, commands, half, say, f"baseline {kind}:", per_half, cfg.cap_s / 2)
        say(f"baseline: one sandbox and one bare worker, interleaved, x {cfg.repeats}")
        single = await _interleaved(sbs[0], bare[0], commands, cfg.repeats)
    finally:
        await close_all(sbs)
        await close_all(bare)
        fleet.close()
    sb_full, bare_full = load.summarize(got["sandbox"]), load.summarize(got["bare"])
    sb_single, bare_single = load.summarize(single["sandbox"]), load.summarize(single["bare"])
    full, per_full = _geo_ratio(sb_full, bare_full)
    one, per_one = _geo_ratio(sb_single, bare_single)
    results["baseline"] = {**setup, "n": n, "sandbox_full": sb_full, "bare_full": bare_full,
                           "sandbox_single": sb_single, "bare_single": bare_single, "failures": load.failures_of(
                               got["sandbox"] + got["bare"] + single["sandbox"] + single["bare"])}
    lat = {k: load.latencies(v) for k, v in (("sb_full", got["sandbox"]), ("bare_full", got["bare"]),
                                              ("sb_single", single["sandbox"]), ("bare_single", single["bare"]))}
    results["baseline_overhead"] = {
        "full_load": full, "single": one, "n": n, "level": load.CI_LEVEL,
        "full_load_ci": _geo_ratio_ci(lat["sb_full"], lat["bare_full"]),
        "single_ci": _geo_ratio_ci(lat["sb_single"], lat["bare_single"]), "per_command": {
        c: {"full_load": per_full.get(c), "single": per_one.get(c)} for c in sorted(set(per_full) | set(per_one))}}
