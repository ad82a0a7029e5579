"""Small self-made SVG charts for the HTML report: no matplotlib, no JavaScript.

Each function returns one ``<svg>`` element (a string) with a title, labelled axes and a
legend: stacked horizontal bars, a line chart (optionally log2 on x), a CDF built on it,
and a timeline of intervals per row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH = 760
LEFT, RIGHT, TOP, BOTTOM = 150, 170, 44, 52
FONT = 'font-family="sans-serif" font-size="12"'


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering ``[lo, hi]``."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(first, last + 1)]


def fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.3g}"


class _Frame:
    """A plot area with linear (or log2) x and linear y scales, drawing into ``parts``."""

    def __init__(
        self,
        plot_id: str,
        title: str,
        height: int,
        x: tuple[float, float],
        y: tuple[float, float],
        logx: bool = False,
    ):
        self.height, self.logx = height, logx
        self.x0, self.x1 = (math.log2(x[0]), math.log2(x[1])) if logx else x
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        self.y0, self.y1 = y if y[1] > y[0] else (y[0], y[0] + 1)
        self.pw, self.ph = WIDTH - LEFT - RIGHT, height - TOP - BOTTOM
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(plot_id)}" class="plot" '
            f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" {FONT}>',
            f"<title>{escape(title)}</title>",
            f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
            f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15" '
            f'font-weight="bold">{escape(title)}</text>',
        ]

    def sx(self, v: float) -> float:
        v = math.log2(v) if self.logx else v
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * self.pw

    def sy(self, v: float) -> float:
        return TOP + self.ph - (v - self.y0) / (self.y1 - self.y0) * self.ph

    def axes(
        self,
        xlabel: str,
        ylabel: str = "",
        xticks: Sequence[float] = (),
        yticks: Sequence[float] = (),
    ) -> None:
        p, bottom = self.parts, TOP + self.ph
        for t in xticks:
            x = self.sx(t)
            p.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>')
            p.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{fmt(t)}</text>')
        for t in yticks:
            y = self.sy(t)
            p.append(
                f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + self.pw}" y2="{y:.1f}" stroke="#eee"/>'
            )
            p.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
        p.append(
            f'<rect x="{LEFT}" y="{TOP}" width="{self.pw}" height="{self.ph}" '
            'fill="none" stroke="#444"/>'
        )
        p.append(
            f'<text x="{LEFT + self.pw / 2}" y="{self.height - 12}" '
            f'text-anchor="middle" class="xlabel">{escape(xlabel)}</text>'
        )
        if ylabel:
            cy = TOP + self.ph / 2
            p.append(
                f'<text x="16" y="{cy}" text-anchor="middle" class="ylabel" '
                f'transform="rotate(-90 16 {cy})">{escape(ylabel)}</text>'
            )

    def legend(self, items: Mapping[str, str]) -> None:
        x = LEFT + self.pw + 14
        self.parts.append('<g class="legend">')
        for i, (name, color) in enumerate(items.items()):
            y = TOP + 4 + i * 18
            self.parts.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color}"/>')
            self.parts.append(f'<text x="{x + 18}" y="{y + 10}">{escape(name)}</text>')
        self.parts.append("</g>")

    def done(self) -> str:
        return "\n".join([*self.parts, "</svg>"])


def stacked_bars(
    plot_id: str,
    title: str,
    rows: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    xlabel: str,
    colors: Mapping[str, str],
) -> str:
    """One horizontal bar per row, made of named segments laid end to end."""
    total = max((sum(v for _, v in segs) for _, segs in rows), default=1.0)
    ticks = nice_ticks(0, total * 1.15)  # room for the total written after each bar
    height = TOP + BOTTOM + max(46 * len(rows), 18 * len(colors))
    f = _Frame(plot_id, title, height, (0, ticks[-1]), (0, 1))
    f.axes(xlabel, xticks=ticks)
    for i, (label, segs) in enumerate(rows):
        y = TOP + 10 + i * 46
        f.parts.append(
            f'<text x="{LEFT - 8}" y="{y + 18}" text-anchor="end">{escape(label)}</text>'
        )
        x = 0.0
        for name, v in segs:
            x0, x1 = f.sx(x), f.sx(x + v)
            f.parts.append(
                f'<rect x="{x0:.1f}" y="{y}" width="{max(0.0, x1 - x0):.1f}" '
                f'height="28" fill="{colors.get(name, "#999")}">'
                f"<title>{escape(label)} {escape(name)}: {v:.2f} s</title></rect>"
            )
            x += v
        f.parts.append(f'<text x="{f.sx(x) + 4:.1f}" y="{y + 18}">{x:.1f} s</text>')
    f.legend({name: colors.get(name, "#999") for name in colors})
    return f.done()


def line_chart(
    plot_id: str,
    title: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    xlabel: str,
    ylabel: str,
    colors: Mapping[str, str],
    logx: bool = False,
    step: bool = False,
) -> str:
    """Lines with markers (or a step function when ``step``), one per series."""
    pts = [p for s in series.values() for p in s]
    xs, ys = [p[0] for p in pts] or [1.0], [p[1] for p in pts] or [0.0]
    yt = nice_ticks(min(0.0, min(ys)), max(ys))
    if logx:
        xt = [
            2.0**e for e in range(math.floor(math.log2(min(xs))), math.ceil(math.log2(max(xs))) + 1)
        ]
    else:
        xt = nice_ticks(min(0.0, min(xs)), max(xs))
    f = _Frame(plot_id, title, 340, (xt[0], xt[-1]), (yt[0], yt[-1]), logx=logx)
    f.axes(xlabel, ylabel, xticks=xt, yticks=yt)
    for n, (name, s) in enumerate(series.items()):
        color = colors.get(name, "#333")
        dash = ' stroke-dasharray="6 3"' if n % 2 else ""
        coords = []
        for i, (x, y) in enumerate(s):
            if step and i > 0:
                coords.append(f"{f.sx(x):.1f},{f.sy(s[i - 1][1]):.1f}")
            coords.append(f"{f.sx(x):.1f},{f.sy(y):.1f}")
        f.parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} '
            f'points="{" ".join(coords)}"/>'
        )
        if not step:
            for x, y in s:
                f.parts.append(
                    f'<circle cx="{f.sx(x):.1f}" cy="{f.sy(y):.1f}" r="3.5" '
                    f'fill="{color}"><title>{escape(name)}: x={fmt(x)}, '
                    f"y={y:.3g}</title></circle>"
                )
    f.legend({name: colors.get(name, "#333") for name in series})
    return f.done()


def cdf(
    plot_id: str,
    title: str,
    series: Mapping[str, Sequence[float]],
    xlabel: str,
    colors: Mapping[str, str],
) -> str:
    """Empirical CDF of each series of values."""
    steps = {}
    for name, values in series.items():
        xs = sorted(values)
        n = len(xs)
        steps[name] = [(xs[0] if xs else 0.0, 0.0)] + [(x, (i + 1) / n) for i, x in enumerate(xs)]
    return line_chart(plot_id, title, steps, xlabel, "fraction of rollouts", colors, step=True)


def timeline(
    plot_id: str,
    title: str,
    rows: Sequence[tuple[str, Sequence[tuple[float, float, str]]]],
    xlabel: str,
    legend: Mapping[str, str],
) -> str:
    """One row per label, with coloured intervals ``(start, end, color)`` on a shared axis."""
    ends = [e for _, iv in rows for _, e, _ in iv] or [1.0]
    xt = nice_ticks(0, max(ends))
    row_h = 14 if len(rows) > 20 else 22
    f = _Frame(plot_id, title, TOP + BOTTOM + row_h * max(1, len(rows)) + 8, (0, xt[-1]), (0, 1))
    f.axes(xlabel, xticks=xt)
    for i, (label, intervals) in enumerate(rows):
        y = TOP + 4 + i * row_h
        f.parts.append(
            f'<text x="{LEFT - 6}" y="{y + row_h - 6}" text-anchor="end" '
            f'font-size="10">{escape(label)}</text>'
        )
        for s, e, color in intervals:
            f.parts.append(
                f'<rect x="{f.sx(s):.1f}" y="{y}" width="{max(0.5, f.sx(e) - f.sx(s)):.1f}" '
                f'height="{row_h - 3}" fill="{color}"/>'
            )
    f.legend(legend)
    return f.done()
