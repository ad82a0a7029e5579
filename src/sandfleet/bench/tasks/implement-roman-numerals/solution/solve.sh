#!/bin/bash
set -euo pipefail
cat > /app/roman.py <<'PY'
"""Roman numeral conversion."""

_VALUES = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
           (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
_DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number: int) -> str:
    """Convert an integer in the range 1..3999 to a Roman numeral."""
    if isinstance(number, bool) or not isinstance(number, int):
        raise TypeError("number must be an int")
    if not 1 <= number <= 3999:
        raise ValueError("number must be within 1..3999")
    out = []
    for value, sym in _VALUES:
        count, number = divmod(number, value)
        out.append(sym * count)
    return "".join(out)


def from_roman(numeral: str) -> int:
    """Convert a canonical upper-case Roman numeral to an integer."""
    if not isinstance(numeral, str) or not numeral:
        raise ValueError("empty numeral")
    if any(ch not in _DIGITS for ch in numeral):
        raise ValueError(f"invalid character in {numeral!r}")
    total = 0
    for i, ch in enumerate(numeral):
        v = _DIGITS[ch]
        if i + 1 < len(numeral) and _DIGITS[numeral[i + 1]] > v:
            total -= v
        else:
            total += v
    if not 1 <= total <= 3999 or to_roman(total) != numeral:
        raise ValueError(f"non-canonical numeral {numeral!r}")
    return total
PY
cd /app && python3 -m pytest -q -p no:cacheprovider test_roman.py
