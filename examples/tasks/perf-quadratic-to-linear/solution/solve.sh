#!/bin/bash
set -euo pipefail
cat > /app/events.py <<'PY'
"""Event-stream helpers used by the nightly import job."""
from collections import Counter


def dedupe(records):
    """Return records with duplicate "id" values removed.

    The first record for each id is kept and the original order is preserved.
    Ids are hashable values (ints or strings).
    """
    seen = set()
    out = []
    for r in records:
        key = r["id"]
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def pair_count(nums, target):
    """Number of index pairs (i, j) with i < j and nums[i] + nums[j] == target."""
    count = 0
    seen = Counter()
    for x in nums:
        count += seen[target - x]
        seen[x] += 1
    return count
PY
cd /app && python3 bench.py
