"""Platform overhead, KV-cache idle, GRPO group wait and staleness (``docs/figures.md``).

- **Platform overhead**: per rollout, the seconds of ``sandbox_start`` + ``other_sandbox`` +
  ``overhead`` (our bookkeeping). Reported as the mean per completed rollout, and as a
  fraction: the sum over completed rollouts / the sum of their wall times.
- **KV-cache idle fraction**: a rollout's context ``c(t)`` is a ``model`` span's
  ``prompt_tokens`` while it runs, and ``prompt_tokens + completion_tokens`` of the latest
  ``model`` span after it ends; a ``model`` span without usage keeps the previous size.
  The window runs from the first ``model`` span's start to the last ``model`` span's end.
  Idle = the integral of c(t) over the window's time outside ``model`` spans (a response
  to the next request); the fraction = sum over rollouts of idle token-seconds / sum of the
  window's token-seconds. The *through reward* variant extends the window to the end of
  the last ``verifier`` span (or the rollout's end without one), for engines that keep
  the session until the reward. Every attempt counts (a failed one held the cache too).
- **Group wait fraction**: a group is admitted together, so it starts at the earliest start
  of any attempt of its members, and ends at the latest end of its members' final
  attempts (an attempt that was retried does not set it). Over completed rollouts,
  sum of (group end - rollout end) / sum of (group end - group start).
- **Staleness**: with a trainer step every T seconds, a rollout of duration d lands about d/T
  weight versions behind. The step time a bound K allows is the largest T with
  p90(d) / T <= K, i.e. ``T = p90(d) / K`` (p90, so that nine rollouts in ten stay within
  the bound; the slowest tenth is what an off-policy correction or a drop rule handles).
  Comparing two runs, "training can be X % faster at the same staleness" is
  ``T_A / T_B - 1`` with A the run with shorter rollouts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sandfleet import stats
from sandfleet.analysis.trace import Rollout, final_attempts
from sandfleet.errors import ConfigError

PLATFORM_SPANS = ("sandbox_start", "other_sandbox", "overhead")
"""The spans that are the platform's, not the agent's, the model's or the verifier's."""
STALENESS_QUANTILE = 90.0


class _Timed(Protocol):
    """A rollout with a status, a wall time and seconds per span (analysis's ``Rollout``
    and the runner's ``RolloutResult`` both are)."""

    @property
    def status(self) -> str: ...

    @property
    def duration(self) -> float: ...

    def span_seconds(self) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class PlatformOverhead:
    """Platform seconds (``PLATFORM_SPANS``) over completed rollouts."""

    mean_s: float | None
    """Mean seconds per completed rollout."""
    fraction: float | None
    """Sum of platform seconds / sum of wall time, over completed rollouts."""
    rollouts: int


def platform_overhead(rollouts: Iterable[_Timed]) -> PlatformOverhead:
    """sandbox_start + other_sandbox + overhead per completed rollout, and its share of
    the wall time; ``None`` figures without completed rollouts."""
    seconds: list[float] = []
    wall = 0.0
    for r in rollouts:
        if r.status != "completed":
            continue
        spans = r.span_seconds()
        seconds.append(sum(spans.get(n, 0.0) for n in PLATFORM_SPANS))
        wall += r.duration
    return PlatformOverhead(
        mean_s=sum(seconds) / len(seconds) if seconds else None,
        fraction=sum(seconds) / wall if wall > 0 else None,
        rollouts=len(seconds),
    )


def platform_overhead_summary(rollouts: Iterable[_Timed]) -> dict[str, float | None]:
    """The two platform figures under the keys ``summary.json`` and the analysis use."""
    p = platform_overhead(rollouts)
    return {"platform_overhead_s": p.mean_s, "platform_overhead_fraction": p.fraction}


def _usage(attrs: Mapping[str, Any]) -> tuple[float, float] | None:
    """(prompt, completion) tokens of a model span; ``None`` when it carries neither."""

    def num(key: str) -> float | None:
        v = attrs.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return None
        return float(v)

    prompt, completion = num("prompt_tokens"), num("completion_tokens")
    if prompt is None and completion is None:
        return None
    return prompt or 0.0, completion or 0.0


def kv_integrals(r: Rollout, through_reward: bool = False) -> tuple[float, float]:
    """(idle, total) token-seconds of one rollout's KV cache over its window; (0, 0)
    without model spans. ``through_reward`` extends the window to the reward."""
    models = [s for s in r.spans if s.name == "model"]
    if not models:
        return 0.0, 0.0
    w0, w1 = models[0].start, models[-1].end
    if through_reward:
        verifier_ends = [s.end for s in r.spans if s.name == "verifier"]
        w1 = max(w1, *verifier_ends) if verifier_ends else r.end
    idle = total = 0.0
    context = 0.0  # after the latest model response with usage
    for s in r.spans:
        seconds = max(0.0, min(s.end, w1) - max(s.start, w0))
        if s.name == "model":
            usage = _usage(s.attrs)
            total += (usage[0] if usage else context) * seconds
            if usage:
                context = usage[0] + usage[1]
        else:
            idle += context * seconds
            total += context * seconds
    return idle, total


@dataclass(frozen=True)
class KVIdle:
    """KV-cache idle over a run's rollouts (every attempt), both windows."""

    fraction: float | None
    """Window: first model request to last model response."""
    fraction_through_reward: float | None
    """Window: first model request to the reward (verifier's end, or the rollout's end)."""
    per_rollout: tuple[float, ...]
    """Each rollout's own idle fraction (first window), sorted; rollouts with context only."""


def kv_idle(rollouts: Iterable[Rollout]) -> KVIdle:
    """Sum of idle token-seconds / sum of token-seconds, over rollouts; ``None`` when no
    rollout has model spans with token counts."""
    idle = total = idle_r = total_r = 0.0
    per: list[float] = []
    for r in rollouts:
        i, t = kv_integrals(r)
        ir, tr = kv_integrals(r, through_reward=True)
        idle, total, idle_r, total_r = idle + i, total + t, idle_r + ir, total_r + tr
        if t > 0:
            per.append(i / t)
    return KVIdle(
        fraction=idle / total if total > 0 else None,
        fraction_through_reward=idle_r / total_r if total_r > 0 else None,
        per_rollout=tuple(sorted(per)),
    )


def kv_idle_fraction(rollouts: Iterable[Rollout], through_reward: bool = False) -> float | None:
    """The KV-cache idle fraction of :func:`kv_idle` for one window."""
    k = kv_idle(rollouts)
    return k.fraction_through_reward if through_reward else k.fraction


@dataclass(frozen=True)
class GroupWait:
    """Group wait over completed rollouts: the overall fraction and each rollout's own."""

    fraction: float | None
    per_rollout: tuple[float, ...]
    """(group end - rollout end) / (group end - group start) per completed rollout, sorted."""
    groups: int


def group_wait(rollouts: Sequence[Rollout]) -> GroupWait:
    """Sum of (group end - rollout end) / sum of (group end - group start), over completed
    rollouts. ``rollouts`` is every attempt of a run: the group starts at its first
    attempt's start and ends at the last end of its members' final attempts."""
    start: dict[str, float] = {}
    for r in rollouts:
        start[r.group] = min(start.get(r.group, math.inf), r.start)
    finals = final_attempts(rollouts)
    end: dict[str, float] = {}
    for r in finals:
        end[r.group] = max(end.get(r.group, -math.inf), r.end)
    waited = held = 0.0
    per: list[float] = []
    groups = set()
    for r in finals:
        if r.status != "completed":
            continue
        g_start, g_end = start[r.group], end[r.group]
        waited += g_end - r.end
        held += g_end - g_start
        groups.add(r.group)
        if g_end > g_start:
            per.append((g_end - r.end) / (g_end - g_start))
    return GroupWait(
        fraction=waited / held if held > 0 else None,
        per_rollout=tuple(sorted(per)),
        groups=len(groups),
    )


@dataclass(frozen=True)
class Staleness:
    """How many weight versions behind rollouts land with a step every ``step_time_s``."""

    step_time_s: float
    p50: float
    p90: float
    max: float
    histogram: dict[int, int]
    """Versions (floor of d/T) to the number of rollouts landing that many versions behind."""


def staleness(durations: Sequence[float], step_time_s: float) -> Staleness:
    """Distribution of d/T over rollout durations ``d`` for a trainer step time ``T``."""
    if not step_time_s > 0:
        raise ConfigError(f"step time must be positive, got {step_time_s}")
    if not durations:
        raise ConfigError("no completed rollouts to compute staleness from")
    versions = [d / step_time_s for d in durations]
    hist: dict[int, int] = defaultdict(int)
    for v in versions:
        hist[math.floor(v)] += 1
    return Staleness(
        step_time_s=step_time_s,
        p50=stats.percentile(versions, 50),
        p90=stats.percentile(versions, 90),
        max=max(versions),
        histogram=dict(sorted(hist.items())),
    )


def step_time_for_bound(durations: Sequence[float], bound: float) -> float:
    """The largest step time T such that p90 of d/T stays within ``bound`` versions."""
    if not bound > 0:
        raise ConfigError(f"staleness bound must be positive, got {bound}")
    if not durations:
        raise ConfigError("no completed rollouts to compute staleness from")
    return stats.percentile(durations, STALENESS_QUANTILE) / bound


def training_speedup(step_a: float, step_b: float) -> float:
    """How much faster training can step with the shorter rollouts, at equal staleness:
    ``max(T) / min(T) - 1`` of the two allowed step times."""
    lo, hi = sorted((step_a, step_b))
    return hi / lo - 1 if lo > 0 else math.nan
