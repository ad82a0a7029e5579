"""statkit: tiny descriptive statistics helpers."""
from .stats import mean, median, mode, sample_variance, percentile

__all__ = ["mean", "median", "mode", "sample_variance", "percentile"]
