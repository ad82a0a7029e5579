"""Where rollout time goes, and what faster inference would change.

Definitions (``shared/DESIGN.md``, "Definitions of the figures"):

- **Breakdown**: seconds per span per rollout (mean, median, p90) over completed rollouts;
  ``total`` is the rollout's wall time (the spans tile it, so the span means add up to it).
- **Comparison of A and B**: when both runs share tasks, rollouts are paired by task: the
  figure is the mean over the shared tasks of each task's mean (tasks only one run has are
  left out and counted). Without shared tasks it is the plain mean over all rollouts.
  ``delta_s = B - A`` and ``delta_pct = (B - A) / A``.
- **Gap**: ``gap = (mean_B - mean_A) / mean_A``, the rollout time B adds as a fraction of A's.
  A positive gap means B is slower. This is the reading under which the study's "12 %
  faster" holds: 53 s more on A's ~442 s is 12 % (on B's ~495 s it would be 10.7 %).
- **What-if inference k times faster**: each rollout's ``model`` seconds divided by k, the
  rest kept; the means and the gap recomputed for every k.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from sandfleet.analysis.trace import Rollout, Run
from sandfleet.errors import ConfigError
from sandfleet.traceschema import SPAN_NAMES

GAP_DEFINITION = "(mean rollout time of B - mean of A) / mean of A; positive when B is slower"
COLUMNS = (*SPAN_NAMES, "total")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stats:
    """Mean, median and 90th percentile of one quantity over rollouts, in seconds."""

    mean: float
    median: float
    p90: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        mean = sum(values) / len(values) if values else math.nan
        return cls(mean=mean, median=percentile(values, 50), p90=percentile(values, 90))


def rollout_seconds(r: Rollout) -> dict[str, float]:
    """Seconds per span name, plus ``total`` (the wall time)."""
    out = r.span_seconds()
    out["total"] = r.duration
    return out


def breakdown(rollouts: Iterable[Rollout]) -> dict[str, Stats]:
    """Per span (and ``total``): mean, median, p90 over the given rollouts."""
    rows = [rollout_seconds(r) for r in rollouts]
    return {col: Stats.of([row[col] for row in rows]) for col in COLUMNS}


@dataclass(frozen=True)
class Pairing:
    """How two runs are compared: by shared task, or over all rollouts."""

    paired: bool
    tasks: tuple[str, ...]
    only_a: int
    only_b: int

    def mean(self, rollouts: Iterable[Rollout], value: Callable[[Rollout], float]) -> float:
        """Mean of ``value``: of per-task means over ``tasks`` when paired, else plain."""
        if not self.paired:
            vals = [value(r) for r in rollouts]
            return sum(vals) / len(vals) if vals else math.nan
        by_task: dict[str, list[float]] = defaultdict(list)
        for r in rollouts:
            by_task[r.task].append(value(r))
        task_means = [sum(by_task[t]) / len(by_task[t]) for t in self.tasks if by_task[t]]
        return sum(task_means) / len(task_means) if task_means else math.nan


def pairing(a: Sequence[Rollout], b: Sequence[Rollout]) -> Pairing:
    """Pair by task when the runs share tasks; otherwise compare plain means."""
    ta, tb = {r.task for r in a}, {r.task for r in b}
    shared = tuple(sorted(ta & tb))
    if not shared:
        return Pairing(paired=False, tasks=(), only_a=0, only_b=0)
    return Pairing(paired=True, tasks=shared, only_a=len(ta - tb), only_b=len(tb - ta))


def unpaired() -> Pairing:
    return Pairing(paired=False, tasks=(), only_a=0, only_b=0)


@dataclass(frozen=True)
class Delta:
    """Mean seconds of one span in A and B, and B - A in seconds and as a fraction of A."""

    a: float
    b: float

    @property
    def delta_s(self) -> float:
        return self.b - self.a

    @property
    def delta_pct(self) -> float | None:
        return 100.0 * (self.b - self.a) / self.a if self.a > 0 else None


def compare(a: Run, b: Run) -> tuple[Pairing, dict[str, Delta]]:
    """B - A per span and for the whole rollout, over completed rollouts."""
    ra, rb = a.completed, b.completed
    p = pairing(ra, rb)
    out = {col: Delta(a=p.mean(ra, _column(col)), b=p.mean(rb, _column(col))) for col in COLUMNS}
    return p, out


def _column(col: str) -> Callable[[Rollout], float]:
    def value(r: Rollout) -> float:
        return rollout_seconds(r)[col]

    return value


def whatif_seconds(r: Rollout, k: float) -> float:
    """The rollout's wall time if inference were ``k`` times faster."""
    model = sum(s.duration for s in r.spans if s.name == "model")
    return r.duration - model + model / k


def _whatif_k(k: float, r: Rollout) -> float:
    return whatif_seconds(r, k)


def gap(mean_a: float, mean_b: float) -> float:
    """The gap as a fraction (see :data:`GAP_DEFINITION`)."""
    return (mean_b - mean_a) / mean_a if mean_a > 0 else math.nan


@dataclass(frozen=True)
class WhatIf:
    """Mean rollout seconds of each run at speed-up ``k``, and their gap (two runs)."""

    k: float
    mean_s: tuple[float, ...]

    @property
    def gap(self) -> float | None:
        return gap(self.mean_s[0], self.mean_s[1]) if len(self.mean_s) == 2 else None


def whatif(runs: Sequence[Run], ks: Iterable[float]) -> list[WhatIf]:
    """For each k: every run's mean wall time with the ``model`` span divided by k."""
    if len(runs) == 2:
        p = pairing(runs[0].completed, runs[1].completed)
    else:
        p = unpaired()
    out = []
    for k in ks:
        if k <= 0:
            raise ConfigError(f"what-if speed-up must be positive, got {k}")
        means = tuple(p.mean(run.completed, partial(_whatif_k, k)) for run in runs)
        out.append(WhatIf(k=k, mean_s=means))
    return out
