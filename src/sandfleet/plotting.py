"""Plots for the HTML reports: matplotlib figures, inlined as SVG.

Every chart is wrapped in ``<figure class="chart" data-chart="NAME">`` so that a report
test (and a reader's tooling) can find each expected chart by name. matplotlib runs on
its non-interactive Agg/SVG backend: no display, no GUI toolkit.
"""

from __future__ import annotations

import html
import io
import re
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # before pyplot: never a GUI backend
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3})


_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)
_ID = re.compile(r'(\sid="|url\(#|href="#)([^")]+)')


def new_figure(width: float = 6.4, height: float = 3.6) -> tuple[Figure, Axes]:
    """A figure and its single axes (closed by :func:`svg`)."""
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    return fig, ax


def svg(fig: Figure, name: str, caption: str = "") -> str:
    """The figure as inline SVG in a named ``<figure>``; the figure is closed. Fit to sit
    beside other charts in one page: no metadata block (links to schemas, a timestamp), and
    every id prefixed by the chart's name (matplotlib numbers ``figure_1``, ``axes_1`` ...
    afresh in every SVG). Every data artist (line, bar, collection) gets the id
    ``<name>-mark-<k>``, so a reader (or the browser test) can find what was drawn, apart
    from axes, ticks and grid."""
    k = 0
    for ax in fig.axes:
        for artist in [*ax.lines, *ax.patches, *ax.collections]:
            artist.set_gid(f"{name}-mark-{k}")
            k += 1
    buf = io.StringIO()
    try:
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    text = _METADATA.sub("", buf.getvalue())
    text = text[text.index("<svg"):]  # drop the XML prolog and doctype: inline in HTML
    ids = {i for i in re.findall(r'\sid="([^"]+)"', text) if not i.startswith(f"{name}-mark-")}
    text = _ID.sub(lambda m: m.group(1) + (f"{name}-{m.group(2)}" if m.group(2) in ids else m.group(2)), text)
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure class="chart" data-chart="{html.escape(name)}">{text}{cap}</figure>'
