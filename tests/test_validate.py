"""``sandfleet tasks validate``: valid, invalid (with why) and flaky tasks, table and JSON."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sandfleet.cli import cli
from test_rollout_support import make_task, needs_bwrap

pytestmark = needs_bwrap()


def test_validate_reports_each_kind_of_task(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    make_task(suite, "good")
    make_task(suite, "wrong-solution", solve="echo goodbye > /app/out.txt")
    make_task(suite, "always-passes", test_sh="#!/bin/bash\nmkdir -p /logs/verifier\n"
              "echo 1 > /logs/verifier/reward.txt\n")  # fmt: skip
    make_task(suite, "broken-image", dockerfile="FROM python:3.11-slim-bookworm\nWORKDIR /app\n"
              "RUN exit 7\n")  # fmt: skip
    (suite / "not-a-task").mkdir()
    (suite / "bad-toml").mkdir()
    (suite / "bad-toml" / "task.toml").write_text("[agent]\ntimeout_sec = 'soon'\n")
    report = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["tasks", "validate", str(suite), "--repeats", "2",
                                      "--json", "--report", str(report)])  # fmt: skip
    assert result.exit_code == 1, result.output
    verdicts = json.loads(report.read_text())
    assert json.loads(result.stdout) == verdicts
    assert verdicts["good"]["status"] == "valid" and verdicts["good"]["reason"] == ""
    wrong = verdicts["wrong-solution"]
    assert wrong["status"] == "invalid" and "oracle passed 0/2" in wrong["reason"]
    assert "checking /app/out.txt" in wrong["reason"]  # the tail of the test output
    passes = verdicts["always-passes"]
    assert passes["status"] == "invalid" and "pass without any work" in passes["reason"]
    broken = verdicts["broken-image"]
    assert broken["status"] == "invalid" and "image build failed" in broken["reason"]
    assert "Dockerfile:3" in broken["reason"]
    assert verdicts["bad-toml"]["status"] == "invalid" and "timeout_sec" in verdicts["bad-toml"]["reason"]
    assert "not-a-task" not in verdicts


def test_validate_table_and_exit_zero_when_all_valid(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    make_task(suite, "good")
    report = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["tasks", "validate", str(suite), "-r", "1", "--report",
                                      str(report)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "good" in result.output and "1/1 valid" in result.output
    assert json.loads(report.read_text())["good"]["status"] == "valid"


def test_judge_calls_mixed_results_flaky() -> None:
    from sandfleet.rollout.result import RolloutResult
    from sandfleet.rollout.validate import judge
    from sandfleet.tasks import load_task

    task = load_task(Path(__file__).parent / "fixtures" / "tasks" / "harbor-hello")

    def r(reward: float) -> RolloutResult:
        return RolloutResult("x", "t", "t", 0, "a", "bwrap", 0.0, 1.0, "completed", [],
                             reward=reward, verifier_output="tail of tests")

    verdict = judge(task, [r(1.0), r(0.0), r(1.0)], [r(0.0)] * 3)
    assert verdict.status == "flaky" and verdict.reason.startswith("flaky 2/3")
    assert "tail of tests" in verdict.reason
    assert judge(task, [r(1.0)] * 3, [r(0.0)] * 3).status == "valid"
    assert judge(task, [r(0.0)] * 3, [r(0.0)] * 3).status == "invalid"


async def test_validate_flags_an_oracle_that_passes_only_as_root(tmp_path: Path) -> None:
    from sandfleet.rollout.validate import validate_tasks

    async def host(task: object) -> str:
        return "host"

    needs_root = '[ "$(id -u)" = 0 ] || { echo "not root" >&2; exit 1; }; echo hello > /app/out.txt'
    rooted = make_task(tmp_path, "needs-root", solve=needs_root)
    declared = make_task(tmp_path, "declares-root", solve=needs_root)
    toml = declared.path / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\n", '[agent]\nuser = "root"\n'))
    from sandfleet.tasks import load_task

    tasks = [rooted, make_task(tmp_path, "good"), load_task(declared.path)]
    verdicts = await validate_tasks(tasks, repeats=1, backend="bwrap", image_for=host)
    assert verdicts["needs-root"].status == "invalid", verdicts["needs-root"]
    assert "passes only as root" in verdicts["needs-root"].reason and "agent" in verdicts["needs-root"].reason
    assert verdicts["good"].status == "valid", verdicts["good"]
    assert verdicts["declares-root"].status == "valid", verdicts["declares-root"]  # [agent].user = "root"
    as_root = await validate_tasks([rooted], repeats=1, backend="bwrap", image_for=host, agent_user="root")
    assert as_root["needs-root"].status == "valid"  # --agent-user root: Docker's behaviour
