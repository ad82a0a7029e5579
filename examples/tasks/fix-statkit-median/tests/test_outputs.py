import random
import statistics
import subprocess
import sys

import pytest

sys.path.insert(0, "/app")
from statkit import mean, median, mode, percentile, sample_variance  # noqa: E402


def test_original_suite_passes_unmodified():
    with open("/tests/original_test_stats.py") as f, open("/app/tests/test_stats.py") as g:
        assert f.read() == g.read(), "tests/test_stats.py must not be modified"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd="/app", capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_median_random_against_stdlib():
    rng = random.Random(1234)
    for n in range(1, 40):
        data = [rng.randint(-1000, 1000) for _ in range(n)]
        assert median(data) == pytest.approx(statistics.median(data))


def test_median_does_not_mutate_input():
    data = [5, 3, 9, 1]
    median(data)
    assert data == [5, 3, 9, 1]


def test_sample_variance_random_against_stdlib():
    rng = random.Random(99)
    for n in range(2, 30):
        data = [rng.uniform(-50, 50) for _ in range(n)]
        assert sample_variance(data) == pytest.approx(statistics.variance(data))


def test_other_functions_still_work():
    assert mean([2, 4]) == 3
    assert mode([7, 7, 2, 2, 9]) == 2
    assert percentile([1, 2, 3, 4], 100) == 4
    with pytest.raises(ValueError):
        sample_variance([1])
