import json
import random
import subprocess
import sys

import pytest

sys.path.insert(0, "/app")
from events import dedupe, pair_count  # noqa: E402

BUDGET_S = 2.0


def ref_dedupe(records):
    seen = []
    out = []
    for r in records:
        if r["id"] not in seen:
            seen.append(r["id"])
            out.append(r)
    return out


def ref_pairs(nums, target):
    return sum(1 for i in range(len(nums)) for j in range(i + 1, len(nums)) if nums[i] + nums[j] == target)


@pytest.mark.parametrize("seed", range(6))
def test_correctness_small(seed):
    rng = random.Random(seed)
    recs = [{"id": rng.choice([rng.randint(0, 20), f"k{rng.randint(0, 5)}"]), "n": i} for i in range(rng.randint(0, 120))]
    got = dedupe(recs)
    assert got == ref_dedupe(recs)
    assert all(a is b for a, b in zip(got, ref_dedupe(recs)))
    nums = [rng.randint(-10, 10) for _ in range(rng.randint(0, 150))]
    for target in (0, 3, -7, 20, 100):
        assert pair_count(nums, target) == ref_pairs(nums, target)


def test_edge_cases():
    assert dedupe([]) == []
    assert pair_count([], 1) == 0
    assert pair_count([5], 10) == 0
    assert pair_count([5, 5, 5, 5], 10) == 6
    assert pair_count([1, 2, 3, 4], 5) == 2


TIMING = r"""
import json, random, sys, time
sys.path.insert(0, "/app")
from events import dedupe, pair_count
rng = random.Random(42)
records = [{"id": rng.randint(0, 60000), "v": i} for i in range(200000)]
nums = [rng.randint(-1000, 1000) for _ in range(200000)]
res = {}
t = time.perf_counter(); d = dedupe(records); res["dedupe"] = time.perf_counter() - t
res["dedupe_len"] = len(d)
t = time.perf_counter(); p = pair_count(nums, 17); res["pairs"] = time.perf_counter() - t
res["pairs_val"] = p
print(json.dumps(res))
"""


def test_performance():
    try:
        r = subprocess.run([sys.executable, "-c", TIMING], capture_output=True, text=True, timeout=6)
    except subprocess.TimeoutExpired:
        pytest.fail("functions are far too slow (timed out)")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["dedupe"] < BUDGET_S, res
    assert res["pairs"] < BUDGET_S, res
    # sanity-check the large results against an independent computation
    rng = random.Random(42)
    ids = [rng.randint(0, 60000) for _ in range(200000)]
    nums = [rng.randint(-1000, 1000) for _ in range(200000)]
    assert res["dedupe_len"] == len(set(ids))
    from collections import Counter
    c = Counter(nums)
    exp = sum(c[x] * c[17 - x] for x in c if x < 17 - x)
    assert res["pairs_val"] == exp
