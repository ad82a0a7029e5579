"""Where rollout time goes, and what faster inference would change.

Definitions (``docs/figures.md``):

- **Breakdown**: seconds per span per rollout (mean, median, p90) over completed rollouts;
  ``total`` is the rollout's wall time (the spans tile it, so the span means add up to it).
- **Comparison of A and B**: only over the same tasks (different task sets are refused,
  naming the tasks only one run has). Each figure is the mean over tasks of each task's
  mean over its completed rollouts (a task without a completed rollout in either run is
  left out of both, and named). ``delta_s = B - A`` and ``delta_pct = (B - A) / A``, each
  with a 90 % percentile-bootstrap interval (every run's rollouts resampled on their own,
  seed 0: the same traces give the same interval).
- **Gap**: ``gap = (mean_B - mean_A) / mean_A``, the rollout time B adds as a fraction of A's.
  A positive gap means B is slower. This is the reading under which the study's "12 %
  faster" holds: 53 s more on A's ~442 s is 12 % (on B's ~495 s it would be 10.7 %).
- **What-if inference k times faster**: each rollout's ``model`` seconds divided by k, the
  rest kept; the means and the gap recomputed for every k. Not applicable to a run without
  ``model`` spans (a converted trace: the model's time is inside ``agent_command``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from sandfleet import stats
from sandfleet.analysis.trace import Rollout, Run
from sandfleet.errors import ConfigError
from sandfleet.traceschema import SPAN_NAMES

if TYPE_CHECKING:  # numpy is imported where it is used: the runner imports this module, and numpy costs
    import numpy as np  # each process 40 ms and an OpenBLAS thread (sandfleet/stats.py)

GAP_DEFINITION = "(mean rollout time of B - mean of A) / mean of A; positive when B is slower"
COLUMNS = (*SPAN_NAMES, "total")
CI_LEVEL = 0.90
CI_SEED = 0
MAX_NAMED_TASKS = 10


@dataclass(frozen=True)
class Stats:
    """Mean, median and 90th percentile of one quantity over rollouts, in seconds."""

    mean: float
    median: float
    p90: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        mean = sum(values) / len(values) if values else math.nan
        return cls(mean=mean, median=stats.percentile(values, 50), p90=stats.percentile(values, 90))


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
    """How two runs are compared: the tasks both have completed rollouts of (per-task means
    averaged over them), and the tasks left out for want of one."""

    tasks: tuple[str, ...]
    left_out: tuple[str, ...] = ()

    def mean(self, rollouts: Iterable[Rollout], value: Callable[[Rollout], float]) -> float:
        """Mean over ``tasks`` of each task's mean ``value``."""
        task_idx, values = self.arrays(rollouts, value)
        return _task_mean(task_idx, values, len(self.tasks))

    def arrays(
        self, rollouts: Iterable[Rollout], value: Callable[[Rollout], float]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(task index, value) of every rollout of a compared task."""
        import numpy as np

        index = {t: i for i, t in enumerate(self.tasks)}
        rows = [(index[r.task], value(r)) for r in rollouts if r.task in index]
        task_idx = np.array([i for i, _ in rows], dtype=np.intp)
        return task_idx, np.array([v for _, v in rows], dtype=float)


def _task_mean(task_idx: np.ndarray, values: np.ndarray, n_tasks: int) -> float:
    """Mean over the tasks present in ``task_idx`` of each task's mean of ``values``."""
    import numpy as np

    if task_idx.size == 0:
        return math.nan
    counts = np.bincount(task_idx, minlength=n_tasks)
    sums = np.bincount(task_idx, weights=values, minlength=n_tasks)
    have = counts > 0
    return float(np.mean(sums[have] / counts[have]))


def _names(tasks: Iterable[str]) -> str:
    ts = sorted(tasks)
    shown = ", ".join(ts[:MAX_NAMED_TASKS])
    return shown + (f" and {len(ts) - MAX_NAMED_TASKS} more" if len(ts) > MAX_NAMED_TASKS else "")


def pairing(a: Run, b: Run) -> Pairing:
    """The comparison of two runs over their (identical) task sets; a :class:`ConfigError`
    naming the tasks only one run has when they differ."""
    ta, tb = {r.task for r in a.rollouts}, {r.task for r in b.rollouts}
    if ta != tb:
        parts = []
        if ta - tb:
            parts.append(f"only in A ({len(ta - tb)}): {_names(ta - tb)}")
        if tb - ta:
            parts.append(f"only in B ({len(tb - ta)}): {_names(tb - ta)}")
        raise ConfigError(
            f"runs A ({a.path}) and B ({b.path}) are over different tasks, and a comparison "
            f"needs the same tasks in both; " + "; ".join(parts)
        )
    done = {r.task for r in a.completed} & {r.task for r in b.completed}
    return Pairing(tasks=tuple(sorted(done)), left_out=tuple(sorted(ta - done)))


@dataclass(frozen=True)
class Delta:
    """Mean seconds of one span in A and B, B - A in seconds and as a percentage of A,
    and 90 % bootstrap intervals of both."""

    a: float
    b: float
    delta_s_ci: tuple[float, float] = (math.nan, math.nan)
    delta_pct_ci: tuple[float, float] = (math.nan, math.nan)

    @property
    def delta_s(self) -> float:
        return self.b - self.a

    @property
    def delta_pct(self) -> float | None:
        return 100.0 * (self.b - self.a) / self.a if self.a > 0 else None


def _delta(p: Pairing, ra: Sequence[Rollout], rb: Sequence[Rollout], col: str) -> Delta:
    import numpy as np

    ia, va = p.arrays(ra, _column(col))
    ib, vb = p.arrays(rb, _column(col))
    n = len(p.tasks)

    # bootstrap_ci2 resamples what it is given: rollout positions, mapped back here, so the
    # interval is of the very estimator (mean over tasks of per-task means).
    def diff(xa: np.ndarray, xb: np.ndarray) -> tuple[float, float]:
        sa, sb = xa.astype(np.intp), xb.astype(np.intp)
        return _task_mean(ia[sa], va[sa], n), _task_mean(ib[sb], vb[sb], n)

    def seconds(xa: np.ndarray, xb: np.ndarray) -> float:
        ma, mb = diff(xa, xb)
        return mb - ma

    def pct(xa: np.ndarray, xb: np.ndarray) -> float:
        ma, mb = diff(xa, xb)
        return 100.0 * (mb - ma) / ma if ma > 0 else math.nan

    pos_a, pos_b = [float(i) for i in range(ia.size)], [float(i) for i in range(ib.size)]
    d = Delta(a=_task_mean(ia, va, n), b=_task_mean(ib, vb, n))
    s_ci = stats.bootstrap_ci2(pos_a, pos_b, seconds, level=CI_LEVEL, seed=CI_SEED)
    p_ci = (math.nan, math.nan)
    if d.a > 0:
        p_ci = stats.bootstrap_ci2(pos_a, pos_b, pct, level=CI_LEVEL, seed=CI_SEED)
    return Delta(a=d.a, b=d.b, delta_s_ci=s_ci, delta_pct_ci=p_ci)


def compare(a: Run, b: Run) -> tuple[Pairing, dict[str, Delta]]:
    """B - A per span and for the whole rollout, over completed rollouts of the same tasks."""
    p = pairing(a, b)
    ra, rb = a.completed, b.completed
    return p, {col: _delta(p, ra, rb, col) for col in COLUMNS}


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


def whatif_not_applicable(runs: Sequence[Run], labels: Sequence[str] = ("A", "B")) -> str | None:
    """Why dividing model time by k means nothing for these runs, or ``None`` when it does:
    a run that does not time the model apart from the agent, or has no ``model`` span."""
    for lab, run in zip(labels, runs, strict=False):
        if not run.model_time_known:
            return (
                f"run {lab} ({run.name}) does not time the model apart from the agent's "
                "commands (a trace converted from another system: the model's time is inside "
                "agent_command), so there is no model time to divide by k"
            )
        if not any(s.name == "model" for r in run.completed for s in r.spans):
            return (
                f"run {lab} ({run.name}) has no model spans in its completed rollouts, so "
                "there is no model time to divide by k"
            )
    return None


def _plain_mean(rollouts: Sequence[Rollout], value: Callable[[Rollout], float]) -> float:
    return sum(value(r) for r in rollouts) / len(rollouts) if rollouts else math.nan


def whatif(runs: Sequence[Run], ks: Iterable[float]) -> list[WhatIf]:
    """For each k: every run's mean wall time with the ``model`` span divided by k (over
    the same tasks, as :func:`compare` does, with two runs)."""
    p = pairing(runs[0], runs[1]) if len(runs) == 2 else None
    out = []
    for k in ks:
        if k <= 0:
            raise ConfigError(f"what-if speed-up must be positive, got {k}")
        value = partial(_whatif_k, k)
        means = tuple(
            p.mean(run.completed, value) if p else _plain_mean(run.completed, value) for run in runs
        )
        out.append(WhatIf(k=k, mean_s=means))
    return out
