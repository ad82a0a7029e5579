"""The witness of a test command whose reward is read from its output (round XIX, docs/security.md):
what the tests' pytest processes reported, test by test, to a kept file (the verifier's guard writes it
from a plugin of its own, through a descriptor the verifier opened on the file before the tests ran), set
against what the output says."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TESTS_STATUS = "tests_status"
"""The reason (a policy fault) of a reward read from the tests' output that what the code under test can't
write does not confirm: the test command's own status, pytest's outcomes to the witness, or a test the
output gives two statuses."""


@dataclass(frozen=True)
class Witness:
    """What the tests' pytest processes reported to the kept witness file (the guard's plugin): the node
    ids each test ended with, cut at their first space as log parsers cut them."""

    pytests: int
    failed: frozenset[str]
    passed: frozenset[str]
    """Passed or skipped (xfail included)."""

    def contradicts(self, passing: Iterable[str], *, by_name: bool = False) -> list[str]:
        """Of the tests an output says passed (node ids, or with ``by_name`` their last ``::`` part),
        those pytest itself reported failed, or never reported passing, to the witness: ``name: why``.
        Nothing where no pytest reported at all (one that ran without the guard: no witness)."""
        if not self.pytests:
            return []

        def key(nodeid: str) -> str:
            return nodeid.rsplit("::", 1)[-1] if by_name else nodeid

        failed, passed = {key(n) for n in self.failed}, {key(n) for n in self.passed}
        out = []
        for name in passing:
            name = key(name.split(" ")[0])
            if name in failed:
                out.append(f"{name}: failed")
            elif name not in passed:
                out.append(f"{name}: not reported")
        return out


def read_witness(text: str | None) -> Witness | None:
    """The witness file's lines (``python<TAB>pid``, ``start<TAB>pid``, ``failed|passed|skipped<TAB>nodeid``,
    ``finish<TAB>status``), or None where there is none."""
    if not text:
        return None
    pytests, failed, passed = 0, set(), set()
    for line in text.splitlines():
        kind, _, rest = line.partition("\t")
        if kind == "start":
            pytests += 1
        elif kind == "failed" and rest:
            failed.add(rest.split(" ")[0])
        elif kind in ("passed", "skipped") and rest:
            passed.add(rest.split(" ")[0])
    return Witness(pytests, frozenset(failed), frozenset(passed))
