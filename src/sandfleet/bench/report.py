"""Text summary of one run, and the self-contained HTML report comparing two runs."""

from __future__ import annotations

from html import escape
from typing import Any

from sandfleet.bench.compare import table_lines
from sandfleet.bench.svg import bar_chart, line_chart


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def summary_lines(r: dict[str, Any]) -> list[str]:
    """A few lines per mode that ran (what ``bench run`` prints at the end)."""
    host = r.get("host") or {}
    out = [f"host: {host.get('cpu_model')} x{host.get('threads')} threads, kernel {host.get('kernel')}, "
           f"page {host.get('page_size')}, backend {host.get('backend')}, throttle {host.get('throttle')}, "
           f"load {host.get('loadavg_start')} -> {host.get('loadavg_end')}"]
    if r.get("interrupted"):
        out.append("INTERRUPTED: partial results")
    if r.get("single"):
        out.append(f"{'single':16} {'median s':>9} {'p95 s':>9}")
        out += [f"  {c:14} {_fmt(v['median_s'], '9.3f')} {_fmt(v['p95_s'], '9.3f')}" for c, v in r["single"].items()]
    for n, row in (r.get("sweep") or {}).items():
        sd = row.get("slowdown") or {}
        worst = max((v["slowdown_p95"] for v in sd.values()), default=None)
        med = ", ".join(f"{c} {v['slowdown_median']:.2f}" for c, v in sd.items())
        out.append(f"sweep N={n}: median slowdown {med}; worst p95 slowdown {_fmt(worst, '.2f')}; "
                   f"failures {row['failures']['count']}")
    if cap := r.get("capacity"):
        out.append(f"capacity at {cap['target']}x p95: {cap['sandboxes']} sandboxes "
                   f"({cap['per_thread']} per thread; measured up to N={cap['measured_up_to']})")
    if ov := r.get("baseline_overhead"):
        out.append(f"overhead vs bare processes: full load (N={ov['n']}) {_fmt(ov['full_load'], '+.1%')}, "
                   f"single {_fmt(ov['single'], '+.1%')}")
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


def _latency(r: dict[str, Any], command: str, key: str = "median_s") -> list[tuple[float, float]]:
    pts = []
    for n, row in (r.get("sweep") or {}).items():
        v = row["commands"].get(command) or {}
        if v.get(key) is not None:
            pts.append((float(n), float(v[key])))
    return pts


def html_report(a: dict[str, Any], b: dict[str, Any], cmp: dict[str, Any],
                names: tuple[str, str] = ("A", "B")) -> str:
    """One HTML file: the comparison table, and SVG plots of both runs."""
    la, lb = names
    commands = sorted({c for r in (a, b) for row in (r.get("sweep") or {}).values() for c in row["commands"]})
    latency = [line_chart(f"{c}: latency vs busy sandboxes",
                          {f"{la} median": _latency(a, c), f"{la} p95": _latency(a, c, "p95_s"),
                           f"{lb} median": _latency(b, c), f"{lb} p95": _latency(b, c, "p95_s")},
                          xlabel="busy sandboxes N", ylabel="seconds", small=True) for c in commands]
    charts = []
    for label, r in ((la, a), (lb, b)):
        sd: dict[str, list[tuple[float, float]]] = {}
        for n, row in (r.get("sweep") or {}).items():
            for c, v in (row.get("slowdown") or {}).items():
                sd.setdefault(c, []).append((int(n), v["slowdown_p95"]))
        target = (r.get("capacity") or {}).get("target")
        charts.append(line_chart(f"{label}: p95 slowdown vs busy sandboxes", sd, xlabel="busy sandboxes N",
                                 ylabel="p95 / single p95", hline=target))
    rows = cmp["commands"]
    charts.append(bar_chart("slowdown at full load (median)",
                            {c: {la: v["slowdown_a"], lb: v["slowdown_b"]} for c, v in rows.items()},
                            ylabel="x single"))
    charts.append(bar_chart("single-sandbox latency", {c: {la: v["single_a_s"], lb: v["single_b_s"]}
                                                      for c, v in rows.items()}, ylabel="seconds"))
    cap, ev = cmp["capacity"], cmp["evals_per_min"]
    charts.append(bar_chart(f"capacity at {cap['target']}x p95 slowdown",
                            {"sandboxes": {la: cap["a"], lb: cap["b"]},
                             "per thread": {la: cap["per_thread_a"], lb: cap["per_thread_b"]}}))
    charts.append(bar_chart("evaluations per minute", {"evals/min": {la: ev["a"], lb: ev["b"]}}))
    table = escape("\n".join(table_lines(cmp)))
    body = "\n".join(f'<div class="c">{c}</div>' for c in charts if c)
    lat = "\n".join(f'<div class="c">{c}</div>' for c in latency if c)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>sandfleet bench: {escape(la)} vs {escape(lb)}</title>
<style>body{{font-family:sans-serif;margin:2em}}pre{{background:#f6f6f6;padding:1em}}
.c{{display:inline-block;margin:6px;border:1px solid #ddd}}</style></head><body>
<h1>sandfleet bench: {escape(la)} (A) vs {escape(lb)} (B)</h1>
<pre>{table}</pre>
<h2>Latency against busy sandboxes, per command</h2>
{lat}
<h2>Slowdown, capacity, evaluations</h2>
{body}
<p>Slowdown = latency with N busy sandboxes / latency with one (the sweep's N=1). Capacity = the largest N whose
p95 slowdown stays within the target for every command.</p>
</body></html>
"""
