import pytest
from roman import from_roman, to_roman


@pytest.mark.parametrize("n,s", [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"),
                                 (90, "XC"), (400, "CD"), (1994, "MCMXCIV"), (3999, "MMMCMXCIX")])
def test_round_trip_examples(n, s):
    assert to_roman(n) == s
    assert from_roman(s) == n


def test_out_of_range():
    with pytest.raises(ValueError):
        to_roman(0)
    with pytest.raises(ValueError):
        to_roman(4000)


def test_invalid_numerals():
    for bad in ["", "IIII", "IC", "ABC"]:
        with pytest.raises(ValueError):
            from_roman(bad)
