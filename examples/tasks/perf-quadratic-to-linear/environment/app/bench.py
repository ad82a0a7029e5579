"""Rough benchmark: python3 bench.py"""
import random
import time

from events import dedupe, pair_count

rng = random.Random(0)
records = [{"id": rng.randint(0, 50_000), "v": i} for i in range(200_000)]
nums = [rng.randint(-1000, 1000) for _ in range(200_000)]
t = time.perf_counter()
dedupe(records)
print(f"dedupe: {time.perf_counter() - t:.3f}s")
t = time.perf_counter()
pair_count(nums, 17)
print(f"pair_count: {time.perf_counter() - t:.3f}s")
