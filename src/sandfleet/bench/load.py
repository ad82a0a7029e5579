"""Driving load and reducing samples: single, sweep, capacity, soak, baseline overhead.

Definitions (docs/bench.md has the long form):

- single: one busy worker runs each command ``repeats`` times; median and p95 per command;
- at load N: N workers loop the mix (each starting at a different command) for a duration;
  a command started before the deadline still counts;
- slowdown at N: ``median(N) / median(1)`` and ``p95(N) / p95(1)`` per command, where "1" is
  the sweep's own N=1 level when measured (same loop, many samples), else ``single``;
- capacity at a target: the largest N of the sweep such that at N and every smaller N
  measured, every command's p95 slowdown is within the target;
- drift (soak): each sample divided by its command's median over the whole soak; drift is
  the median of the last window's values / the first window's, minus 1.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from sandfleet.bench.micro import pct
from sandfleet.bench.workers import Sample, Worker
from sandfleet.bench.workload import Command

Progress = Callable[[str], None]


def summarize(samples: list[Sample]) -> dict[str, Any]:
    """Per command: count, median, p95 and mean latency (s) of the successful runs; failures."""
    by: dict[str, list[float]] = defaultdict(list)
    fails: dict[str, int] = defaultdict(int)
    for s in samples:
        if s.ok:
            by[s.command].append(s.latency_s)
        else:
            fails[s.command] += 1
    out: dict[str, Any] = {}
    for name in sorted(set(by) | set(fails)):
        xs = by.get(name, [])
        out[name] = {"n": len(xs), "failures": fails.get(name, 0),
                     "median_s": round(statistics.median(xs), 5) if xs else None,
                     "p95_s": round(pct(xs, 95), 5) if xs else None,
                     "mean_s": round(statistics.fmean(xs), 5) if xs else None}
    return out


def failures_of(samples: list[Sample], keep: int = 5) -> dict[str, Any]:
    bad = [s for s in samples if not s.ok]
    return {"count": len(bad), "examples": [f"{s.command}: {s.detail}" for s in bad[:keep]]}


async def run_single(worker: Worker, commands: Sequence[Command], repeats: int,
                     say: Progress) -> list[Sample]:
    """Each command ``repeats`` times in one worker (after one untimed warm-up round)."""
    t0 = time.perf_counter()
    for cmd in commands:
        await worker.run(cmd, t0)
    out = []
    for i in range(repeats):
        for cmd in commands:
            out.append(await worker.run(cmd, t0))
        say(f"round {i + 1}/{repeats}")
    return out


async def drive(workers: Sequence[Worker], commands: Sequence[Command], duration_s: float,
                say: Progress | None = None, label: str = "", min_samples: int = 0) -> list[Sample]:
    """Every worker loops the mix until ``duration_s`` has passed and every command has run
    ``min_samples`` times in all; returns all samples, in order."""
    t0 = time.perf_counter()
    deadline = t0 + duration_s
    samples: list[Sample] = []
    counts = dict.fromkeys((c.name for c in commands), 0)

    def more() -> bool:
        return time.perf_counter() < deadline or min(counts.values()) < min_samples

    async def loop(i: int, w: Worker) -> None:
        k = i % len(commands)
        while more():
            samples.append(await w.run(commands[k], t0))
            counts[commands[k].name] += 1
            k = (k + 1) % len(commands)

    async def report() -> None:
        while True:
            await asyncio.sleep(min(30.0, max(5.0, duration_s / 10)))
            if say is not None:
                left = max(0.0, deadline - time.perf_counter())
                bad = sum(not s.ok for s in samples)
                say(f"{label} {len(samples)} commands, {bad} failed, {left:.0f}s left")

    reporter = asyncio.create_task(report())
    try:
        await asyncio.gather(*(loop(i, w) for i, w in enumerate(workers)))
    finally:
        reporter.cancel()
    return samples


def slowdowns(at_n: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """Per command: ``slowdown_median`` and ``slowdown_p95`` of a load level against one worker."""
    out: dict[str, Any] = {}
    for name, row in at_n.items():
        r = ref.get(name)
        if not r or not r.get("median_s") or row.get("median_s") is None:
            continue
        out[name] = {"slowdown_median": round(row["median_s"] / r["median_s"], 3),
                     "slowdown_p95": round(row["p95_s"] / r["p95_s"], 3)}
    return out


def capacity(sweep: dict[str, Any], target: float, threads: int) -> dict[str, Any]:
    """The largest N (contiguously from 1) whose worst p95 slowdown is within ``target``."""
    best, worst_at = 0, {}
    for n in sorted(int(k) for k in sweep):
        sd = sweep[str(n)].get("slowdown", {})
        if not sd:
            break
        name, worst = max(((c, v["slowdown_p95"]) for c, v in sd.items()), key=lambda kv: kv[1])
        worst_at[str(n)] = {"command": name, "slowdown_p95": worst}
        if worst > target or sweep[str(n)].get("failures", {}).get("count", 0):
            break
        best = n
    return {"target": target, "sandboxes": best, "per_thread": round(best / threads, 3),
            "threads": threads, "worst_by_n": worst_at,
            "measured_up_to": max((int(k) for k in sweep), default=0)}


def drift(samples: list[Sample], duration_s: float, windows: int = 10) -> dict[str, Any]:
    """Latency drift over a soak, and the normalized median of every window."""
    ok = [s for s in samples if s.ok]
    if not ok:
        return {"drift": None, "windows": []}
    med = {c: statistics.median([s.latency_s for s in ok if s.command == c]) for c in {s.command for s in ok}}
    width = duration_s / windows
    cells: list[list[float]] = [[] for _ in range(windows)]
    for s in ok:
        cells[min(windows - 1, int(s.t // width))].append(s.latency_s / med[s.command])
    meds = [round(statistics.median(c), 4) if c else None for c in cells]
    first = next((m for m in meds if m), None)
    last = next((m for m in reversed(meds) if m), None)
    value = round(last / first - 1, 4) if first and last else None
    return {"drift": value, "windows": meds, "window_s": round(width, 1)}
