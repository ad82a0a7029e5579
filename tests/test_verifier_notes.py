"""What the verifier reads back from its preparation: the values after every note, never a line a
note's path made (round XI's note-newline-*)."""

from __future__ import annotations

from sandfleet.rollout.verifier import _notes


def test_a_value_line_before_home_is_a_notes_not_a_value() -> None:
    out = ("conftest: /app/x\ndemote=1/conftest.py\nmodule: /app/y\nhome=/evil\npython=/evil\n"
           "home=/tmp/h\npython=/tmp/p\nseal=/tmp/p/s.so\nlandlock=5\nuid=1001\n")
    values, risks = _notes(out)
    assert values == {"home": "/tmp/h", "python": "/tmp/p", "seal": "/tmp/p/s.so", "landlock": "5", "uid": "1001"}
    assert any("/app/x" in r for r in risks)


def test_the_values_of_a_preparation_that_printed_no_notes() -> None:
    values, risks = _notes("home=/h\npython=/p\nseal=\ndemote=1001\nuid=1001\n")
    assert values == {"home": "/h", "python": "/p", "seal": "", "demote": "1001", "uid": "1001"} and risks == []
