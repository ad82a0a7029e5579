"""A least-recently-used cache."""


class LRUCache:
    """Fixed-capacity mapping that evicts the least recently used entry.

    - ``LRUCache(capacity)``: capacity must be a positive int, otherwise ValueError.
    - ``get(key, default=None)``: return the value (marking the key as most
      recently used) or ``default`` if the key is absent.
    - ``put(key, value)``: insert or update the key and mark it as most recently
      used; if this makes the cache exceed its capacity, evict the least
      recently used entry.
    - ``len(cache)``, ``key in cache``: size and membership; ``in`` does NOT
      change recency.
    - ``keys()``: list of keys from least to most recently used.
    - ``evictions``: number of entries evicted so far.

    All operations must be O(1) on average (``keys()`` is O(n)).
    """

    def __init__(self, capacity):
        raise NotImplementedError

    def get(self, key, default=None):
        raise NotImplementedError

    def put(self, key, value):
        raise NotImplementedError

    def __len__(self):
        raise NotImplementedError

    def __contains__(self, key):
        raise NotImplementedError

    def keys(self):
        raise NotImplementedError

    @property
    def evictions(self):
        raise NotImplementedError
