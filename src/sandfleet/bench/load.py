"""Driving load and reducing samples: single, sweep, slowdown, capacity, soak drift.

Definitions (docs/bench.md has the long form). Every percentile is
:func:`sandfleet.stats.percentile` (numpy's linear interpolation), every interval a 90 %
percentile bootstrap (:func:`sandfleet.stats.bootstrap_ci`, seeded):

- single: one busy worker runs each command ``repeats`` times; median and p95 per command;
- at load N: N workers loop the mix (each starting at a different command) for a duration,
  and on until every command ran ``min_samples`` times or a time cap passes;
  a command started before the end still counts;
- interleaved single baseline: one worker alone runs rounds of the mix before the first
  load level, between levels and after the last, so that the host's drift over the sweep
  affects the reference as it affects the levels;
- slowdown at N: ``p95(N) / p95(single)`` (``slowdown_p95``, with a bootstrap CI resampling
  both) and ``median(N) / median(single)`` (``slowdown_median``), per command, "single"
  being the interleaved single baseline's samples (N=1 is a load level like the others);
- capacity at a target: with levels in increasing N, the worst command's p95 slowdown at
  each, ``lo`` the last level such that it and every smaller level are within the target
  without failures, ``hi`` the next one; capacity = ``lo + (hi - lo) * (target - s(lo)) /
  (s(hi) - s(lo))`` (linear interpolation of the worst p95 slowdown s between them);
- finer grid: after the coarse sweep, up to ``refine`` levels evenly spaced strictly
  between ``lo`` and ``hi`` are measured too, then the capacity is computed again;
- drift (soak): each sample divided by its command's median over the whole soak; drift is
  the median of the last window's values / the first window's, minus 1.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from sandfleet.bench.workers import Sample, Worker, alive
from sandfleet.bench.workload import Command
from sandfleet.stats import bootstrap_ci, bootstrap_ci2, percentile

Progress = Callable[[str], None]
CI_LEVEL = 0.90
"""Level of every bootstrap interval in the bench figures."""


def p95(values: Any) -> float:
    """:func:`sandfleet.stats.percentile` at 95 (of a list, or a bootstrap resample's array)."""
    return percentile(values, 95)


def _r(x: float, digits: int = 5) -> float | None:
    return None if math.isnan(x) else round(x, digits)


def latencies(samples: list[Sample]) -> dict[str, list[float]]:
    """Per command: the latencies (s) of the successful runs, in order."""
    by: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        if s.ok:
            by[s.command].append(s.latency_s)
    return dict(by)


def summarize(samples: list[Sample], *, ci: bool = True) -> dict[str, Any]:
    """Per command: count, median, p95 (with its bootstrap CI) and mean latency (s) of the
    successful runs; failures."""
    by = latencies(samples)
    fails: dict[str, int] = defaultdict(int)
    for s in samples:
        if not s.ok:
            fails[s.command] += 1
    out: dict[str, Any] = {}
    for name in sorted(set(by) | set(fails)):
        xs = by.get(name, [])
        row: dict[str, Any] = {"n": len(xs), "failures": fails.get(name, 0),
                               "median_s": _r(percentile(xs, 50)) if xs else None,
                               "p95_s": _r(p95(xs)) if xs else None,
                               "mean_s": _r(statistics.fmean(xs)) if xs else None}
        if ci:
            lo, hi = bootstrap_ci(xs, p95, level=CI_LEVEL) if xs else (math.nan, math.nan)
            row["p95_ci_s"] = [_r(lo), _r(hi)] if xs else None
        out[name] = row
    return out


def failures_of(samples: list[Sample], keep: int = 5) -> dict[str, Any]:
    bad = [s for s in samples if not s.ok]
    return {"count": len(bad), "examples": [f"{s.command}: {s.detail}" for s in bad[:keep]]}


async def run_rounds(worker: Worker, commands: Sequence[Command], rounds: int, *, warmup: bool = False,
                     say: Progress | None = None) -> list[Sample]:
    """Each command once per round in one worker (after one untimed warm-up round if asked)."""
    t0 = time.perf_counter()
    if warmup:
        for cmd in commands:
            await worker.run(cmd, t0)
    out = []
    for i in range(rounds):
        for cmd in commands:
            s = await worker.run(cmd, t0)
            out.append(s)
            if not s.ok and not alive(worker):  # a dead sandbox: one failure says it
                return out
        if say is not None:
            say(f"round {i + 1}/{rounds}")
    return out


async def run_single(worker: Worker, commands: Sequence[Command], repeats: int,
                     say: Progress) -> list[Sample]:
    """Each command ``repeats`` times in one worker (after one untimed warm-up round)."""
    return await run_rounds(worker, commands, repeats, warmup=True, say=say)


async def drive(workers: Sequence[Worker], commands: Sequence[Command], duration_s: float,
                say: Progress | None = None, label: str = "", min_samples: int = 0,
                cap_s: float | None = None) -> list[Sample]:
    """Every worker loops the mix until ``duration_s`` has passed and every command ran
    ``min_samples`` times in all (or, past the duration, until ``cap_s`` seconds from the
    start); a worker whose sandbox died stops (its death is one failed sample); returns all
    samples, in order. (A command's p95 is over its successful runs: with failures it has
    fewer, and the level failed anyway.)"""
    t0 = time.perf_counter()
    deadline = t0 + duration_s
    cap = t0 + max(duration_s, cap_s) if cap_s is not None else math.inf
    samples: list[Sample] = []
    counts = dict.fromkeys((c.name for c in commands), 0)

    def more() -> bool:
        now = time.perf_counter()
        return now < deadline or (min(counts.values()) < min_samples and now < cap)

    async def loop(i: int, w: Worker) -> None:
        k = i % len(commands)
        while more():
            s = await w.run(commands[k], t0)
            samples.append(s)
            counts[commands[k].name] += 1  # failed runs too: a failing level ends at min_samples, not the cap
            if not s.ok and not alive(w):  # a dead sandbox: one failure says it, no busy loop of them
                return
            k = (k + 1) % len(commands)

    async def report() -> None:
        while True:
            await asyncio.sleep(min(30.0, max(5.0, duration_s / 10)))
            if say is not None:
                left = max(0.0, deadline - time.perf_counter())
                bad = sum(not s.ok for s in samples)
                say(f"{label} {len(samples)} commands, {bad} failed, fewest samples {min(counts.values())}"
                    f"/{min_samples}, {left:.0f}s of the duration left")

    reporter = asyncio.create_task(report())
    try:
        await asyncio.gather(*(loop(i, w) for i, w in enumerate(workers)))
    finally:
        reporter.cancel()
    return samples


def slowdowns(at_n: dict[str, Any], ref: dict[str, Any], at_samples: dict[str, list[float]] | None = None,
              ref_samples: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Per command: ``slowdown_median`` = median(N) / median(ref) and ``slowdown_p95`` =
    p95(N) / p95(ref) from the summaries; with the raw latencies of both, also
    ``slowdown_p95_ci``: a bootstrap interval of p95(N) / p95(ref), each side resampled."""
    out: dict[str, Any] = {}
    for name, row in at_n.items():
        r = ref.get(name)
        if not r or not r.get("median_s") or not r.get("p95_s") or row.get("median_s") is None:
            continue
        cell: dict[str, Any] = {"slowdown_median": round(row["median_s"] / r["median_s"], 3),
                                "slowdown_p95": round(row["p95_s"] / r["p95_s"], 3)}
        a, b = (at_samples or {}).get(name), (ref_samples or {}).get(name)
        if a and b:
            lo, hi = bootstrap_ci2(a, b, lambda x, y: p95(x) / p95(y), level=CI_LEVEL)
            cell["slowdown_p95_ci"] = [round(lo, 3), round(hi, 3)]
        out[name] = cell
    return out


def _bracket(sweep: dict[str, Any], target: float) -> tuple[
        tuple[int, float] | None, tuple[int, float, str] | None, dict[str, Any]]:
    """Scanning levels in increasing N: (last level within the target, with its worst p95
    slowdown), (the first one past it, its worst, and why: "slowdown" or "failures"), and the
    worst command at every level scanned."""
    lo: tuple[int, float] | None = None
    worst_at: dict[str, Any] = {}
    for n in sorted(int(k) for k in sweep):
        row = sweep[str(n)]
        sd = row.get("slowdown") or {}
        if not sd:
            break
        name, worst = max(((c, v["slowdown_p95"]) for c, v in sd.items()), key=lambda kv: kv[1])
        worst_at[str(n)] = {"command": name, "slowdown_p95": worst}
        if worst > target:
            return lo, (n, worst, "slowdown"), worst_at
        if (row.get("failures") or {}).get("count", 0):
            return lo, (n, worst, "failures"), worst_at
        lo = (n, worst)
    return lo, None, worst_at


def interpolate(lo: tuple[int, float], hi: tuple[int, float], target: float) -> float:
    """N where the line through (n_lo, s_lo) and (n_hi, s_hi) reaches ``target``."""
    (n0, s0), (n1, s1) = lo, hi
    return n0 + (n1 - n0) * (target - s0) / (s1 - s0)


def capacity(sweep: dict[str, Any], target: float, threads: int) -> dict[str, Any]:
    """Busy sandboxes at which the worst p95 slowdown reaches ``target``, interpolated
    linearly between the last level within it and the first past it (see the module doc)."""
    lo, hi, worst_at = _bracket(sweep, target)
    if hi is None:
        value = float(lo[0]) if lo else 0.0
        method = ("not reached: every measured level is within the target (a lower bound)" if lo
                  else "no level with a slowdown")
    elif lo is None:
        value, method = 0.0, f"past the target at the smallest level, N={hi[0]}"
    elif hi[2] == "failures":
        value, method = float(lo[0]), f"failures at N={hi[0]}: the last level without, not interpolated"
    else:
        value, method = interpolate(lo, (hi[0], hi[1]), target), f"interpolated between N={lo[0]} and N={hi[0]}"
    levels = sorted(int(k) for k in sweep)
    value = round(value, 2)
    return {"target": target, "sandboxes": value, "per_thread": round(value / threads, 3),
            "threads": threads, "last_within": lo[0] if lo else None, "first_over": hi[0] if hi else None,
            "method": method, "worst_by_n": worst_at, "measured": levels,
            "measured_up_to": max(levels, default=0)}


def finer_levels(sweep: dict[str, Any], target: float, refine: int) -> list[int]:
    """Up to ``refine`` new levels, evenly spaced strictly between the last level within the
    target and the first past it (rounded half up; none when they are adjacent or there is
    no crossing)."""
    lo, hi, _ = _bracket(sweep, target)
    if lo is None or hi is None or refine < 1 or hi[0] - lo[0] < 2:
        return []
    a, b = lo[0], hi[0]
    m = min(refine, b - a - 1)
    new = {a + math.floor((b - a) * k / (m + 1) + 0.5) for k in range(1, m + 1)}
    return sorted(n for n in new if a < n < b and str(n) not in sweep)


def drift(samples: list[Sample], duration_s: float, windows: int = 10) -> dict[str, Any]:
    """Latency drift over a soak, and the normalized median of every window."""
    ok = [s for s in samples if s.ok]
    if not ok:
        return {"drift": None, "windows": []}
    med = {c: percentile([s.latency_s for s in ok if s.command == c], 50) for c in {s.command for s in ok}}
    width = duration_s / windows
    cells: list[list[float]] = [[] for _ in range(windows)]
    for s in ok:
        cells[min(windows - 1, int(s.t // width))].append(s.latency_s / med[s.command])
    meds = [round(percentile(c, 50), 4) if c else None for c in cells]
    first = next((m for m in meds if m), None)
    last = next((m for m in reversed(meds) if m), None)
    value = round(last / first - 1, 4) if first and last else None
    return {"drift": value, "windows": meds, "window_s": round(width, 1)}
