"""GRPO groups, forked groups, the span recorder, and ``sandfleet run`` end to end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.analysis.trace import load_run
from sandfleet.cli import cli
from sandfleet.rollout import ScriptedPolicy, group_advantages
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.trace import SpanRecorder
from test_rollout_support import make_task, needs_bwrap, run


def test_span_recorder_tiles_with_overhead_gaps() -> None:
    rec = SpanRecorder()
    time.sleep(0.002)
    with rec.span("sandbox_start"):
        time.sleep(0.001)
    with pytest.raises(RuntimeError), rec.span("agent_command") as attrs:
        attrs["exit_code"] = 1
        raise RuntimeError("boom")
    time.sleep(0.002)
    end = rec.finish()
    names = [s["name"] for s in rec.spans]
    assert [n for n in names if n != "overhead"] == ["sandbox_start", "agent_command"]
    assert names[0] == names[-1] == "overhead"  # the gaps before and after are ours
    assert [s for s in rec.spans if s["name"] == "agent_command"][0]["exit_code"] == 1
    assert rec.spans[0]["start"] == rec.start and rec.spans[-1]["end"] == end
    assert all(a["end"] == b["start"] for a, b in zip(rec.spans, rec.spans[1:], strict=False))
    assert abs(sum(rec.seconds().values()) - (end - rec.start)) < 1e-12
    with pytest.raises(ValueError):
        with rec.span("thinking"):
            pass


def test_group_advantages() -> None:
    def r(reward: float | None, status: str = "completed", reason: str | None = None) -> RolloutResult:
        return RolloutResult("x", "t", "t", 0, "a", "b", 0.0, 1.0, status, [], reward=reward,  # type: ignore[arg-type]
                             reason=reason)

    group = [r(1.0), r(0.0), r(1.0), r(None, "failed", "node_lost")]  # the lost one is masked
    stats = group_advantages(group)
    assert stats["n"] == 3 and abs(stats["mean"] - 2 / 3) < 1e-12
    assert group[0].advantage is not None and group[0].advantage > 0 > group[1].advantage  # type: ignore[operator]
    assert group[3].advantage is None and group[3].reward is None
    assert group_advantages([r(None, "failed", "node_lost")]) == {"n": 0, "mean": None, "std": None, "masked": 1,
                                                                  "complete": False}
    policy = [r(1.0), r(None, "failed", "reward_missing")]  # a policy fault counts, as 0
    assert group_advantages(policy)["n"] == 2 and policy[1].reward == 0.0 and policy[1].advantage is not None


@needs_bwrap()
async def test_groups_fresh_and_forked(tmp_path: Path) -> None:
    task = make_task(tmp_path, prepare="echo prepared > /app/ready\n")
    policy = ScriptedPolicy(["cat /app/ready; echo hello > /app/out.txt; touch /app/mine", "ls /app"])
    for fork in (False, True):
        report = await run([task], policy, n=3, concurrency=3, fork=fork)
        assert [r.reward for r in report.results] == [1.0, 1.0, 1.0]
        assert len({r.sandbox_id for r in report.results}) == 3  # a sandbox of its own each
        assert report.groups["hello"] == {"n": 3, "mean": 1.0, "std": 0.0, "masked": 0, "complete": True}
        assert all(("prepared_from" in r.info) == fork for r in report.results)


@needs_bwrap()
def test_sandfleet_run_writes_rollouts_trace_and_summary(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    make_task(tasks, "a")
    make_task(tasks, "b", solve="echo nope > /app/out.txt")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["run", "--tasks", str(tasks), "--agent", "oracle", "-n", "2",
                                      "--concurrency", "3", "--out", str(out),
                                      "--backend", "bwrap"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "pass rate" in result.output and "50.0%" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_rollouts"] == 4 and summary["pass_rate"] == 0.5
    assert summary["mean_reward"] == 0.5 and summary["spans_mean_s"]["verifier"] > 0
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["task"] for r in rollouts) == ["a", "a", "b", "b"]
    run_ = load_run(out)
    assert len(run_.rollouts) == 4
    for r in run_.rollouts:  # spans add up to the wall time of every rollout
        assert abs(sum(s.duration for s in r.spans) - r.duration) < 1e-6
    analyzed = CliRunner().invoke(cli, ["analyze", str(out)])
    assert analyzed.exit_code == 0, analyzed.output
