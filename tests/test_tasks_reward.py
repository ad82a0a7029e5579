"""Reading rewards: Harbor reward files and TB1 pytest output."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.errors import RolloutError
from sandfleet.tasks import load_task, reward_from
from sandfleet.tasks.reward import parse_pytest_output, parse_reward_json, parse_reward_text

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"

PYTEST_RA = """\
============================= test session starts ==============================
collected 3 items

../tests/test_outputs.py .F.                                             [100%]
=========================== short test summary info ============================
PASSED ../tests/test_outputs.py::test_hello_file_exists
FAILED ../tests/test_outputs.py::test_hello_file_content - AssertionError
SKIPPED [1] ../tests/test_outputs.py:9: not on this platform
========================= 1 failed, 1 passed in 0.02s ==========================
"""


def test_reward_text() -> None:
    assert parse_reward_text("1\n").value == 1.0
    assert parse_reward_text(" 0.25 ").value == 0.25
    for bad in ("", "yes", "nan", "inf"):
        with pytest.raises(RolloutError) as info:
            parse_reward_text(bad)
        assert info.value.reason == "reward_malformed"


def test_reward_json() -> None:
    assert parse_reward_json('{"reward": 0.5, "style": 1}').value == 0.5
    assert parse_reward_json('{"accuracy": 0.8}').value == 0.8
    mean = parse_reward_json('{"a": 1, "b": 0}')
    assert mean.value == 0.5 and mean.details == {"a": 1.0, "b": 0.0}
    for bad in ("{", "[1]", "{}", '{"a": "x"}', '{"a": true}', "true"):
        with pytest.raises(RolloutError):
            parse_reward_json(bad)


def test_pytest_short_summary() -> None:
    reward = parse_pytest_output(PYTEST_RA)
    assert reward.value == 0.0
    assert reward.details["test_hello_file_exists"] == 1.0
    assert reward.details["test_hello_file_content"] == 0.0
    passing = PYTEST_RA.replace(
        "FAILED ../tests/test_outputs.py::test_hello_file_content - AssertionError",
        "XFAIL ../tests/test_outputs.py::test_x",
    )
    assert parse_pytest_output(passing).value == 1.0


def test_pytest_final_line_fallback() -> None:
    assert parse_pytest_output("..\n===== 2 passed in 0.01s =====\n").value == 1.0
    assert parse_pytest_output("===== 1 failed, 2 passed, 1 warning in 3.2s =====").value == 0.0
    assert parse_pytest_output("===== 2 passed, 1 error in 0.5s =====").value == 0.0
    assert parse_pytest_output("===== no tests ran in 0.01s =====").value == 0.0
    assert parse_pytest_output("bash: pytest: command not found").value == 0.0


def test_reward_from_plans() -> None:
    harbor = load_task(FIXTURES / "harbor-hello").verifier
    assert reward_from(harbor, reward_text="1").value == 1.0
    assert reward_from(harbor, reward_json='{"reward": 0.0}').value == 0.0
    with pytest.raises(RolloutError) as info:
        reward_from(harbor, output="anything")
    assert info.value.reason == "reward_missing"
    tb1 = load_task(FIXTURES / "tb1-hello").verifier
    assert reward_from(tb1, output=PYTEST_RA).value == 0.0
    assert reward_from(tb1, output="= 2 passed in 1.0s =").value == 1.0
