import pytest

from statkit import mean, median, mode, sample_variance, percentile


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_mode_tie_breaks_low():
    assert mode([3, 3, 1, 1, 2]) == 1


def test_sample_variance():
    assert sample_variance([2, 4, 4, 4, 5, 5, 7, 9]) == pytest.approx(4.571428571)


def test_percentile():
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([10, 20], 25) == 12.5


def test_empty_raises():
    with pytest.raises(ValueError):
        median([])
