"""Roman numeral conversion."""


def to_roman(number: int) -> str:
    """Convert an integer in the range 1..3999 to a Roman numeral (e.g. 1994 -> 'MCMXCIV').

    Raise ValueError for numbers outside 1..3999 and TypeError for non-integers
    (bool is not accepted either).
    """
    raise NotImplementedError


def from_roman(numeral: str) -> int:
    """Convert a canonical upper-case Roman numeral to an integer.

    Raise ValueError for empty strings, unknown characters and any numeral that
    is not in canonical form (for example 'IIII', 'IC', 'VX' or 'MMMM'), i.e.
    from_roman(s) must only succeed when to_roman(from_roman(s)) == s.
    """
    raise NotImplementedError
