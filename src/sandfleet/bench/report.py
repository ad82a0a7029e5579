"""Text summary of one run, and the self-contained HTML report of one run or of two.

The HTML report is one file: the summary (or comparison) table, each run's provenance, and
matplotlib charts inlined as SVG (:mod:`sandfleet.plotting`, imported only when a report is
built), each in ``<figure class="chart" data-chart="NAME">``:

- ``latency-<command>``, for each command with a slowdown: the p95 slowdown against busy
  sandboxes N, one line per run (with its bootstrap interval), the target as a dashed line
  and each run's capacity as a dotted vertical line;
- ``capacity``: each run's capacity at the target, bars.

:func:`expected_charts` names the charts a report of given results holds (the report draws
exactly those).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from sandfleet.bench.compare import compare, config_of, host_of, table_lines

COLORS = ("#1f77b4", "#d62728")


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary_lines(r: dict[str, Any]) -> list[str]:
    """A few lines per mode that ran (what ``bench run`` prints at the end)."""
    host = host_of(r)
    prov = r.get("provenance") or {}
    out = [f"host: {host.get('cpu_model')} x{host.get('threads')} threads, kernel {host.get('kernel')}, "
           f"page {host.get('page_size')}, backend {host.get('backend')}, throttle {host.get('throttle')}, "
           f"load {host.get('loadavg_start')} -> {host.get('loadavg_end')}",
           f"sandfleet {prov.get('sandfleet')}, commit {prov.get('commit')}, at {prov.get('at')}"]
    if r.get("interrupted"):
        out.append("INTERRUPTED: partial results")
    if r.get("single"):
        out.append(f"{'single':16} {'median s':>9} {'p95 s':>9} {'n':>4}")
        out += [f"  {c:14} {_fmt(v['median_s'], '9.3f')} {_fmt(v['p95_s'], '9.3f')} {v['n']:>4}"
                for c, v in r["single"].items()]
    if ref := (r.get("interleaved_single") or {}).get("commands"):
        out.append("interleaved single (the slowdowns' reference): " + ", ".join(
            f"{c} {_fmt(v['median_s'], '.3f')}/{_fmt(v['p95_s'], '.3f')}s n={v['n']}" for c, v in ref.items()))
    for n, row in (r.get("sweep") or {}).items():
        sd = row.get("slowdown") or {}
        worst = max(sd.items(), key=lambda kv: kv[1]["slowdown_p95"], default=None)
        ns = [v["n"] for v in row["commands"].values()]
        med = ", ".join(f"{c} {v['slowdown_median']:.2f}" for c, v in sd.items())
        w = "-"
        if worst is not None:
            ci = worst[1].get("slowdown_p95_ci")
            w = f"{worst[1]['slowdown_p95']:.2f} ({worst[0]}" + (f", 90% CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else ")")
        out.append(f"sweep N={n} ({row.get('grid', 'coarse')}): median slowdown {med}; worst p95 slowdown {w}; "
                   f"samples {min(ns, default=0)}-{max(ns, default=0)} per command; "
                   f"failures {row['failures']['count']}")
        if row.get("short_of_min_samples"):
            out.append(f"  below min samples at the time cap: {', '.join(row['short_of_min_samples'])}")
    if cap := r.get("capacity"):
        out.append(f"capacity at {cap['target']}x p95: {cap['sandboxes']} sandboxes "
                   f"({cap['per_thread']} per thread; {cap.get('method')})")
    if ov := r.get("baseline_overhead"):
        def ci(key: str) -> str:
            lo_hi = ov.get(key)
            return f" ({ov.get('level', 0.9):.0%} CI {lo_hi[0]:+.1%} to {lo_hi[1]:+.1%})" if lo_hi else ""

        out.append(f"overhead vs bare processes: full load (N={ov['n']}) {_fmt(ov['full_load'], '+.1%')}"
                   f"{ci('full_load_ci')}, single {_fmt(ov['single'], '+.1%')}{ci('single_ci')}")
        bl = r.get("baseline") or {}
        if q := bl.get("quota"):
            out.append(f"  bare baseline: cpu quota {q['bare'].get('cpus')} (sandbox {q['sandbox'].get('cpus')}), "
                       f"working copy {bl['working_copy']['bare']}, output captured up to "
                       f"{bl['output']['cap_bytes_each']} bytes each")
    if ev := r.get("evals"):
        out.append(f"evals/min: {ev['evals_per_min']} ({ev['completed']} x {ev['task']} in {ev['wall_s']}s, "
                   f"{ev['workers']} workers, {ev['failures']} failures)")
    if s := r.get("soak"):
        out.append(f"soak {s['duration_s']:.0f}s x {s['sandboxes']}: {s['commands_run']} commands, "
                   f"{s['failures']['count']} failures, drift {_fmt(s['drift'], '+.1%')}")
    if d := r.get("density"):
        out.append(f"density: {d['created']} idle sandboxes ({d['stopped_by']}), PSS {d['pss_mib']} MiB each, "
                   f"projected {d['projected']} in {d['mem_available_mib']:.0f} MiB")
    return out


def _commands(runs: list[dict[str, Any]]) -> list[str]:
    return sorted({c for r in runs for row in (r.get("sweep") or {}).values() for c in (row.get("slowdown") or {})})


def expected_charts(results: dict[str, Any], other: dict[str, Any] | None = None) -> list[str]:
    """The ``data-chart`` names of the report of ``results`` (and ``other``, for a comparison),
    in the order the report draws them: ``latency-<command>`` for every command with a
    slowdown in either run, then ``capacity`` when either run has one."""
    runs = [r for r in (results, other) if r is not None]
    names = [f"latency-{c}" for c in _commands(runs)]
    if any(r.get("capacity") for r in runs):
        names.append("capacity")
    return names


def _points(r: dict[str, Any], command: str) -> list[tuple[int, float, list[float] | None]]:
    pts = []
    for n, row in (r.get("sweep") or {}).items():
        v = (row.get("slowdown") or {}).get(command)
        if v is not None:
            pts.append((int(n), float(v["slowdown_p95"]), v.get("slowdown_p95_ci")))
    return sorted(pts)


def _cap_text(cap: dict[str, Any]) -> str:
    """A capacity's value; ">=" when the target was never reached (a lower bound)."""
    bound = ">=" if cap.get("first_over") is None and cap.get("last_within") is not None else ""
    return f"{bound}{cap['sandboxes']:.2f}"


