"""One analysis of one or two runs, as plain data (the ``--json`` output).

The dict :func:`analyze` returns (``schema: sandfleet.analysis/1``) has:

- ``runs``: label (``A``, ``B``) to name, path and rollout counts per status.
- ``spans``: label to span (and ``total``) to ``{mean, median, p90}`` seconds.
- ``spans_mean_s``: label to span (and ``total``) to mean seconds.
- ``compare`` (two runs): ``paired``, ``tasks``, and per span ``{a, b, delta_s, delta_pct}``.
- ``whatif``: k to the gap (two runs; a fraction, see ``gap_definition``) or to the mean
  rollout seconds (one run); ``whatif_detail`` gives every run's mean for each k.
- ``kv_idle_fraction`` and ``group_wait_fraction``: label to a fraction (or null).
- ``staleness``: the bound, the step time it allows per run, the distribution per run at
  ``step_time_s`` (given, or else the step time run A's bound allows), and with two runs
  ``training_faster_pct``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sandfleet.analysis import breakdown as bd
from sandfleet.analysis import figures as fg
from sandfleet.analysis.trace import STATUSES, Run
from sandfleet.errors import ConfigError

SCHEMA = "sandfleet.analysis/1"
DEFAULT_WHATIF = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
LABELS = ("A", "B")


def _num(x: float | None) -> float | None:
    """JSON-safe number: NaN and infinities become null."""
    if x is None or x != x or x in (float("inf"), float("-inf")):
        return None
    return round(x, 6)


def _k_key(k: float) -> str:
    return f"{k:g}"


def analyze(
    runs: Sequence[Run],
    whatif_ks: Sequence[float] = DEFAULT_WHATIF,
    step_time_s: float | None = None,
    staleness_bound: float = 1.0,
) -> dict[str, Any]:
    """Every figure for one run, or for two runs A and B on the same tasks."""
    if not 1 <= len(runs) <= 2:
        raise ConfigError(f"analyze takes one or two runs, got {len(runs)}")
    for run in runs:
        if not run.completed:
            raise ConfigError(f"{run.path}: no completed rollouts to analyze")
    labels = LABELS[: len(runs)]
    out: dict[str, Any] = {"schema": SCHEMA, "gap_definition": bd.GAP_DEFINITION}
    out["runs"] = {
        lab: {
            "name": run.name,
            "path": str(run.path),
            "rollouts": len(run.rollouts),
            **{st: sum(r.status == st for r in run.rollouts) for st in STATUSES},
            "model_time_known": run.model_time_known,
        }
        for lab, run in zip(labels, runs, strict=True)
    }
    stats = {lab: bd.breakdown(run.completed) for lab, run in zip(labels, runs, strict=True)}
    out["spans"] = {
        lab: {
            col: {"mean": _num(s.mean), "median": _num(s.median), "p90": _num(s.p90)}
            for col, s in st.items()
        }
        for lab, st in stats.items()
    }
    out["spans_mean_s"] = {
        lab: {col: _num(s.mean) for col, s in st.items()} for lab, st in stats.items()
    }
    if len(runs) == 2:
        pairing, deltas = bd.compare(runs[0], runs[1])
        out["compare"] = {
            "paired": pairing.paired,
            "tasks": len(pairing.tasks),
            "tasks_only_a": pairing.only_a,
            "tasks_only_b": pairing.only_b,
            "spans": {
                col: {
                    "a": _num(d.a),
                    "b": _num(d.b),
                    "delta_s": _num(d.delta_s),
                    "delta_pct": _num(d.delta_pct),
                }
                for col, d in deltas.items()
            },
        }
    wi = bd.whatif(runs, whatif_ks)
    out["whatif"] = {_k_key(w.k): _num(w.gap if len(runs) == 2 else w.mean_s[0]) for w in wi}
    out["whatif_detail"] = {
        _k_key(w.k): {
            **{lab: _num(m) for lab, m in zip(labels, w.mean_s, strict=True)},
            **({"gap": _num(w.gap)} if len(runs) == 2 else {}),
        }
        for w in wi
    }
    out["kv_idle_fraction"] = {
        lab: _num(fg.kv_idle_fraction(run.rollouts)) for lab, run in zip(labels, runs, strict=True)
    }
    waits = {lab: fg.group_wait(run.rollouts) for lab, run in zip(labels, runs, strict=True)}
    out["group_wait_fraction"] = {lab: _num(w.fraction) for lab, w in waits.items()}
    out["group_wait_per_rollout"] = {
        lab: [_num(x) for x in w.per_rollout] for lab, w in waits.items()
    }
    out["staleness"] = _staleness(runs, labels, step_time_s, staleness_bound)
    return out


def _staleness(
    runs: Sequence[Run], labels: Sequence[str], step_time_s: float | None, bound: float
) -> dict[str, Any]:
    durations = {
        lab: [r.duration for r in run.completed] for lab, run in zip(labels, runs, strict=True)
    }
    allowed = {lab: fg.step_time_for_bound(d, bound) for lab, d in durations.items()}
    t = step_time_s if step_time_s is not None else allowed["A"]
    out: dict[str, Any] = {
        "bound_versions": bound,
        "quantile": fg.STALENESS_QUANTILE,
        "step_time_s": _num(t),
        "step_time_given": step_time_s is not None,
        "allowed_step_time_s": {lab: _num(v) for lab, v in allowed.items()},
        "distribution": {},
    }
    for lab, d in durations.items():
        s = fg.staleness(d, t)
        out["distribution"][lab] = {
            "p50": _num(s.p50),
            "p90": _num(s.p90),
            "max": _num(s.max),
            "histogram": {str(k): v for k, v in s.histogram.items()},
        }
    if len(runs) == 2:
        out["training_faster_pct"] = _num(100 * fg.training_speedup(allowed["A"], allowed["B"]))
        out["faster_run"] = "A" if allowed["A"] <= allowed["B"] else "B"
    return out
