"""The prepare step (environment/prepare.sh) and ``--fork``: with fork a group runs prepare
once and every member starts from that state; without, every member runs it in a fresh
sandbox. Real bwrap sandboxes; what each sandbox saw comes back through the verifier's
output, and the run's records say where prepare ran."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.errors import TaskError
from sandfleet.rollout import OraclePolicy
from sandfleet.sandbox.state import SNAPSHOT_MARKER, SNAPSHOTS, state_root
from sandfleet.tasks import load_task
from test_rollout_support import make_task, needs_bwrap, run

pytestmark = needs_bwrap()
N = 4

# A fresh random id per run of prepare, a line per run in a counter, and who ran it.
PREPARE = """#!/bin/bash
set -e
cat /proc/sys/kernel/random/uuid > /app/prepared-id
echo run >> /app/prepare-runs
id -u > /app/prepare-uid
"""
# The agent copies the id (it sees the prepared file) and takes the file over (it owns it).
SOLVE = "cp /app/prepared-id /app/out.txt && chmod 600 /app/prepared-id"
REPORT = """#!/bin/bash
mkdir -p /logs/verifier
echo "prepared-id=$(cat /app/prepared-id)"
echo "prepare-runs=$(wc -l < /app/prepare-runs)"
echo "prepare-uid=$(cat /app/prepare-uid)"
echo "script-left=$(ls /tmp/.sandfleet-prepare.sh 2>/dev/null)"
if [ -s /app/out.txt ] && cmp -s /app/out.txt /app/prepared-id; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def ours() -> list[Path]:
    """Sandbox and snapshot directories this process owns (others may run beside us)."""
    found = []
    for marker in [*state_root().glob("sf-*/meta.json"), *(state_root() / SNAPSHOTS).glob(f"*/{SNAPSHOT_MARKER}")]:
        try:
            if json.loads(marker.read_text()).get("owner_pid") == os.getpid():
                found.append(marker.parent)
        except (OSError, ValueError):
            continue  # just removed
    return found


@pytest.fixture
def state() -> Iterator[None]:
    """Every sandbox closed and every snapshot deleted once the test is done."""
    assert ours() == []
    yield
    assert ours() == []


def seen(output: str) -> dict[str, str]:
    return dict(re.findall(r"^([a-z-]+)=(.*)$", output, re.M))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("fork", [True, False])
async def test_prepare_runs_once_per_group_with_fork_and_once_per_member_without(
    tmp_path: Path, state: None, fork: bool
) -> None:
    tasks = [make_task(tmp_path / "tasks", name, solve=SOLVE, test_sh=REPORT, prepare=PREPARE)
             for name in ("a", "b")]
    out = tmp_path / "out"
    report = await run(tasks, OraclePolicy(), out, n=N, concurrency=N, fork=fork)
    assert [r.reward for r in report.results] == [1.0] * 2 * N, [r.error or r.verifier_output
                                                                 for r in report.results]
    views = {r.rollout_id: seen(r.verifier_output) for r in report.results}
    for v in views.values():
        assert v["prepare-runs"] == "1" and v["prepare-uid"] == "0" and v["script-left"] == ""
    ids = {g: {views[r.rollout_id]["prepared-id"] for r in report.results if r.group == g} for g in ("a", "b")}
    if fork:  # one prepared state per group, and a different one for each group
        assert [len(ids["a"]), len(ids["b"])] == [1, 1] and ids["a"] != ids["b"]
    else:  # every member prepared its own sandbox
        assert [len(ids["a"]), len(ids["b"])] == [N, N] and not ids["a"] & ids["b"]
    # the records say so too
    traces = lines(out / "trace.jsonl")
    prepare_spans = Counter(t["group"] for t in traces for s in t["spans"]
                            if s["name"] == "sandbox_start" and s.get("what") == "prepare")
    groups = {g["group"]: g for g in lines(out / "groups.jsonl")}
    if fork:
        assert prepare_spans == Counter()
        assert all(r.info["prepared_from"] == groups[r.group]["prepare"]["snapshot"] for r in report.results)
        for g in groups.values():
            assert g["prepare"]["mode"] == "fork" and g["prepare"]["seconds"] > 0
            assert g["prepare"]["sandbox_id"] not in {r.sandbox_id for r in report.results}
    else:
        assert prepare_spans == {"a": N, "b": N}
        assert all(r.info["prepare"] == "ran" and "prepared_from" not in r.info for r in report.results)
        assert all(g["prepare"] == {"mode": "each"} for g in groups.values())


@pytest.mark.parametrize("fork", [True, False])
async def test_a_failing_prepare_fails_the_rollouts_with_its_output(
    tmp_path: Path, state: None, fork: bool
) -> None:
    task = make_task(tmp_path, "broken", prepare="echo cannot-fetch-data >&2\nexit 3\n")
    report = await run([task], OraclePolicy(), tmp_path / "out", n=2, concurrency=2, fork=fork)
    for r in report.results:
        assert r.status == "failed" and r.reason == "prepare_failed"
        assert "environment/prepare.sh exited with 3" in (r.error or "") and "cannot-fetch-data" in (r.error or "")
    assert len(report.attempts) == 2  # not retried: the task is broken, not the host
    assert report.summary()["failures"] == {"prepare_failed": 2}


async def test_a_task_without_prepare_forks_nothing(tmp_path: Path, state: None) -> None:
    task = make_task(tmp_path, "plain")
    report = await run([task], OraclePolicy(), tmp_path / "out", n=2, concurrency=2, fork=True)
    assert [r.reward for r in report.results] == [1.0, 1.0]
    assert not any("prepared_from" in r.info or "prepare" in r.info for r in report.results)
    (group,) = lines(tmp_path / "out" / "groups.jsonl")
    assert group["prepare"] == {"mode": "none"}


def test_prepare_script_must_be_a_regular_file(tmp_path: Path) -> None:
    task = make_task(tmp_path, "ok", prepare="true\n")
    assert task.prepare is not None and task.prepare.script.name == "prepare.sh"
    assert task.prepare.timeout_s == task.build_timeout_s
    script = task.path / "environment" / "prepare.sh"
    script.unlink()
    script.mkdir()
    with pytest.raises(TaskError, match=r"prepare.sh.*must be a regular file"):
        load_task(task.path)
    script.rmdir()
    script.symlink_to("/etc/passwd")
    with pytest.raises(TaskError, match="not a link"):
        load_task(task.path)
