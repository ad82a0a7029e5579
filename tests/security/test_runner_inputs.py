"""Who decides a test's outcome, and what configures the runner (stop 78, tests/fixtures/attacks-stop78).

The guard fails a test whose skip, xfail or session exit was raised through a frame of the code under test's, and
ends with 1 a pytest that read, as its own input, a file a root agent changed outside the workdir (its ini file at
the filesystem's root, a conftest there). This is the honest side, on bwrap and gVisor:

- the tests' own skips and xfails -- pytest.skip() and pytest.importorskip() in a test's body after the solution
  ran, an xfail marker on a test that fails, a unittest.SkipTest of a tests' helper -- still decide, and pytest's
  exit status (0) scores 1;
- a root agent that writes a file the tests read (its answer, /opt/sandfleet-answer.conf) while pytest reads the
  tests' own ini file and conftest still scores 1 (shared mode: a fresh sandbox has the workdir alone).

Each test scores 0 where the rule is widened to the tests' own frames (the first) or to every file the runner reads
(the second): both can fail.
"""

from __future__ import annotations

from pathlib import Path

from test_reward_integrity import write
from test_reward_integrity_iii import BACKENDS, BY_EXIT, harbor_task, rollouts

from test_rollout_support import needs_bwrap

pytestmark = needs_bwrap()

SOLUTION = '''def answer():
    return "hello"
'''

HELPER = '''import unittest


def needs_feature(module):
    if not hasattr(module, "feature"):
        raise unittest.SkipTest("the solution has no feature: optional")
'''

TESTS = '''import sys

import pytest

sys.path.insert(0, "/app")
sys.path.insert(0, "/tests")


def test_answer():
    import solution
    assert solution.answer() == "hello"


def test_optional_part():
    import solution
    assert solution.answer() == "hello"
    if not hasattr(solution, "extra"):
        pytest.skip("the optional part is not there")


def test_an_optional_library():
    import solution
    assert solution.answer()
    pytest.importorskip("no_such_library_here")


def test_a_helper_that_skips():
    import helper
    import solution
    helper.needs_feature(solution)


@pytest.mark.xfail(reason="a known bug of the tests' own")
def test_a_known_failure():
    import solution
    assert solution.answer() == "goodbye"


def test_an_imperative_xfail():
    import solution
    if solution.answer() == "hello":
        pytest.xfail("the tests' own decision")
'''


@BACKENDS
async def test_the_tests_own_skips_and_xfails_still_decide(tmp_path: Path, backend: str) -> None:
    task = harbor_task(tmp_path, "own-skips",
                       "mkdir -p /logs/verifier\ncd /app\n"
                       "python3 -m pytest -q -rsx -p no:cacheprovider /tests/test_out.py\nrc=$?\n" + BY_EXIT,
                       tests={"test_out.py": TESTS, "helper.py": HELPER})
    for verify in ("shared", "separate"):
        results = await rollouts([task], [write("/app/solution.py", SOLUTION)], verify, backend)
        for r in results:
            assert r.reward == 1.0, (verify, r.reason, r.verifier_output[-1500:])
            assert "1 passed, 3 skipped, 2 xfailed" in r.verifier_output, r.verifier_output[-1500:]


ROOT_TESTS = '''def test_the_answer_the_agent_configured(tests_fixture):
    assert open("/opt/sandfleet-answer.conf").read().strip() == "hello" and tests_fixture == "the tests'"
'''

TESTS_CONFTEST = '''import pytest


@pytest.fixture
def tests_fixture():
    return "the tests'"
'''


@BACKENDS
async def test_a_root_agents_file_that_the_tests_read_beside_their_own_config_still_scores_one(
        tmp_path: Path, backend: str) -> None:
    """A root agent writes its answer outside the workdir (a file of /opt), which the tests read; pytest reads the
    tests' own ini file (-c) and conftest: 1."""
    task = harbor_task(tmp_path, "root-reads",
                       "mkdir -p /logs/verifier\ncd /\n"
                       "python3 -m pytest -q -p no:cacheprovider -c /tests/pytest.ini /tests/test_out.py\nrc=$?\n"
                       + BY_EXIT,
                       tests={"test_out.py": ROOT_TESTS, "conftest.py": TESTS_CONFTEST,
                              "pytest.ini": "[pytest]\nmarkers =\n    slow: the tests' own marker\n"})
    # (shared mode: the tests run where the agent wrote; a fresh sandbox has the workdir alone, and no record)
    results = await rollouts([task], ["echo hello > /opt/sandfleet-answer.conf"], "shared", backend, agent_user="root")
    for r in results:
        assert r.reward == 1.0, (r.reason, r.verifier_output[-1500:])
