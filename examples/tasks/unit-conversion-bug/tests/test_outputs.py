import itertools
import sys
from fractions import Fraction as Fr

import pytest

sys.path.insert(0, "/app")
from units import convert  # noqa: E402

INCH = Fr(254, 10000)
LEN = {"m": Fr(1), "km": Fr(1000), "cm": Fr(1, 100), "mm": Fr(1, 1000), "in": INCH, "ft": 12 * INCH, "mi": 5280 * 12 * INCH}
LB = Fr(45359237, 10**8)
MASS = {"kg": Fr(1), "g": Fr(1, 1000), "lb": LB, "oz": LB / 16}


@pytest.mark.parametrize("table", [LEN, MASS])
def test_all_pairs(table):
    for a, b in itertools.product(table, repeat=2):
        for v in (1, 2.5, -3, 1234.5678):
            exp = float(Fr(v) * table[a] / table[b])
            assert convert(v, a, b) == pytest.approx(exp, rel=1e-9), (v, a, b)


def to_c(v, u):
    return {"C": v, "F": (v - 32) * Fr(5, 9), "K": v - Fr(27315, 100)}[u]


def from_c(c, u):
    return {"C": c, "F": c * Fr(9, 5) + 32, "K": c + Fr(27315, 100)}[u]


def test_temperatures():
    for a, b in itertools.product("CFK", repeat=2):
        for v in (-40, 0, 37, 100, 451, -273.15, 1000.5):
            exp = float(from_c(to_c(Fr(v), a), b))
            assert convert(v, a, b) == pytest.approx(exp, rel=1e-9, abs=1e-9), (v, a, b)


def test_known_values():
    assert convert(1, "km", "m") == pytest.approx(1000)
    assert convert(212, "F", "C") == pytest.approx(100)
    assert convert(5, "km", "mi") == pytest.approx(3.1068559611866697)
    assert convert(0, "K", "C") == pytest.approx(-273.15)
    assert convert(1, "lb", "oz") == pytest.approx(16)


@pytest.mark.parametrize("a,b", [("kg", "m"), ("C", "kg"), ("m", "F"), ("furlong", "m"), ("m", "yd"), ("c", "F")])
def test_invalid(a, b):
    with pytest.raises(ValueError):
        convert(1, a, b)