def _latency_chart(command: str, runs: list[tuple[str, dict[str, Any]]]) -> str:
    from sandfleet.plotting import new_figure, svg

    fig, ax_ = new_figure(6.0, 3.4)
    ax: Any = ax_
    target = None
    for i, (label, r) in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        pts = _points(r, command)
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        lo = [y - (p[2][0] if p[2] else y) for y, p in zip(ys, pts, strict=True)]
        hi = [(p[2][1] if p[2] else y) - y for y, p in zip(ys, pts, strict=True)]
        ax.errorbar(xs, ys, yerr=[[max(0.0, v) for v in lo], [max(0.0, v) for v in hi]], color=color,
                    marker="o", ms=4, capsize=3, label=f"{label} p95 slowdown")
        cap = r.get("capacity") or {}
        target = target or cap.get("target") or config_of(r).get("target")
        if cap.get("sandboxes") is not None:
            ax.axvline(cap["sandboxes"], color=color, ls=":", lw=1.2,
                       label=f"{label} capacity {_cap_text(cap)}")
    if target:
        ax.axhline(target, color="#555555", ls="--", lw=1, label=f"target {target}x")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("busy sandboxes N")
    ax.set_ylabel("p95(N) / p95(single)")
    ax.set_title(command)
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.legend(fontsize=7, loc="upper left")
    caption = (f"{command}: p95 latency with N busy sandboxes / p95 with one sandbox alone (the interleaved "
               "single baseline); bars: 90% bootstrap interval. Dashed: the target; dotted: each run's capacity.")
    return svg(fig, f"latency-{command}", caption)  # ids scoped by the chart's name


