"""How figures read in the text and HTML reports (light: the CLI imports it at start)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def num(v: Any, digits: int = 1, suffix: str = "") -> str:
    """A figure for a table: ``digits`` decimals and ``suffix``, or ``n/a`` when missing."""
    return "n/a" if v is None else f"{v:.{digits}f}{suffix}"


def pct(v: float | None) -> str:
    """A fraction as a percentage to one decimal, or ``n/a``."""
    return "n/a" if v is None else f"{100 * v:.1f} %"


def interval(ci: Sequence[float] | None) -> str:
    """``[lo, hi]`` to one decimal (never ``-0.0``), or ``n/a``."""

    def one(x: float) -> str:
        text = f"{x:.1f}"
        return "0.0" if text == "-0.0" else text

    return "n/a" if ci is None else f"[{one(ci[0])}, {one(ci[1])}]"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Aligned text columns: the first left-aligned, the others right-aligned."""
    cols = list(zip(*([list(headers)] + [list(r) for r in rows]), strict=True))
    widths = [max(len(c) for c in col) for col in cols]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])
