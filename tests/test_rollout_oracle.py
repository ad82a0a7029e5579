"""Oracle and no-op rollouts in real bwrap sandboxes; spans tile each rollout's wall time."""

from __future__ import annotations

import json
from pathlib import Path

from sandfleet.analysis.trace import load_run
from sandfleet.rollout import NoopPolicy, OraclePolicy, ScriptedPolicy
from sandfleet.traceschema import SPAN_NAMES
from test_rollout_support import make_task, needs_bwrap, run

pytestmark = needs_bwrap()


async def test_oracle_scores_one_noop_zero_and_spans_tile(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    out = tmp_path / "out"
    report = await run([task], OraclePolicy(), out, n=2, concurrency=2)
    assert [r.reward for r in report.results] == [1.0, 1.0]
    for r in report.results:
        total = sum(s["end"] - s["start"] for s in r.spans)
        assert abs(total - r.duration) < 1e-9  # the spans add up to the wall time
        for a, b in zip(r.spans, r.spans[1:], strict=False):
            assert a["end"] == b["start"]  # they tile, no gap and no overlap
        names = [s["name"] for s in r.spans if s["name"] != "overhead"]
        assert names[0] == "sandbox_start" and "verifier" in names and "agent_command" in names
        assert set(names) <= set(SPAN_NAMES)
        assert "checking /app/out.txt" in r.verifier_output
    noop = await run([task], NoopPolicy(), n=1)
    assert noop.results[0].status == "completed" and noop.results[0].reward == 0.0

    run_ = load_run(out)  # the analysis reads our trace strictly
    assert len(run_.rollouts) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_rollouts"] == 2 and summary["pass_rate"] == 1.0
    assert summary["mean_reward"] == 1.0 and set(summary["spans_mean_s"]) == set(SPAN_NAMES)
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [r["advantage"] for r in records] == [None, None]  # written as each rollout ended
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert [sorted(g["advantages"].values()) for g in groups] == [[0.0, 0.0]]  # when the group ended


async def test_scripted_commands_share_a_shell_and_record_exit_codes(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    policy = ScriptedPolicy(["cd /tmp && X=hel", "cd /app; echo ${X}lo > out.txt", "exit 3"])
    r = (await run([task], policy)).results[0]
    assert r.reward == 1.0 and r.commands == 3
    codes = [s["exit_code"] for s in r.spans if s["name"] == "agent_command"]
    assert codes == [0, 0, 3]


async def test_task_env_and_workdir_reach_the_agent(tmp_path: Path) -> None:
    task = make_task(tmp_path, dockerfile="FROM python:3.11-slim-bookworm\nWORKDIR /srv/job\n"
                     "ENV GREETING=hello\n",
                     test_sh=CHECK_WORKDIR)
    r = (await run([task], ScriptedPolicy(['echo "$GREETING" > "$PWD/out.txt"']))).results[0]
    assert r.status == "completed", r.error
    assert r.reward == 1.0, r.verifier_output


CHECK_WORKDIR = """#!/bin/bash
mkdir -p /logs/verifier
[ "$(cat /srv/job/out.txt)" = hello ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