def _capacity_chart(runs: list[tuple[str, dict[str, Any]]]) -> str:
    from sandfleet.plotting import new_figure, svg

    fig, ax_ = new_figure(4.0, 3.0)
    ax: Any = ax_
    labels, values, colors, target = [], [], [], None
    for i, (label, r) in enumerate(runs):
        cap = r.get("capacity") or {}
        target = target or cap.get("target")
        labels.append(label)
        values.append(cap.get("sandboxes") or 0.0)
        colors.append(COLORS[i % len(COLORS)])
    bars = ax.bar(labels, values, color=colors, width=0.6)
    for bar, (_, r) in zip(bars, runs, strict=True):
        cap = r.get("capacity") or {}
        if cap.get("sandboxes") is not None:
            ax.annotate(f"{_cap_text(cap)} ({cap.get('per_thread')}/thread)",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("busy sandboxes")
    ax.set_title(f"capacity at {target}x p95 slowdown")
    ax.set_ylim(0, max([*values, 1.0]) * 1.2)
    caption = (f"Busy sandboxes at which the worst command's p95 slowdown reaches {target}x, interpolated "
               "linearly between the last level within it and the first past it.")
    return svg(fig, "capacity", caption)


def _provenance_html(label: str, r: dict[str, Any]) -> str:
    prov = r.get("provenance") or {}
    host = prov.get("host") or {}
    rows = [("sandfleet", prov.get("sandfleet")), ("commit", prov.get("commit")), ("at", prov.get("at")),
            *((k, host.get(k)) for k in ("hostname", "cpu_model", "arch", "threads", "kernel", "page_size",
                                         "mem_total_mib", "backend", "cgroup", "throttle", "loadavg_start",
                                         "loadavg_end"))]
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    config = escape(json.dumps(prov.get("config") or {}, indent=1, default=str))
    return (f"<h3>{escape(label)}</h3><table>{cells}</table>"
            f"<details><summary>configuration</summary><pre>{config}</pre></details>")


def html_report(a: dict[str, Any], b: dict[str, Any] | None = None, cmp: dict[str, Any] | None = None,
                names: tuple[str, str] = ("A", "B")) -> str:
    """One self-contained HTML page: the summary of ``a`` (or the comparison of ``a`` and
    ``b``), their provenance, and the charts :func:`expected_charts` names."""
    la, lb = names
    runs = [(la, a)] + ([(lb, b)] if b is not None else [])
    if b is not None:
        cmp = cmp or compare(a, b, names)
        title = f"sandfleet bench: {la} (A) vs {lb} (B)"
        table = table_lines(cmp)
    else:
        title = f"sandfleet bench: {la}"
        table = summary_lines(a)
    charts = []
    for name in expected_charts(a, b):
        if name == "capacity":
            charts.append(_capacity_chart(runs))
        else:
            charts.append(_latency_chart(name.removeprefix("latency-"), runs))
    prov = "\n".join(_provenance_html(label, r) for label, r in runs)
    body = "\n".join(charts)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<link rel="icon" href="data:,">
<style>body{{font-family:sans-serif;margin:2em;max-width:80em}}pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}
figure.chart{{display:inline-block;margin:6px;border:1px solid #ddd;vertical-align:top;max-width:40em}}
figure.chart svg{{max-width:100%;height:auto}}figcaption{{font-size:0.8em;padding:0 6px 6px}}
table{{border-collapse:collapse}}th,td{{text-align:left;padding:1px 8px;font-size:0.9em}}</style></head><body>
<h1>{escape(title)}</h1>
<pre>{escape(chr(10).join(table))}</pre>
<h2>Charts</h2>
{body}
<h2>Definitions</h2>
<p>Slowdown at N = p95 (or median) latency with N busy sandboxes / the p95 (or median) of the interleaved single
baseline: one sandbox alone, run between the load levels so that drift affects both. Every p95 is taken from at least
the configured minimum of samples per command and level (see the sample counts above) and comes with a 90%
bootstrap interval. Capacity = busy sandboxes at which the worst command's p95 slowdown reaches the target, linearly
interpolated between the last level within it and the first past it. See docs/bench.md.</p>
<h2>Provenance</h2>
{prov}
</body></html>
"""
