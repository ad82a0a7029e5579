"""The HTML report: one self-contained file, tables and four inline SVG plots.

Plots: stacked span bars per run (``plot-spans``), gap (or mean time) against the inference
speed-up k (``plot-whatif``), a CDF of group wait (``plot-group-wait``) and a timeline of
rollouts per sandbox for each run (``plot-timeline-A``, ``plot-timeline-B``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from sandfleet.analysis import svg
from sandfleet.analysis.breakdown import COLUMNS
from sandfleet.analysis.report import LABELS
from sandfleet.analysis.trace import Run
from sandfleet.traceschema import SPAN_NAMES

SPAN_COLORS = {
    "sandbox_start": "#8c6d31",
    "model": "#4e79a7",
    "agent_command": "#f28e2b",
    "verifier": "#e15759",
    "other_sandbox": "#76b7b2",
    "overhead": "#bab0ac",
}
RUN_COLORS = {"A": "#4e79a7", "B": "#e15759"}
MAX_TIMELINE_ROWS = 60

CSS = """body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd}
td{text-align:right}td:first-child,th:first-child{text-align:left}.note{color:#666}
svg{display:block;margin:1em 0}"""


def _f(v: Any, suffix: str = "", digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}{suffix}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _run_name(a: dict[str, Any], lab: str) -> str:
    return f"{lab}: {a['runs'][lab]['name']}"


def _timeline(run: Run, lab: str) -> str:
    t0 = min(r.start for r in run.rollouts)
    by_box: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    first: dict[str, float] = {}
    for r in run.rollouts:
        first[r.sandbox_id] = min(first.get(r.sandbox_id, r.start), r.start)
        for s in r.spans:
            by_box[r.sandbox_id].append((s.start - t0, s.end - t0, SPAN_COLORS[s.name]))
    boxes = sorted(by_box, key=lambda b: first[b])
    shown = boxes[:MAX_TIMELINE_ROWS]
    more = f" (first {len(shown)} of {len(boxes)} sandboxes)" if len(boxes) > len(shown) else ""
    return svg.timeline(
        f"plot-timeline-{lab}",
        f"Rollouts per sandbox, run {lab}{more}",
        [(b, by_box[b]) for b in shown],
        "seconds since the run's first rollout",
        SPAN_COLORS,
    )


def render(analysis: dict[str, Any], runs: Sequence[Run]) -> str:
    """The report as one HTML string."""
    labs = LABELS[: len(runs)]
    a = analysis
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>sandfleet analysis"
        f"</title><style>{CSS}</style></head><body><h1>Where rollout time goes</h1>"
    ]
    parts.append(
        _table(
            ["run", "name", "rollouts", "completed", "failed", "cancelled"],
            [
                [
                    lab,
                    a["runs"][lab]["name"],
                    *(
                        str(a["runs"][lab][k])
                        for k in ("rollouts", "completed", "failed", "cancelled")
                    ),
                ]
                for lab in labs
            ],
        )
    )
    if not all(a["runs"][lab]["model_time_known"] for lab in labs):
        parts.append(
            "<p class='note'>Some traces do not know the model's time (converted "
            "from another system): it is counted inside agent_command.</p>"
        )
    parts.append("<h2>Breakdown per span (seconds per rollout)</h2>")
    rows = [
        [col, *(_f(a["spans"][lab][col][m]) for lab in labs for m in ("mean", "median", "p90"))]
        for col in COLUMNS
    ]
    heads = [f"{lab} {m}" for lab in labs for m in ("mean", "median", "p90")]
    parts.append(_table(["span", *heads], rows))
    if "compare" in a:
        c = a["compare"]
        how = f"paired by task ({c['tasks']} tasks)" if c["paired"] else "means over all rollouts"
        parts.append(f"<h2>B - A</h2><p class='note'>{escape(how)}</p>")
        parts.append(
            _table(
                ["span", "A mean s", "B mean s", "B - A s", "B - A %"],
                [
                    [col, _f(d["a"]), _f(d["b"]), _f(d["delta_s"]), _f(d["delta_pct"], " %")]
                    for col, d in c["spans"].items()
                ],
            )
        )
    bars = [
        (_run_name(a, lab), [(n, a["spans_mean_s"][lab][n] or 0.0) for n in SPAN_NAMES])
        for lab in labs
    ]
    parts.append(
        svg.stacked_bars(
            "plot-spans", "Mean rollout time per span", bars, "seconds per rollout", SPAN_COLORS
        )
    )
    parts.append("<h2>What if inference were k times faster</h2>")
    two = len(labs) == 2
    detail = a["whatif_detail"]
    parts.append(
        _table(
            ["k", *(f"{lab} mean s" for lab in labs), *(["gap"] if two else [])],
            [
                [k, *(_f(d[lab]) for lab in labs), *([_f(100 * d["gap"], " %")] if two else [])]
                for k, d in detail.items()
            ],
        )
    )
    if two:
        series = {"gap B vs A": [(float(k), 100 * (d["gap"] or 0.0)) for k, d in detail.items()]}
        parts.append(f"<p class='note'>gap = {escape(a['gap_definition'])}</p>")
        parts.append(
            svg.line_chart(
                "plot-whatif",
                "Gap between the runs against inference speed-up",
                series,
                "inference speed-up k (log scale)",
                "gap (%)",
                {"gap B vs A": "#59a14f"},
                logx=True,
            )
        )
    else:
        name = _run_name(a, "A")
        series = {name: [(float(k), d["A"] or 0.0) for k, d in detail.items()]}
        parts.append(
            svg.line_chart(
                "plot-whatif",
                "Mean rollout time against inference speed-up",
                series,
                "inference speed-up k (log scale)",
                "mean rollout time (s)",
                {name: RUN_COLORS["A"]},
                logx=True,
            )
        )
    parts.append("<h2>KV-cache idle and group wait</h2>")
    parts.append(
        _table(
            ["run", "KV-cache idle", "group wait"],
            [
                [
                    lab,
                    _f(_pct(a["kv_idle_fraction"][lab]), " %"),
                    _f(_pct(a["group_wait_fraction"][lab]), " %"),
                ]
                for lab in labs
            ],
        )
    )
    waits = {
        _run_name(a, lab): [x for x in a["group_wait_per_rollout"][lab] if x is not None]
        for lab in labs
    }
    parts.append(
        svg.cdf(
            "plot-group-wait",
            "Group wait per completed rollout (CDF)",
            waits,
            "time waiting for the group / rollout time",
            {_run_name(a, lab): RUN_COLORS[lab] for lab in labs},
        )
    )
    parts.append(_staleness_html(a, labs))
    parts.append("<h2>Timeline</h2>")
    parts.extend(_timeline(run, lab) for lab, run in zip(labs, runs, strict=True))
    parts.append("</body></html>")
    return "\n".join(parts)


def _pct(v: float | None) -> float | None:
    return None if v is None else 100 * v


def _staleness_html(a: dict[str, Any], labs: Sequence[str]) -> str:
    st = a["staleness"]
    out = [
        f"<h2>Staleness</h2><p class='note'>Trainer step {_f(st['step_time_s'])} s; bound "
        f"{st['bound_versions']:g} versions at p{st['quantile']:g}.</p>"
    ]
    out.append(
        _table(
            ["run", "p50 versions", "p90", "max", "step time the bound allows (s)"],
            [
                [
                    lab,
                    _f(d["p50"], digits=2),
                    _f(d["p90"], digits=2),
                    _f(d["max"], digits=2),
                    _f(st["allowed_step_time_s"][lab]),
                ]
                for lab, d in st["distribution"].items()
            ],
        )
    )
    if "training_faster_pct" in st:
        out.append(
            f"<p>At the same staleness, training can step "
            f"{_f(st['training_faster_pct'])} % faster with run {st['faster_run']}.</p>"
        )
    return "\n".join(out)


def write_report(path: str | Path, analysis: dict[str, Any], runs: Sequence[Run]) -> Path:
    """Render and write the report; returns its path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render(analysis, runs), encoding="utf-8")
    return p
