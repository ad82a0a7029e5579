"""Results are never lost: a used --out is refused unless --resume or --overwrite, records are
written as rollouts and groups end, summary.json is atomic and also written when a run is
stopped, and a SIGKILLed ``sandfleet run`` resumes with no rollout lost or duplicated.

These run real ``sandfleet run`` subprocesses on the process backend in the host image
(``--image host``), with the agent talking to a scripted model server on loopback, so a
rollout takes about a second; the tasks' verifiers can't find their tests there (the process
backend isolates nothing), so rollouts end with reward 0, ``no_reward_file``, which is still a
recorded result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.testing.fake_server import FakeModelServer


def _tasks(root: Path, names: list[str]) -> Path:
    for name in names:
        folder = root / name
        for sub in ("environment", "solution", "tests"):
            (folder / sub).mkdir(parents=True)
        (folder / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n')
        (folder / "instruction.md").write_text("Say hello.\n")
        (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
        (folder / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello\n")
        (folder / "tests" / "test.sh").write_text("#!/bin/bash\nexit 0\n")
    return root


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = dict(os.environ)
    e.update(SANDFLEET_STATE=str(tmp_path / "state"), SANDFLEET_CACHE=str(tmp_path / "cache"),
             SANDFLEET_CGROUP_PARENT=f"sf-test-results-{os.getpid()}")  # fmt: skip
    return e


@pytest.fixture
def model() -> Iterator[FakeModelServer]:
    with FakeModelServer([{"bash": "sleep 0.6", "delay_s": 0.2}, "Done."]) as server:
        yield server


def _argv(tasks: Path, out: Path, *extra: str, model: FakeModelServer | None = None) -> list[str]:
    agent = ["--agent", "noop"] if model is None else ["--agent", "openai", "--model-url", model.url]
    return [sys.executable, "-m", "sandfleet.cli", "run", "--tasks", str(tasks), "--backend", "process",
            "--image", "host", "-n", "2", "--concurrency", "2", "--attempts", "1", "--out", str(out),
            *agent, *extra]  # fmt: skip


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_used_out_is_refused_and_overwrite_replaces_only_a_run(tmp_path: Path, env: dict[str, str]) -> None:
    tasks = _tasks(tmp_path / "tasks", ["a", "b"])
    out = tmp_path / "out"
    first = _run(_argv(tasks, out), env)
    assert first.returncode == 0, first.stderr  # rollouts ran (and scored 0: no verifier on process)
    before = (out / "rollouts.jsonl").read_text()
    assert len(before.splitlines()) == 4 and len(_lines(out / "groups.jsonl")) == 2
    again = _run(_argv(tasks, out), env)
    assert again.returncode == 2 and "not empty" in again.stderr and "--resume" in again.stderr
    assert "Traceback" not in again.stderr
    assert (out / "rollouts.jsonl").read_text() == before  # untouched
    over = _run(_argv(tasks, out, "--overwrite"), env)
    assert over.returncode == 0, over.stderr
    after = _lines(out / "rollouts.jsonl")
    assert len(after) == 4 and (out / "rollouts.jsonl").read_text() != before  # a new run
    # --overwrite never deletes a directory that holds no run
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    refused = _run(_argv(tasks, precious, "--overwrite"), env)
    assert refused.returncode == 2 and "holds no sandfleet run" in refused.stderr
    assert (precious / "thesis.tex").read_text() == "years of work"
    # a resumed finished run runs nothing and keeps every record
    resumed = _run(_argv(tasks, out, "--resume"), env)
    assert resumed.returncode == 0, resumed.stderr
    assert _lines(out / "rollouts.jsonl") == after
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_rollouts"] == 4 and summary["resumed_rollouts"] == 4


def test_mistyped_backend_is_a_usage_error_before_any_rollout(tmp_path: Path, env: dict[str, str]) -> None:
    tasks = _tasks(tmp_path / "tasks", ["a"])
    argv = _argv(tasks, tmp_path / "out")
    argv[argv.index("process")] = "bwarp"
    res = _run(argv, env)
    assert res.returncode == 2 and "'bwarp' is not one of" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()


def _wait_for(pred: object, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


@pytest.mark.slow
def test_sigkilled_run_resumes_losing_only_what_was_in_flight(
    tmp_path: Path, env: dict[str, str], model: FakeModelServer
) -> None:
    names = ["a", "b", "c", "d", "e"]
    tasks = _tasks(tmp_path / "tasks", names)
    out = tmp_path / "out"
    proc = subprocess.Popen(_argv(tasks, out, model=model), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        # kill it once one group is complete and another rollout has finished after it
        _wait_for(lambda: len(_lines(out / "groups.jsonl")) >= 1 and len(_lines(out / "rollouts.jsonl")) >= 3, 60)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    groups_before = _lines(out / "groups.jsonl")
    records_before = _lines(out / "rollouts.jsonl")
    assert 1 <= len(groups_before) < len(names), "the kill came too late to test anything"
    assert not (out / "summary.json").exists()  # SIGKILL: nothing could write it
    finished = {str(g["group"]) for g in groups_before}
    kept = {str(r["rollout_id"]): r for r in records_before if r["group"] in finished}
    assert len(kept) == 2 * len(finished)  # every finished group's records were on disk
    run_id = json.loads((out / "run.json").read_text())["run_id"]

    res = _run(_argv(tasks, out, "--resume", model=model), env)
    assert res.returncode == 0, res.stderr  # (every rollout scores 0 on the process backend, none fails)
    records = _lines(out / "rollouts.jsonl")
    ids = [str(r["rollout_id"]) for r in records]
    keys = sorted((str(r["task"]), int(r["sample"])) for r in records)  # type: ignore[call-overload]
    assert keys == sorted((n, i) for n in names for i in range(2))  # none lost, none twice
    for r in records:  # the finished groups' records are the very same ones
        if r["rollout_id"] in kept:
            assert r == kept[str(r["rollout_id"])]
        assert r["status"] == "completed" and r["reason"] == "no_reward_file" and r["commands"] == 1
    groups = _lines(out / "groups.jsonl")
    assert sorted(str(g["group"]) for g in groups) == names
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run_id"] == run_id and summary["n_rollouts"] == 10
    assert summary["resumed_rollouts"] == len(kept) and summary["interrupted"] is False
    assert summary["close_failures"] == 0
    traces = _lines(out / "trace.jsonl")
    finals = [t for t in traces if t["final"]]
    assert sorted(str(t["rollout_id"]) for t in finals) == sorted(ids)  # one final attempt each
    # the replay records (docs/replay.md) follow rollouts.jsonl: one per rollout, none lost, none twice
    replay_records = _lines(out / "records.jsonl")
    assert sorted(str(r["rollout_id"]) for r in replay_records) == sorted(ids)
    assert all(r["commands"] and r["requests"] for r in replay_records)
    superseded = [t for t in traces if not t["final"]]  # attempts of re-run groups the kill cut short
    assert all(t.get("superseded") == "resume" and str(t["group"]) not in finished for t in superseded)
    for t in finals:  # a re-run member is numbered after its superseded attempts
        before = [int(s["attempt"]) for s in superseded if (s["task"], s["sample"]) == (t["task"], t["sample"])]  # type: ignore[call-overload]
        assert int(t["attempt"]) == max(before, default=0) + 1  # type: ignore[call-overload]
    # the killed run's sandboxes were reaped by the resumed one: no marker, no process left
    assert [p.name for p in (tmp_path / "state").glob("sf-*")] == []


@pytest.mark.slow
def test_sigterm_writes_summary_of_what_is_done(tmp_path: Path, env: dict[str, str], model: FakeModelServer) -> None:
    tasks = _tasks(tmp_path / "tasks", ["a", "b", "c", "d"])
    out = tmp_path / "out"
    proc = subprocess.Popen(_argv(tasks, out, model=model), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        _wait_for(lambda: len(_lines(out / "rollouts.jsonl")) >= 2, 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert 2 <= summary["n_rollouts"] < 8 and summary["n_rollouts"] == len(_lines(out / "rollouts.jsonl"))
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # no temp file left
    assert "Traceback" not in err
    assert [p.name for p in (tmp_path / "state").glob("sf-*")] == []  # every sandbox closed


def test_an_unreachable_model_url_fails_up_front(tmp_path: Path, env: dict[str, str]) -> None:
    """Nothing at --model-url: one line, exit 1, no rollout run (not every rollout failing on it)."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tasks = _tasks(tmp_path / "tasks", ["a"])
    out = tmp_path / "out"
    argv = _argv(tasks, out)[:-2] + ["--agent", "openai", "--model-url", f"http://127.0.0.1:{port}"]
    r = _run(argv, env)
    assert r.returncode == 1, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and f"--model-url http://127.0.0.1:{port}: nothing answers there" in errors[0], r.stderr
    assert "no rollout was started" in errors[0]
    assert not (out / "rollouts.jsonl").exists()
