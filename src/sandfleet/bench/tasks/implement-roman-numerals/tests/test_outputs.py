import sys

import pytest

sys.path.insert(0, "/app")
from roman import from_roman, to_roman  # noqa: E402

VALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
        (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def ref(n):
    out = ""
    for v, s in VALS:
        while n >= v:
            out += s
            n -= v
    return out


def test_full_range_round_trip():
    for n in range(1, 4000):
        s = to_roman(n)
        assert s == ref(n), n
        assert from_roman(s) == n, s


@pytest.mark.parametrize("n", [0, -1, 4000, 10**6])
def test_to_roman_range(n):
    with pytest.raises(ValueError):
        to_roman(n)


@pytest.mark.parametrize("x", [1.0, "5", None, True])
def test_to_roman_type(x):
    with pytest.raises(TypeError):
        to_roman(x)


@pytest.mark.parametrize("bad", ["", "IIII", "VV", "IC", "VX", "XM", "MMMM", "IIV", "XIIII",
                                 "CMC", "iv", "ABC", "I V", "LL", "DCD", "XCX"])
def test_from_roman_rejects(bad):
    with pytest.raises(ValueError):
        from_roman(bad)
