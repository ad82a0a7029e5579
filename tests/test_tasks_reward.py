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
        assert info.value.reason == "bad_reward_value"


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
    assert info.value.reason == "no_reward_file"
    # both files: they must agree (reward.json's value copied into reward.txt), else 0
    assert reward_from(harbor, reward_json='{"reward": 0.5}', reward_text="0.5\n").value == 0.5
    for txt, js, reason in (("0", '{"reward": 1}', "reward_conflict"), ("1", '{"reward": 0}', "reward_conflict"),
                            (None, '{"reward": 1e300}', "bad_reward_value"), ("2", None, "bad_reward_value"),
                            ("-0.5", None, "bad_reward_value"), ("x", '{"reward": 1}', "bad_reward_value"),
                            (None, '{"reward": 1' + "0" * 400 + "}", "bad_reward_value")):
        with pytest.raises(RolloutError) as info:
            reward_from(harbor, reward_text=txt, reward_json=js)
        assert info.value.reason == reason, (txt, js)
    ranged = harbor.model_copy(update={"reward_range": (-1.0, 10.0)})
    assert reward_from(ranged, reward_text="-0.5").value == -0.5 and reward_from(ranged, reward_text="10").value == 10
    tb1 = load_task(FIXTURES / "tb1-hello").verifier
    assert reward_from(tb1, output=PYTEST_RA).value == 0.0
    assert reward_from(tb1, output="= 2 passed in 1.0s =").value == 1.0


def _harbor_copy(tmp_path: Path, verifier: str = "", test_sh: str | None = None) -> Path:
    import shutil

    folder = tmp_path / "hello"
    shutil.copytree(FIXTURES / "harbor-hello", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]\n", f"[verifier]\n{verifier}"))
    if test_sh is not None:
        (folder / "tests" / "test.sh").write_text(test_sh)
    return folder


def test_reward_range_is_read_from_task_toml_and_checked(tmp_path: Path) -> None:
    from sandfleet.errors import TaskError

    assert load_task(FIXTURES / "harbor-hello").verifier.reward_range == (0.0, 1.0)
    assert load_task(_harbor_copy(tmp_path / "a", "reward_range = [-1, 10.5]\n")).verifier.reward_range == (-1.0, 10.5)
    for bad in ("[1]", "[2, 1]", '["a", 1]', "[0, inf]"):
        with pytest.raises(TaskError, match="reward_range"):
            load_task(_harbor_copy(tmp_path / f"b{abs(hash(bad))}", f"reward_range = {bad}\n"))


def test_pytest_runs_that_may_load_a_workdir_conftest_are_flagged(tmp_path: Path) -> None:
    from sandfleet.tasks.scan import workdir_conftest_risk

    assert workdir_conftest_risk(load_task(FIXTURES / "harbor-hello")) == []  # pytest /tests/...
    risky = ("#!/bin/bash\ncd /app\npytest -rA\npython3 -m pytest --confcutdir=/tests /app\n"
             "cp /tests/t.py . && uvx pytest t.py  # in the workdir\npython3 -m pytest $TEST_DIR/t.py\n")
    found = workdir_conftest_risk(load_task(_harbor_copy(tmp_path, test_sh=risky)))
    assert [f.split(":")[1] for f in found] == ["3", "5"], found


def test_python_runs_that_skip_the_module_guard_are_flagged(tmp_path: Path) -> None:
    from sandfleet.tasks.scan import python_guard_off

    assert python_guard_off(load_task(FIXTURES / "harbor-hello")) == []
    risky = ("#!/bin/bash\ncd /app\npython3 -E /tests/t.py\npython3 -I /tests/t.py\npython -S -m pytest /tests\n"
             "python3.11 -sE t.py\npython3 /tests/t.py -E  # an argument of the script\npython3 -u /tests/t.py\n")
    found = python_guard_off(load_task(_harbor_copy(tmp_path, test_sh=risky)))
    assert [f.split(":")[1] for f in found] == ["3", "5", "6"], found


def test_reward_files_the_tests_name(tmp_path: Path) -> None:
    from sandfleet.tasks.reward import named_reward_files

    plan = load_task(FIXTURES / "harbor-hello").verifier  # its test.sh writes reward.txt only
    assert named_reward_files(plan) == {plan.reward_text_path}
    silent = load_task(_harbor_copy(tmp_path, test_sh="#!/bin/bash\npython3 /tests/grade.py\n")).verifier
    assert named_reward_files(silent) is None  # nothing to go by: both are read as before


def test_a_parsed_pass_pytest_did_not_report_to_the_witness_is_not_the_tests() -> None:
    """Round XIX: the witness file holds what the tests' pytest reported test by test (the guard's
    plugin); a TB1 pass read from the output that it contradicts is a tests_status 0, by the summary's
    names or by pytest's last line alone; no pytest in the witness (none ran under the guard) decides
    nothing."""
    from sandfleet.errors import RolloutError
    from sandfleet.tasks.model import VerifierPlan
    from sandfleet.tasks.reward import reward_from
    from sandfleet.tasks.witness import read_witness

    plan = VerifierPlan(uploads=(), command=("bash", "/tests/run-tests.sh"), timeout_s=60, reward="pytest-output",
                        parser_name="pytest")
    summary = ("=== short test summary info ===\nPASSED ../tests/test_outputs.py::test_a\n"
               "PASSED ../tests/test_outputs.py::TestB::test_b[x y]\n=== 2 passed in 0.1s ===\n")
    honest = ("python\t7\nstart\t7\npassed\t../tests/test_outputs.py::test_a\n"
              "passed\t../tests/test_outputs.py::TestB::test_b[x y]\nfinish\t0\n")
    assert reward_from(plan, output=summary, witness=honest).value == 1.0
    assert reward_from(plan, output=summary, witness=honest, exit_code=0).value == 1.0
    with pytest.raises(RolloutError, match="the test command exited 1") as info:  # the tests' own status
        reward_from(plan, output=summary, witness=honest, exit_code=1)
    assert info.value.reason == "tests_status"
    assert reward_from(plan, output=summary, witness=None).value == 1.0
    assert reward_from(plan, output=summary, witness="python\t7\n").value == 1.0  # no pytest under the guard
    for lie, why in ((honest.replace("passed\t../tests/test_outputs.py::test_a", "failed\t../tests/x.py::test_a"),
                      "test_a: failed"),
                     (honest.replace("passed\t../tests/test_outputs.py::test_a\n", ""), "test_a: not reported")):
        with pytest.raises(RolloutError, match=why) as info:
            reward_from(plan, output=summary, witness=lie)
        assert info.value.reason == "tests_status"
    counts = "..\n=== 2 passed in 0.1s ===\n"  # no summary: pytest's last line alone
    assert reward_from(plan, output=counts, witness=honest).value == 1.0
    with pytest.raises(RolloutError, match="test_a: failed"):
        reward_from(plan, output=counts, witness=honest + "failed\t../tests/test_outputs.py::test_a\n")
    seen = read_witness(honest)
    assert seen is not None and seen.pytests == 1 and "../tests/test_outputs.py::TestB::test_b[x" in seen.passed
