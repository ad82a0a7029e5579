"""Tiny inline-SVG charts (lines and grouped bars) for the self-contained HTML report."""

from __future__ import annotations

from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
W, H, L, R, T, B = 420, 260, 52, 12, 28, 50


def _ticks(lo: float, hi: float, k: int = 4) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    step = (hi - lo) / k
    return [lo + i * step for i in range(k + 1)]


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], *, xlabel: str = "",
               ylabel: str = "", hline: float | None = None, small: bool = False) -> str:
    """One line per series (name -> points), shared axes starting at 0."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return ""
    W, H = (300, 200) if small else (420, 260)  # noqa: N806
    xmax = max(x for x, _ in pts) or 1
    ymax = max([y for _, y in pts] + ([hline] if hline else [])) * 1.08 or 1
    sx = lambda x: L + (W - L - R) * x / xmax  # noqa: E731
    sy = lambda y: H - B - (H - T - B) * y / ymax  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-size="10">',
           f'<text x="{W / 2}" y="14" text-anchor="middle" font-size="12">{escape(title)}</text>']
    for y in _ticks(0, ymax):
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#eee"/>'
                   f'<text x="{L - 4}" y="{sy(y) + 3:.1f}" text-anchor="end">{y:.3g}</text>')
    for x in sorted({x for x, _ in pts}):
        out.append(f'<text x="{sx(x):.1f}" y="{H - B + 12}" text-anchor="middle">{x:g}</text>')
    out.append(f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">{escape(xlabel)}</text>'
               f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">'
               f'{escape(ylabel)}</text>')
    if hline:
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{sy(hline):.1f}" y2="{sy(hline):.1f}" '
                   f'stroke="#999" stroke-dasharray="4 3"/>')
    for i, (name, s) in enumerate((k, v) for k, v in series.items() if v):
        c = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(s))
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.6" points="{path}"/>')
        out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"/>' for x, y in s]
        out.append(f'<text x="{L + 6}" y="{T + 10 + 11 * i}" fill="{c}">{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(title: str, groups: dict[str, dict[str, float | None]], *, ylabel: str = "") -> str:
    """Grouped bars: group -> {series -> value}."""
    keys = list(dict.fromkeys(k for g in groups.values() for k in g))
    vals = [v for g in groups.values() for v in g.values() if v is not None]
    if not vals:
        return ""
    ymax = max(vals) * 1.12 or 1
    sy = lambda y: H - B - (H - T - B) * y / ymax  # noqa: E731
    W = max(300, 70 * len(groups) + L + R)  # noqa: N806
    gw = (W - L - R) / max(1, len(groups))
    bw = gw * 0.8 / max(1, len(keys))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-size="10">',
           f'<text x="{W / 2}" y="14" text-anchor="middle" font-size="12">{escape(title)}</text>',
           f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle">{escape(ylabel)}</text>']
    for y in _ticks(0, ymax):
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#eee"/>'
                   f'<text x="{L - 4}" y="{sy(y) + 3:.1f}" text-anchor="end">{y:.3g}</text>')
    for gi, (gname, g) in enumerate(groups.items()):
        x0 = L + gi * gw + gw * 0.1
        for ki, k in enumerate(keys):
            v = g.get(k)
            if v is None:
                continue
            x = x0 + ki * bw
            out.append(f'<rect x="{x:.1f}" y="{sy(v):.1f}" width="{bw - 1:.1f}" height="{sy(0) - sy(v):.1f}" '
                       f'fill="{COLORS[ki % len(COLORS)]}"><title>{escape(k)}: {v:g}</title></rect>')
        gx = x0 + gw * 0.4
        out.append(f'<text x="{gx:.1f}" y="{H - B + 12}" text-anchor="end" '
                   f'transform="rotate(-25 {gx:.1f} {H - B + 12})">{escape(gname)}</text>')
    for ki, k in enumerate(keys):
        out.append(f'<text x="{W - R - 4}" y="{T + 10 + 11 * ki}" text-anchor="end" '
                   f'fill="{COLORS[ki % len(COLORS)]}">{escape(k)}</text>')
    out.append("</svg>")
    return "".join(out)
