"""The test runner's machinery changed in place inside the tests' process (stop 77, tests/fixtures/attacks-stop77):
a runner function's code swapped, a partial's function behind padding, a metaclass's __call__, pluggy's record of a
module plugin's hook and its manager's own hook caller, a report's class. The guard refuses the code under test
changing the code or defaults of a function that is not its own and the class of the runner's objects, and, as an
armed process ends, judges whatever of the runner's machinery changed since the code loaded by the code it runs.

This is the honest side, on bwrap and gVisor in both verify modes: a solution that does all of those things to its
own code (a function's code and defaults swapped, its module's class set to a lazy one, a metaclass of its own
whose __call__ counts, a partial of its own with 600 arguments), and a repository's conftest with a hook wrapper of
pytest_runtest_makereport (a module plugin's function: its own), still scores 1.
"""

from __future__ import annotations

from pathlib import Path

from test_reward_integrity import write
from test_reward_integrity_iii import BACKENDS, BY_EXIT, harbor_task, rollouts

from test_rollout_support import needs_bwrap

pytestmark = needs_bwrap()

SOLUTION = '''import functools
import sys
import types


def _hello(word="nope"):
    return word


def _answer():
    return "hello"


_hello.__defaults__ = ("hello",)  # its own function's defaults
_hello.__code__ = _answer.__code__  # and code


class _Counting(type):
    made = 0

    def __call__(cls, *args, **kwargs):
        _Counting.made += 1
        return super().__call__(*args, **kwargs)


class Word(metaclass=_Counting):
    def __init__(self, text):
        self.text = text


_PADDED = functools.partial(lambda *args: args[-1], *[object() for _ in range(600)])


class _Lazy(types.ModuleType):
    def __getattr__(self, name):
        if name == "late":
            return "hello"
        raise AttributeError(name)


sys.modules[__name__].__class__ = _Lazy  # its own module's class (a lazy module, as libraries do)


def answer():
    return Word(_PADDED(_hello())).text if _Counting.made >= 0 else None
'''

CONFTEST = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)
'''

TEST = '''import sys

sys.path.insert(0, "/app")


def test_out():
    import solution
    assert solution.answer() == "hello"
    assert solution.late == "hello"
'''


@BACKENDS
async def test_code_that_changes_its_own_code_in_place_still_scores_one(tmp_path: Path, backend: str) -> None:
    task = harbor_task(tmp_path, "own-code-in-place",
                       "mkdir -p /logs/verifier\ncp /tests/test_out.py /app/test_out.py\ncd /app\n"
                       "python3 -m pytest -q -p no:cacheprovider test_out.py\nrc=$?\n" + BY_EXIT,
                       tests={"test_out.py": TEST})
    commands = [write("/app/solution.py", SOLUTION), write("/app/conftest.py", CONFTEST)]
    for verify in ("shared", "separate"):
        results = await rollouts([task], commands, verify, backend)
        for r in results:
            assert r.reward == 1.0, (verify, r.reason, r.verifier_output[-1500:])
