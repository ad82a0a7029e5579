"""The HTML page of one ``sandfleet bench peers`` run: the table, the targets, and matplotlib
charts inlined as SVG, each in ``<figure class="chart" data-chart="NAME">``:

- ``peers-create``: create->exec->close p50 and p99 per system (ms, log scale);
- ``peers-rtt``: exec round trip p50 and p99 per live system (ms, log scale);
- ``peers-cpu``: 16 concurrent CPU-bound commands, slowdown against bare processes;
- ``peers-pss``: PSS of one idle sandbox (MiB).

:func:`expected_charts` names the charts a page of given results holds (a chart with no
system measured is left out, and the page says so).
"""

from __future__ import annotations

from html import escape
from typing import Any

from sandfleet.bench.peers import COLUMNS, table_lines

CHARTS = {"peers-create": (("create_exec_close_p50_ms", "p50"), ("create_exec_close_p99_ms", "p99")),
          "peers-rtt": (("exec_rtt_p50_ms", "p50"), ("exec_rtt_p99_ms", "p99")),
          "peers-cpu": (("cpu16_slowdown", "slowdown"),),
          "peers-pss": (("idle_pss_mib", "PSS"),)}
TITLES = {"peers-create": ("create -> exec true -> close", "ms (log)"),
          "peers-rtt": ("exec true in a live sandbox", "ms (log)"),
          "peers-cpu": ("16 concurrent CPU-bound commands vs bare processes", "slowdown (x)"),
          "peers-pss": ("memory of one idle sandbox", "PSS MiB")}


def _measured(result: dict[str, Any], chart: str) -> list[dict[str, Any]]:
    key = CHARTS[chart][0][0]
    return [r for r in result["systems"] if r.get(key) is not None]


def expected_charts(result: dict[str, Any]) -> list[str]:
    return [c for c in CHARTS if _measured(result, c)]


def _chart(result: dict[str, Any], chart: str) -> str:
    from sandfleet.plotting import new_figure, svg

    rows = _measured(result, chart)
    series = CHARTS[chart]
    fig, ax = new_figure(7.0, 3.4)
    width = 0.8 / len(series)
    for k, (key, label) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, [float(r.get(key) or 0) for r in rows], width=width, label=label)
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=25, ha="right", fontsize=8)
    title, ylabel = TITLES[chart]
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    if "log" in ylabel:
        ax.set_yscale("log")
    if chart == "peers-cpu":
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return svg(fig, chart, title)


def html_page(result: dict[str, Any]) -> str:
    prov = result.get("provenance") or {}
    host = prov.get("host") or {}
    head = "".join(f"<th>{escape(label)}</th>" for _, label, _ in COLUMNS)
    body = []
    for row in result["systems"]:
        if "missing" in row or "error" in row:
            why = f"missing: {row['install']}" if "missing" in row else f"failed: {row['error']}"
            body.append(f"<tr><td>{escape(row['name'])}</td><td colspan='{len(COLUMNS)}'>{escape(why)}</td></tr>")
            continue
        cells = "".join(f"<td>{'-' if row.get(k) is None else format(row[k], spec)}</td>" for k, _, spec in COLUMNS)
        body.append(f"<tr><td>{escape(row['name'])}</td>{cells}</tr>")
    charts = [_chart(result, c) for c in expected_charts(result)]
    left = [c for c in CHARTS if c not in expected_charts(result)]
    note = f"<p>Not drawn (no system measured): {escape(', '.join(left))}</p>" if left else ""
    text = escape("\n".join(table_lines(result)))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sandfleet bench peers</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} figure{{display:inline-block;margin:1em}}</style>
</head><body>
<h1>sandfleet bench peers</h1>
<p>{escape(str(host.get('hostname')))}, {escape(str(host.get('cpu_model')))},
kernel {escape(str(host.get('kernel')))}; sandfleet {escape(str(prov.get('sandfleet')))}
commit {escape(str(prov.get('commit')))} at {escape(str(prov.get('at')))};
image {escape(str(result.get('image')))}, {result.get('rounds')} rounds, load {escape(str(result.get('loadavg')))},
{result.get('duration_s')} s</p>
<table><tr><th>system</th>{head}</tr>{''.join(body)}</table>
<pre>{text}</pre>
{note}
{''.join(charts)}
</body></html>
"""
