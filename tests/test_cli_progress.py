"""Progress where no terminal shows a bar (issue 47): ``sandfleet run`` and ``tasks validate``
write lines a log keeps when stderr is not a terminal; ``doctor`` says what it probes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet.cli.progress import LINES, every, progress
from sandfleet.rollout.result import RolloutResult


def _result(i: int, *, passed: bool = True, final: bool = True) -> RolloutResult:
    return RolloutResult(rollout_id=f"r{i}", task=f"task-{i}", group="g", sample=0, agent="noop", backend="process",
                         start=0.0, end=1.0, status="completed" if passed else "failed", spans=[], final=final,
                         reward=1.0 if passed else 0.0)


def test_lines_without_a_terminal_one_per_rollout_or_per_n() -> None:
    out = io.StringIO()
    with progress(3, file=out, tty=False) as moved:
        moved(_result(0))
        moved(_result(1, passed=False, final=False))  # a retried attempt: not counted
        moved(_result(1, passed=False))
        moved(_result(2))
    lines = out.getvalue().splitlines()
    assert lines[0] == "rollouts: 3 to run"
    assert [line.split(",")[0] for line in lines[1:]] == [
        "rollouts 1/3 (33 %): pass 1 fail 0", "rollouts 2/3 (66 %): pass 1 fail 1",
        "rollouts 3/3 (100 %): pass 2 fail 1"]
    assert lines[-1].endswith("| task-2")
    big = io.StringIO()
    with progress(1000, "validate rollouts", file=big, tty=False) as moved:
        for i in range(1000):
            moved(_result(i))
    lines = big.getvalue().splitlines()[1:]
    assert every(1000) == 20 and len(lines) == LINES and lines[-1].startswith("validate rollouts 1000/1000 (100 %)")


def test_a_terminal_gets_the_bar_not_lines() -> None:
    out = io.StringIO()
    with progress(2, file=out, tty=True) as moved:
        moved(_result(0))
    assert "to run" not in out.getvalue() and "1/2 (" not in out.getvalue()


def _task(root: Path, name: str) -> None:
    t = root / name
    for sub in ("environment", "solution", "tests"):
        (t / sub).mkdir(parents=True)
    (t / "task.toml").write_text('version = "1.0"\n')
    (t / "instruction.md").write_text("write ok to /tmp/ok\n")
    (t / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    (t / "solution" / "solve.sh").write_text("echo ok > /tmp/ok\n")
    (t / "tests" / "test.sh").write_text('#!/bin/bash\nif grep -q ok /tmp/ok 2>/dev/null; then echo 1; else echo 0; fi'
                                         ' > /logs/verifier/reward.txt\n')


def test_run_and_validate_write_progress_lines_to_a_log(tmp_path: Path) -> None:
    """The real commands, stderr a pipe (as ``> log 2>&1``): a line per rollout, the last at 100 %."""
    tasks = tmp_path / "tasks"
    _task(tasks, "a")
    _task(tasks, "b")
    env = dict(os.environ)
    run = subprocess.run([sys.executable, "-m", "sandfleet", "run", "--tasks", str(tasks), "--backend", "process",
                          "--image", "host", "--agent", "noop", "-n", "2", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert "rollouts: 4 to run" in run.stderr, run.stderr
    assert "rollouts 4/4 (100 %): pass 0 fail 0" in run.stderr, run.stderr
    val = subprocess.run([sys.executable, "-m", "sandfleet", "tasks", "validate", str(tasks), "--backend", "process",
                          "--repeats", "1", "--report", str(tmp_path / "v.json")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert "validate rollouts: 4 to run" in val.stderr, val.stderr
    assert "validate rollouts 4/4 (100 %)" in val.stderr, val.stderr


@pytest.mark.sandbox  # the backends' probes may start bwrap, runsc or QEMU
def test_doctor_says_what_it_probes() -> None:
    res = subprocess.run([sys.executable, "-m", "sandfleet", "doctor", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if line.startswith("doctor: probing ")]
    assert [s.split()[2] for s in said] == ["cgroups", "bubblewrap", "backends", "kvm", "network", "disk"], said
    assert all(b in said[2] for b in ("bwrap", "process")), said[2]
    json.loads(res.stdout)  # stdout stays the report alone
