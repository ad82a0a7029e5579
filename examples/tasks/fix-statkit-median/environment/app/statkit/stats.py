"""Descriptive statistics over sequences of numbers."""
from collections import Counter


def _require_data(values):
    data = list(values)
    if not data:
        raise ValueError("statistic requires at least one data point")
    return data


def mean(values):
    data = _require_data(values)
    return sum(data) / len(data)


def median(values):
    data = _require_data(values)
    n = len(data)
    mid = n // 2
    if n % 2 == 1:
        return data[mid]
    return (data[mid] + data[mid + 1]) / 2


def mode(values):
    """Most common value; ties are broken by the smallest value."""
    data = _require_data(values)
    counts = Counter(data)
    best = max(counts.values())
    return min(v for v, c in counts.items() if c == best)


def sample_variance(values):
    data = _require_data(values)
    if len(data) < 2:
        raise ValueError("sample variance requires at least two data points")
    m = mean(data)
    return sum((x - m) ** 2 for x in data) / len(data)


def percentile(values, p):
    """Linear-interpolation percentile, p in [0, 100]."""
    if not 0 <= p <= 100:
        raise ValueError("p must be within [0, 100]")
    data = sorted(_require_data(values))
    k = (len(data) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (k - lo)
