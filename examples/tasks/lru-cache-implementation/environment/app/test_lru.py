from lru import LRUCache


def test_basic_eviction():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1      # "a" is now most recently used
    c.put("c", 3)               # evicts "b"
    assert "b" not in c
    assert c.keys() == ["a", "c"]
    assert c.evictions == 1
