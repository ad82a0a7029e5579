"""The one percentile, and the bootstrap confidence interval, every figure uses.

- ``percentile(values, q)``: numpy's default ("linear": interpolation between the closest
  ranks, ``(n - 1) * q / 100``), the same definition in analysis, bench and micro figures.
- ``bootstrap_ci(values, stat, level)``: a percentile bootstrap over resamples of
  ``values`` (a seeded generator: the same data give the same interval).
- ``bootstrap_ci2(a, b, stat)``: the same for a statistic of two independent samples
  (each resampled on its own), e.g. mean(B) - mean(A).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.90


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest ranks; NaN if empty or
    if a value is NaN. numpy's default, computed as numpy does (its ``_lerp``: from the upper rank
    where the fraction is at least a half), without numpy: the sandbox and service processes import
    this, and numpy costs each of them 40 ms at import and an OpenBLAS thread that spins."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not between 0 and 100")
    if len(values) == 0:
        return math.nan
    xs = sorted(float(v) for v in values)
    if any(math.isnan(x) for x in xs):
        return math.nan
    pos = (len(xs) - 1) * (q / 100)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    t = pos - lo
    a, b = xs[lo], xs[hi]
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def bootstrap_ci(
    values: Sequence[float], stat: Callable[[np.ndarray], float], *, level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
) -> tuple[float, float]:
    """(low, high) of a ``level`` percentile-bootstrap interval of ``stat``; NaNs if empty."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    stats = np.array([stat(x[i]) for i in idx])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    return float(np.percentile(stats, lo)), float(np.percentile(stats, hi))


def bootstrap_ci2(
    a: Sequence[float], b: Sequence[float], stat: Callable[[np.ndarray, np.ndarray], float], *,
    level: float = DEFAULT_LEVEL, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
) -> tuple[float, float]:
    """(low, high) of a ``level`` bootstrap interval of ``stat(a, b)``, each sample resampled
    on its own; NaNs if either is empty."""
    import numpy as np

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xa.size == 0 or xb.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, xa.size, size=(resamples, xa.size))
    ib = rng.integers(0, xb.size, size=(resamples, xb.size))
    stats = np.array([stat(xa[i], xb[j]) for i, j in zip(ia, ib, strict=True)])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    return float(np.percentile(stats, lo)), float(np.percentile(stats, hi))
