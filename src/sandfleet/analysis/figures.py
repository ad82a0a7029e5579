"""KV-cache idle, GRPO group wait and staleness, exactly as ``docs/trace-schema.md`` defines.

- **KV-cache idle fraction**: the context ``c(t)`` of a rollout is the ``prompt_tokens`` of a
  ``model`` span while it runs, and ``prompt_tokens + completion_tokens`` of the latest
  ``model`` span after it ends. The window runs from the first ``model`` span's start to the
  later of the last ``model`` span's end and the ``verifier``'s end. Idle fraction =
  sum of the integral of c(t) over ``agent_command`` and ``verifier`` spans in the window /
  sum of the integral of c(t) over the window, summed over all rollouts with model spans.
- **Group wait fraction**: over completed rollouts, sum of (group end - rollout end) / sum of
  rollout durations; a group ends when its slowest member (of any status) ends.
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sandfleet.analysis.breakdown import percentile
from sandfleet.analysis.trace import Rollout
from sandfleet.errors import ConfigError

IDLE_SPANS = ("agent_command", "verifier")
STALENESS_QUANTILE = 90.0


def _tokens(attrs: object, key: str) -> float:
    v = attrs.get(key) if isinstance(attrs, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def kv_integrals(r: Rollout) -> tuple[float, float]:
    """(idle, total) token-seconds of one rollout's KV cache; (0, 0) without model spans."""
    models = [s for s in r.spans if s.name == "model"]
    if not models:
        return 0.0, 0.0
    w0 = models[0].start
    w1 = max([models[-1].end] + [s.end for s in r.spans if s.name == "verifier"])
    idle = total = 0.0
    context = 0.0
    for s in r.spans:
        if s.name == "model":
            prompt = _tokens(s.attrs, "prompt_tokens")
            c = prompt
        else:
            c = context
        seconds = max(0.0, min(s.end, w1) - max(s.start, w0))
        total += c * seconds
        if s.name in IDLE_SPANS:
            idle += c * seconds
        if s.name == "model":
            context = prompt + _tokens(s.attrs, "completion_tokens")
    return idle, total


def kv_idle_fraction(rollouts: Iterable[Rollout]) -> float | None:
    """Fraction of KV-cache token-seconds held while the agent's commands or the verifier
    hold the turn; ``None`` when no rollout has model spans with token counts."""
    idle = total = 0.0
    for r in rollouts:
        i, t = kv_integrals(r)
        idle += i
        total += t
    return idle / total if total > 0 else None


@dataclass(frozen=True)
class GroupWait:
    """Group wait over completed rollouts: the overall fraction and each rollout's own."""

    fraction: float | None
    per_rollout: tuple[float, ...]
    groups: int


def group_wait(rollouts: Sequence[Rollout]) -> GroupWait:
    """Sum of (group end - rollout end) / sum of durations, over completed rollouts."""
    group_end: dict[str, float] = defaultdict(lambda: -math.inf)
    for r in rollouts:
        group_end[r.group] = max(group_end[r.group], r.end)
    waited = busy = 0.0
    per: list[float] = []
    for r in rollouts:
        if r.status != "completed":
            continue
        w = group_end[r.group] - r.end
        waited += w
        busy += r.duration
        if r.duration > 0:
            per.append(w / r.duration)
    return GroupWait(
        fraction=waited / busy if busy > 0 else None,
        per_rollout=tuple(sorted(per)),
        groups=len({r.group for r in rollouts if r.status == "completed"}),
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
        p50=percentile(versions, 50),
        p90=percentile(versions, 90),
        max=max(versions),
        histogram=dict(sorted(hist.items())),
    )


def step_time_for_bound(durations: Sequence[float], bound: float) -> float:
    """The largest step time T such that p90 of d/T stays within ``bound`` versions."""
    if not bound > 0:
        raise ConfigError(f"staleness bound must be positive, got {bound}")
    if not durations:
        raise ConfigError("no completed rollouts to compute staleness from")
    return percentile(durations, STALENESS_QUANTILE) / bound


def training_speedup(step_a: float, step_b: float) -> float:
    """How much faster training can step with the shorter rollouts, at equal staleness:
    ``max(T) / min(T) - 1`` of the two allowed step times."""
    lo, hi = sorted((step_a, step_b))
    return hi / lo - 1 if lo > 0 else math.nan
