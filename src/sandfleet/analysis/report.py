"""One analysis of one or two runs: :func:`build_report` makes the typed
:class:`~sandfleet.analysis.schema.Report` that every renderer reads; :func:`analyze` is its
JSON (the ``--json`` output).

The JSON (``schema: sandfleet.analysis/1``; every figure is defined in ``docs/figures.md``)
has:

- ``provenance``: ``analysis`` (the analysing host, sandfleet version and commit, time and
  the analysis options) and ``runs``: label to the ``provenance`` its ``run.json`` recorded
  (null when the run directory has none).
- ``runs``: label (``A``, ``B``) to name, path and rollout counts per status (every
  attempt), and the verdicts of final attempts: ``verdicts`` (``scored``, ``policy_fault``,
  ``infra_fault`` to counts), ``mask_rate``, ``pass_rate`` (reward >= 1 over scored and
  policy-fault rollouts) and ``refilled`` (masked attempts that were run again).
- ``spans``: label to span (and ``total``) to ``{mean, median, p90}`` seconds.
- ``spans_mean_s``: label to span (and ``total``) to mean seconds.
- ``raw_bwrap_true_ms``: label to a bare ``bwrap true`` timed when the run started (its
  ``run.json``; None when not recorded), the floor ``sandbox_start`` is reported against.
- ``platform_overhead_s`` and ``platform_overhead_fraction``: label to the mean seconds of
  sandbox_start + other_sandbox + overhead per completed rollout, and to their share of
  the wall time.
- ``compare`` (two runs, on the same tasks): ``tasks`` (how many), ``tasks_left_out``
  (without a completed rollout in one run), ``ci_level``, and per span
  ``{a, b, delta_s, delta_s_ci90, delta_pct, delta_pct_ci90}``.
- ``whatif``: k to the gap (two runs; a fraction, see ``gap_definition``) or to the mean
  rollout seconds (one run); ``whatif_detail`` gives every run's mean for each k. Both are
  null when ``whatif_not_applicable`` gives the reason (no model spans), else it is null.
- ``kv_idle_fraction`` and ``kv_idle_fraction_through_reward``: label to a fraction (or
  null); ``kv_idle_per_rollout``: label to each rollout's own fraction.
- ``group_wait_fraction``: label to a fraction (or null); ``group_wait_per_rollout``:
  label to each completed rollout's own.
- ``staleness``: the bound, the step time it allows per run, the distribution per run at
  ``step_time_s`` (given, or else the step time run A's bound allows), and with two runs
  ``training_faster_pct``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from typing import Any

import sandfleet.analysis.breakdown as bd
import sandfleet.analysis.figures as fg
from sandfleet.analysis.schema import (
    LABELS,
    Compare,
    Contention,
    PhaseContention,
    Provenance,
    Report,
    RunSummary,
    SpanDelta,
    SpanStats,
    Staleness,
    StalenessDistribution,
    Verdicts,
    WhatIfPoint,
)
from sandfleet.analysis.trace import STATUSES, VERDICTS, Run, final_attempts
from sandfleet.analysis.trees import tree_figures
from sandfleet.errors import ConfigError
from sandfleet.provenance import provenance
from sandfleet.stats import percentile

DEFAULT_WHATIF = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _num(x: float | None) -> float | None:
    """JSON-safe number: NaN and infinities become null."""
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return None
    return round(x, 6)


def _k_key(k: float) -> str:
    return f"{k:g}"


def _ci(ci: tuple[float, float]) -> tuple[float, float] | None:
    lo, hi = _num(ci[0]), _num(ci[1])
    return None if lo is None or hi is None else (lo, hi)


def _run_json(run: Run, key: str) -> Any:
    """``key`` of the run's ``run.json``; None when there is none (a converted trace, a bare
    trace file, a run from before runs recorded it)."""
    path = run.path.parent / "run.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return {"unreadable": f"{path}: {e}"}
    return info.get(key) if isinstance(info, dict) else None


def verdict_figures(run: Run) -> dict[str, Any]:
    """Verdicts of a run's final attempts, its mask rate and its pass rate over the rollouts
    that train (scored and policy faults), and how many masked attempts were run again."""
    finals = final_attempts(run.rollouts)
    counts = {v: sum(r.verdict == v for r in finals) for v in VERDICTS}
    kept = [r for r in finals if not r.masked]
    passed = sum(r.reward is not None and r.reward >= 1.0 - 1e-9 for r in kept)
    return {"verdicts": Verdicts(**counts), "mask_rate": counts["infra_fault"] / len(finals) if finals else None,
            "pass_rate": passed / len(kept) if kept else None,
            "refilled": sum(r.masked for r in run.rollouts) - counts["infra_fault"]}


CONTENTION_PHASES = ("agent", "verifier")


def contention_figures(run: Run) -> Contention:
    """Per phase, over the final attempts that measured it (docs/rollouts.md, "Contention"):
    ``measured`` (how many), ``outside_share`` mean and p95, mean ``outside_wait_s``, mean
    ``throttled_s`` (the sandbox's own limit) and ``run_delay_s``; and ``host_contention``,
    the final attempts masked for it (``host_contention_rate`` of all final attempts)."""
    finals = final_attempts(run.rollouts)
    phases: dict[str, PhaseContention] = {}
    for phase in CONTENTION_PHASES:
        figs = [f for r in finals if r.contention and isinstance(f := r.contention.get(phase), dict)]

        def vals(key: str, figs: list[Any] = figs) -> list[float]:
            return [float(f[key]) for f in figs if isinstance(f.get(key), int | float)]

        share = vals("outside_share")
        phases[phase] = PhaseContention(
            measured=len(figs),
            outside_share_mean=_num(statistics.fmean(share)) if share else None,
            outside_share_p95=_num(percentile(share, 95)) if share else None,
            **{f"{k}_mean": _num(statistics.fmean(v)) if (v := vals(k)) else None
               for k in ("outside_wait_s", "throttled_s", "run_delay_s", "cpu_s")},
        )
    masked = sum(r.cause == "host_contention" for r in finals)
    return Contention(**phases, host_contention=masked, host_contention_rate=masked / len(finals) if finals else None)


def run_provenance(run: Run) -> Any:
    """The ``provenance`` the run's ``run.json`` recorded (None without one)."""
    return _run_json(run, "provenance")


def raw_bwrap_true_ms(run: Run) -> float | None:
    """A bare ``bwrap true`` measured when the run started (run.json), the floor its
    sandbox_start is reported against; None when not recorded."""
    v = _run_json(run, "raw_bwrap_true_ms")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def build_report(
    runs: Sequence[Run],
    whatif_ks: Sequence[float] = DEFAULT_WHATIF,
    step_time_s: float | None = None,
    staleness_bound: float = 1.0,
) -> Report:
    """Every figure for one run, or for two runs A and B on the same tasks, as one typed
    :class:`~sandfleet.analysis.schema.Report`."""
    if not 1 <= len(runs) <= 2:
        raise ConfigError(f"analyze takes one or two runs, got {len(runs)}")
    for run in runs:
        if not run.completed:
            raise ConfigError(f"{run.path}: no completed rollouts to analyze")
    compare = _compare(runs[0], runs[1]) if len(runs) == 2 else None  # refuses different task sets first
    for k in whatif_ks:
        if not k > 0:
            raise ConfigError(f"what-if speed-up must be positive, got {k}")
    labels = LABELS[: len(runs)]
    pairs = list(zip(labels, runs, strict=True))
    options = {
        "runs": {lab: str(run.path) for lab, run in pairs},
        "whatif_ks": list(whatif_ks),
        "step_time_s": step_time_s,
        "staleness_bound": staleness_bound,
    }
    stats = {lab: bd.breakdown(run.completed) for lab, run in pairs}
    spans = {
        lab: {col: SpanStats(mean=_num(s.mean), median=_num(s.median), p90=_num(s.p90)) for col, s in st.items()}
        for lab, st in stats.items()
    }
    platform = {lab: fg.platform_overhead(run.rollouts) for lab, run in pairs}
    reason = bd.whatif_not_applicable(runs, labels)
    detail = None
    if reason is None:
        detail = {
            _k_key(w.k): WhatIfPoint(**{lab: _num(m) for lab, m in zip(labels, w.mean_s, strict=True)},
                                     gap=_num(w.gap))
            for w in bd.whatif(runs, whatif_ks)
        }
    kv = {lab: fg.kv_idle(run.rollouts) for lab, run in pairs}
    waits = {lab: fg.group_wait(run.rollouts) for lab, run in pairs}
    return Report(
        gap_definition=bd.GAP_DEFINITION,
        provenance=Provenance(analysis=provenance(options), runs={lab: run_provenance(run) for lab, run in pairs}),
        runs={lab: run_summary(run) for lab, run in pairs},
        spans=spans,
        spans_mean_s={lab: {col: s.mean for col, s in st.items()} for lab, st in spans.items()},
        platform_overhead_s={lab: _num(p.mean_s) for lab, p in platform.items()},
        platform_overhead_fraction={lab: _num(p.fraction) for lab, p in platform.items()},
        raw_bwrap_true_ms={lab: _num(raw_bwrap_true_ms(run)) for lab, run in pairs},
        compare=compare,
        whatif_not_applicable=reason,
        whatif=None if detail is None else {k: p.gap if len(runs) == 2 else p.A for k, p in detail.items()},
        whatif_detail=detail,
        kv_idle_fraction={lab: _num(k.fraction) for lab, k in kv.items()},
        kv_idle_fraction_through_reward={lab: _num(k.fraction_through_reward) for lab, k in kv.items()},
        kv_idle_per_rollout={lab: [_num(x) for x in k.per_rollout] for lab, k in kv.items()},
        group_wait_fraction={lab: _num(w.fraction) for lab, w in waits.items()},
        group_wait_per_rollout={lab: [_num(x) for x in w.per_rollout] for lab, w in waits.items()},
        staleness=_staleness(runs, labels, step_time_s, staleness_bound),
        trees={lab: tree_figures(final_attempts(run.rollouts)) for lab, run in pairs},  # --branch runs
    )


def analyze(
    runs: Sequence[Run],
    whatif_ks: Sequence[float] = DEFAULT_WHATIF,
    step_time_s: float | None = None,
    staleness_bound: float = 1.0,
) -> dict[str, Any]:
    """Every figure for one run, or for two runs A and B on the same tasks, as the JSON of
    :func:`build_report`'s report (what ``sandfleet analyze --json`` prints)."""
    return build_report(runs, whatif_ks, step_time_s, staleness_bound).to_json()


def run_summary(run: Run) -> RunSummary:
    """A run's name, path, rollouts per status (every attempt), and its verdict figures."""
    return RunSummary(
        name=run.name,
        path=str(run.path),
        rollouts=len(run.rollouts),
        **{st: sum(r.status == st for r in run.rollouts) for st in STATUSES},
        **verdict_figures(run),
        contention=contention_figures(run),
        model_time_known=run.model_time_known,
    )


def _compare(a: Run, b: Run) -> Compare:
    pairing, deltas = bd.compare(a, b)
    return Compare(
        tasks=len(pairing.tasks),
        tasks_left_out=list(pairing.left_out),
        ci_level=bd.CI_LEVEL,
        spans={
            col: SpanDelta(a=_num(d.a), b=_num(d.b), delta_s=_num(d.delta_s), delta_s_ci90=_ci(d.delta_s_ci),
                           delta_pct=_num(d.delta_pct), delta_pct_ci90=_ci(d.delta_pct_ci))
            for col, d in deltas.items()
        },
    )


def _staleness(runs: Sequence[Run], labels: Sequence[str], step_time_s: float | None, bound: float) -> Staleness:
    durations = {lab: [r.duration for r in run.completed] for lab, run in zip(labels, runs, strict=True)}
    allowed = {lab: fg.step_time_for_bound(d, bound) for lab, d in durations.items()}
    t = step_time_s if step_time_s is not None else allowed["A"]
    distribution = {}
    for lab, d in durations.items():
        s = fg.staleness(d, t)
        distribution[lab] = StalenessDistribution(p50=_num(s.p50), p90=_num(s.p90), max=_num(s.max),
                                                  histogram={str(k): v for k, v in s.histogram.items()})
    two = len(runs) == 2
    return Staleness(
        bound_versions=bound,
        quantile=fg.STALENESS_QUANTILE,
        step_time_s=_num(t),
        step_time_given=step_time_s is not None,
        allowed_step_time_s={lab: _num(v) for lab, v in allowed.items()},
        distribution=distribution,
        training_faster_pct=_num(100 * fg.training_speedup(allowed["A"], allowed["B"])) if two else None,
        faster_run=("A" if allowed["A"] <= allowed["B"] else "B") if two else None,
    )
