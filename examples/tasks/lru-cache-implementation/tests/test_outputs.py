import json
import random
import subprocess
import sys
from collections import OrderedDict

import pytest

sys.path.insert(0, "/app")
from lru import LRUCache  # noqa: E402


class Model:
    def __init__(self, cap):
        self.cap, self.d, self.ev = cap, OrderedDict(), 0

    def get(self, k, default=None):
        if k in self.d:
            self.d.move_to_end(k)
            return self.d[k]
        return default

    def put(self, k, v):
        self.d[k] = v
        self.d.move_to_end(k)
        if len(self.d) > self.cap:
            self.d.popitem(last=False)
            self.ev += 1


@pytest.mark.parametrize("bad", [0, -1])
def test_invalid_capacity(bad):
    with pytest.raises(ValueError):
        LRUCache(bad)


def test_update_existing_does_not_evict():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    assert len(c) == 2 and c.evictions == 0
    assert c.keys() == ["b", "a"]
    c.put("c", 3)
    assert c.keys() == ["a", "c"] and c.get("a") == 10 and c.get("b", "miss") == "miss"


def test_contains_does_not_touch():
    c = LRUCache(2)
    c.put(1, "x")
    c.put(2, "y")
    assert 1 in c
    c.put(3, "z")
    assert 1 not in c and c.keys() == [2, 3]


def test_none_values_and_capacity_one():
    c = LRUCache(1)
    c.put("k", None)
    assert c.get("k", "d") is None
    c.put("j", 0)
    assert c.keys() == ["j"] and c.evictions == 1 and len(c) == 1


@pytest.mark.parametrize("seed", range(5))
def test_random_against_model(seed):
    rng = random.Random(seed)
    cap = rng.randint(1, 20)
    c, m = LRUCache(cap), Model(cap)
    for _ in range(3000):
        k = rng.randint(0, 40)
        op = rng.random()
        if op < 0.45:
            assert c.get(k, -1) == m.get(k, -1)
        elif op < 0.9:
            v = rng.random()
            c.put(k, v)
            m.put(k, v)
        else:
            assert (k in c) == (k in m.d)
        assert len(c) == len(m.d)
    assert c.keys() == list(m.d)
    assert c.evictions == m.ev


# Against a baseline measured in the same run, not a wall-clock budget: the same 300,000
# operations go to LRUCache and to a minimal OrderedDict cache (O(1) per operation), taking
# turns (CPU time of this process, which other processes on a busy host hardly change; best of
# three each). LRUCache may take at most LIMIT times as long: an O(1) implementation, even a
# hand-written linked list, takes about 1-5x; an O(n) one (a list of keys, a scan for the
# oldest) hundreds of times, so its run is stopped (a CPU-time timer) at the limit.
PERF = r"""
import gc, json, random, signal, sys, time
from collections import OrderedDict
sys.path.insert(0, "/app")
from lru import LRUCache
LIMIT = float(sys.argv[1])


class Over(Exception):
    pass


def over(signum, frame):
    raise Over()


signal.signal(signal.SIGPROF, over)


class Baseline:
    def __init__(self, cap):
        self.cap, self.d = cap, OrderedDict()

    def get(self, k, default=None):
        if k in self.d:
            self.d.move_to_end(k)
            return self.d[k]
        return default

    def put(self, k, v):
        self.d[k] = v
        self.d.move_to_end(k)
        if len(self.d) > self.cap:
            self.d.popitem(last=False)


rng = random.Random(1)
keys = [rng.randint(0, 100000) for _ in range(300000)]


def work(cls, stop_after=None):
    c = cls(50000)
    gc.collect()
    gc.disable()
    t = time.process_time()
    try:
        if stop_after:
            signal.setitimer(signal.ITIMER_PROF, stop_after)
        for i, k in enumerate(keys):
            if i % 3:
                c.put(k, i)
            else:
                c.get(k)
    except Over:
        return None
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        gc.enable()
    return time.process_time() - t


base_s, sol_s = [], []
for _ in range(3):
    base_s.append(work(Baseline))
    t = work(LRUCache, stop_after=LIMIT * min(base_s))
    if t is None:
        sol_s = None
        break
    sol_s.append(t)
ratio = LIMIT if sol_s is None else min(sol_s) / max(min(base_s), 1e-9)
print(json.dumps({"baseline_s": min(base_s), "solution_s": sol_s and min(sol_s), "ratio": ratio}))
"""
LIMIT = 20.0  # at most this many times the OrderedDict baseline's CPU time


def test_performance():
    try:
        r = subprocess.run([sys.executable, "-c", PERF, str(LIMIT)], capture_output=True, text=True, timeout=50)
    except subprocess.TimeoutExpired:
        pytest.fail("too slow")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["ratio"] < LIMIT, f"far slower than an O(1) cache: {res}"
