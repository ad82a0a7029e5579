"""The HTML report: one self-contained file (no scripts, fonts or links), tables and
matplotlib charts inlined as SVG.

Charts, each a ``<figure class="chart" data-chart="NAME">``: ``breakdown`` (mean seconds per
span, stacked, one bar per run), ``whatif`` (mean rollout time of each run, and the gap,
against the inference speed-up k; a paragraph says why instead when it does not apply),
``kv-idle`` (histogram of each rollout's KV-cache idle fraction) and ``group-wait``
(histogram of each completed rollout's group wait fraction). matplotlib is imported only
when a report is rendered, never by ``sandfleet analyze`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from sandfleet.analysis.breakdown import COLUMNS
from sandfleet.analysis.fmt import interval as _interval
from sandfleet.analysis.fmt import num as _f
from sandfleet.analysis.fmt import pct as _pct
from sandfleet.analysis.schema import Report
from sandfleet.analysis.trees import trees_html
from sandfleet.traceschema import SPAN_NAMES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SPAN_COLORS = {
    "sandbox_start": "#8c6d31",
    "model": "#4e79a7",
    "agent_command": "#f28e2b",
    "verifier": "#e15759",
    "other_sandbox": "#76b7b2",
    "overhead": "#bab0ac",
}
RUN_COLORS = {"A": "#4e79a7", "B": "#e15759"}
GAP_COLOR = "#59a14f"
FRACTION_BINS = 20

CSS = """body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd}
td{text-align:right}td:first-child,th:first-child{text-align:left}.note{color:#666}
figure.chart{margin:1em 0}figure.chart svg{display:block;max-width:100%;height:auto}
figcaption{color:#444;font-size:90%}pre{background:#f6f6f6;padding:.5em;overflow:auto}"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _run_name(a: Report, lab: str) -> str:
    return f"{lab}: {a.runs[lab].name}"


def _figure(width: float = 6.4, height: float = 3.6) -> tuple[Figure, Axes]:
    from sandfleet import plotting  # matplotlib: only when a report is rendered

    return plotting.new_figure(width, height)


def _chart(fig: Figure, name: str, caption: str) -> str:
    """A matplotlib figure as a named inline chart (:func:`sandfleet.plotting.svg`)."""
    from sandfleet import plotting

    return plotting.svg(fig, name, caption)


def breakdown_chart(a: Report, labs: Sequence[str]) -> str:
    """Mean seconds per span, stacked, one horizontal bar per run."""
    fig, ax = _figure(6.4, 1.8 + 0.5 * len(labs))
    names = [_run_name(a, lab) for lab in labs]
    left = [0.0] * len(labs)
    for span in SPAN_NAMES:
        widths = [a.spans[lab][span].mean or 0.0 for lab in labs]
        ax.barh(names, widths, left=left, color=SPAN_COLORS[span], label=span, height=0.5)
        left = [x + w for x, w in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("mean seconds per completed rollout")
    fig.legend(loc="outside lower center", ncols=3, frameon=False)
    return _chart(fig, "breakdown", "Mean rollout time per span (the spans add up to the wall time).")


def whatif_chart(a: Report, labs: Sequence[str]) -> str:
    """Mean rollout time of each run against k (log scale), and with two runs the gap."""
    detail = a.whatif_detail or {}
    ks = [float(k) for k in detail]
    fig, ax = _figure()
    for lab in labs:
        ax.plot(ks, [getattr(d, lab) for d in detail.values()], marker="o", color=RUN_COLORS[lab],
                label=f"{_run_name(a, lab)}, mean rollout time")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [f"{k:g}" for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("inference speed-up k (model seconds divided by k)")
    ax.set_ylabel("mean rollout time (s)")
    ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    caption = "Mean rollout time against the inference speed-up k."
    if len(labs) == 2:
        gap_ax = ax.twinx()
        gap_ax.plot(ks, [100 * (d.gap or 0.0) for d in detail.values()], marker="s",
                    linestyle="--", color=GAP_COLOR, label="gap (B - A) / A")
        gap_ax.set_ylabel("gap (%)")
        gap_ax.set_ylim(bottom=0)
        gap_ax.grid(False)
        h2, l2 = gap_ax.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
        caption = "Mean rollout time of each run and the gap (B - A) / A against the inference speed-up k."
    ax.legend(handles, labels, loc="lower left", fontsize=8)
    return _chart(fig, "whatif", caption)


def fraction_histogram(
    name: str, per_rollout: Mapping[str, Sequence[float | None]], labs: Sequence[str],
    a: Report, xlabel: str, caption: str,
) -> str:
    """A histogram of per-rollout fractions (0 to 1) of each run, side by side."""
    fig, ax = _figure()
    bins = [i / FRACTION_BINS for i in range(FRACTION_BINS + 1)]
    data = [[x for x in per_rollout[lab] if x is not None] for lab in labs]
    ax.hist(data, bins=bins, color=[RUN_COLORS[lab] for lab in labs],
            label=[f"{_run_name(a, lab)} ({len(d)} rollouts)" for lab, d in zip(labs, data, strict=True)])
    ax.set_xlim(0, 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rollouts")
    ax.legend(fontsize=8)
    return _chart(fig, name, caption)


def _omitted(name: str, why: str) -> str:
    return f"<p class='note' data-chart-omitted='{escape(name)}'>No {escape(name)} chart: {escape(why)}.</p>"


def render(a: Report) -> str:
    """The report as one HTML string."""
    labs = a.labels
    runs = a.runs
    two = len(labs) == 2
    parts = [
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<link rel='icon' href='data:,'>"
        f"<title>sandfleet analysis</title><style>{CSS}</style></head><body>"
        "<h1>Where rollout time goes</h1>"
        "<p class='note'>Every figure is defined in sandfleet's docs/figures.md.</p>"
    ]
    parts.append(
        _table(
            ["run", "name", "rollouts", "completed", "failed", "cancelled"],
            [
                [lab, r.name, str(r.rollouts), str(r.completed), str(r.failed), str(r.cancelled)]
                for lab, r in runs.items()
            ],
        )
    )
    parts.append("<h2>Verdicts</h2><p class='note'>Final attempts. The pass rate is over scored and "
                 "policy_fault rollouts; infra_fault ones are masked (reward null) and counted apart.</p>")
    parts.append(
        _table(
            ["run", "scored", "policy_fault", "infra_fault", "mask rate", "pass rate", "refilled"],
            [
                [lab, str(r.verdicts.scored), str(r.verdicts.policy_fault), str(r.verdicts.infra_fault),
                 _pct(r.mask_rate), _pct(r.pass_rate), str(r.refilled)]
                for lab, r in runs.items()
            ],
        )
    )
    if not all(r.model_time_known for r in runs.values()):
        parts.append(
            "<p class='note'>Some traces do not know the model's time (converted "
            "from another system): it is counted inside agent_command.</p>"
        )
    parts.append("<h2>Breakdown per span (seconds per completed rollout)</h2>")
    rows = [
        [col, *(_f(getattr(a.spans[lab][col], m)) for lab in labs for m in ("mean", "median", "p90"))]
        for col in COLUMNS
    ]
    heads = [f"{lab} {m}" for lab in labs for m in ("mean", "median", "p90")]
    parts.append(_table(["span", *heads], rows))
    parts.append(breakdown_chart(a, labs))
    parts.append(
        "<h2>Platform overhead</h2><p class='note'>sandbox_start + other_sandbox + overhead "
        "(our own bookkeeping) per completed rollout; the share is the sum over rollouts / "
        "the sum of their wall time.</p>"
    )
    parts.append(
        _table(
            ["run", "mean s per rollout", "share of wall time", "sandbox_start s",
             "raw bwrap true ms (same run)"],
            [[lab, _f(a.platform_overhead_s[lab]), _pct(a.platform_overhead_fraction[lab]),
              _f(a.spans[lab]["sandbox_start"].mean, digits=3), _f(a.raw_bwrap_true_ms.get(lab))]
             for lab in labs],
        )
    )
    if a.compare is not None:
        c = a.compare
        note = (f"Over the same {c.tasks} tasks: mean of per-task means; "
                f"{100 * c.ci_level:g} % bootstrap intervals.")
        if c.tasks_left_out:
            note += " Left out (no completed rollout in one run): " + ", ".join(c.tasks_left_out) + "."
        parts.append(f"<h2>B - A</h2><p class='note'>{escape(note)}</p>")
        parts.append(
            _table(
                ["span", "A mean s", "B mean s", "B - A s", "interval s", "B - A %", "interval %"],
                [
                    [col, _f(d.a), _f(d.b), _f(d.delta_s), _interval(d.delta_s_ci90),
                     _f(d.delta_pct, suffix=" %"), _interval(d.delta_pct_ci90)]
                    for col, d in c.spans.items()
                ],
            )
        )
    parts.append("<h2>What if inference were k times faster</h2>")
    if a.whatif_not_applicable or a.whatif_detail is None:
        parts.append(f"<p>Not applicable: {escape(str(a.whatif_not_applicable))}.</p>")
        parts.append(_omitted("whatif", "the what-if does not apply to these runs"))
    else:
        detail = a.whatif_detail
        if two:
            parts.append(f"<p class='note'>gap = {escape(a.gap_definition)}</p>")
        parts.append(
            _table(
                ["k", *(f"{lab} mean s" for lab in labs), *(["gap"] if two else [])],
                [[k, *(_f(getattr(d, lab)) for lab in labs), *([_pct(d.gap)] if two else [])]
                 for k, d in detail.items()],
            )
        )
        parts.append(whatif_chart(a, labs))
    parts.append("<h2>KV-cache idle and group wait</h2>")
    parts.append(
        _table(
            ["run", "KV-cache idle", "KV idle through reward", "group wait"],
            [
                [lab, _pct(a.kv_idle_fraction[lab]), _pct(a.kv_idle_fraction_through_reward[lab]),
                 _pct(a.group_wait_fraction[lab])]
                for lab in labs
            ],
        )
    )
    if any(a.kv_idle_per_rollout[lab] for lab in labs):
        parts.append(
            fraction_histogram(
                "kv-idle", a.kv_idle_per_rollout, labs, a,
                "KV-cache idle fraction of the rollout (first request to last response)",
                "Each rollout's KV-cache idle fraction: token-seconds between a response and the "
                "next request / token-seconds from the first request to the last response.",
            )
        )
    else:
        parts.append(_omitted("kv-idle", "no rollout has model spans with token counts"))
    if any(a.group_wait_per_rollout[lab] for lab in labs):
        parts.append(
            fraction_histogram(
                "group-wait", a.group_wait_per_rollout, labs, a,
                "group wait fraction of the rollout",
                "Each completed rollout's group wait: (group end - rollout end) / "
                "(group end - group start).",
            )
        )
    else:
        parts.append(_omitted("group-wait", "no group has a completed rollout that took time"))
    parts.append(_staleness_html(a, labs))
    for lab in labs:  # the trees of a --branch run, drawn, and the work they saved
        parts.append(trees_html(a.trees.get(lab)))
    parts.append(
        "<h2>Provenance</h2><details><summary>Where and from what this report was made</summary>"
        f"<pre>{escape(json.dumps(a.provenance.model_dump(mode='json'), indent=2))}</pre></details>"
    )
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _staleness_html(a: Report, labs: Sequence[str]) -> str:
    st = a.staleness
    out = [
        f"<h2>Staleness</h2><p class='note'>Trainer step {_f(st.step_time_s)} s; bound "
        f"{st.bound_versions:g} versions at p{st.quantile:g}.</p>"
    ]
    out.append(
        _table(
            ["run", "p50 versions", "p90", "max", "step time the bound allows (s)"],
            [
                [lab, _f(d.p50, digits=2), _f(d.p90, digits=2), _f(d.max, digits=2),
                 _f(st.allowed_step_time_s[lab])]
                for lab, d in st.distribution.items()
            ],
        )
    )
    if st.faster_run is not None:  # two runs
        out.append(
            f"<p>At the same staleness, training can step "
            f"{_f(st.training_faster_pct)} % faster with run {st.faster_run}.</p>"
        )
    return "\n".join(out)


def write_report(path: str | Path, report: Report) -> Path:
    """Render and write the report; returns its path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render(report), encoding="utf-8")
    return p
