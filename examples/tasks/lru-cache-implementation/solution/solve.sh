#!/bin/bash
set -euo pipefail
cat > /app/lru.py <<'PY'
"""A least-recently-used cache."""
from collections import OrderedDict

_MISSING = object()


class LRUCache:
    """Fixed-capacity mapping that evicts the least recently used entry (see the task for details)."""

    def __init__(self, capacity):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError("capacity must be a positive int")
        self._capacity = capacity
        self._data = OrderedDict()
        self._evictions = 0

    def get(self, key, default=None):
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            return default
        self._data.move_to_end(key)
        return value

    def put(self, key, value):
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self._capacity:
            self._data.popitem(last=False)
            self._evictions += 1

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data

    def keys(self):
        return list(self._data)

    @property
    def evictions(self):
        return self._evictions
PY
cd /app && python3 -m pytest -q -p no:cacheprovider test_lru.py
