"""Exactly once: a ``sandfleet run`` SIGKILLed at 20 random points, each time resumed with
``--resume``, ends with every (task, sample) exactly once: one row in ``rollouts.jsonl``,
one ``final: true`` row in ``trace.jsonl``, every other attempt ``final: false`` and numbered
after the ones before it (superseded by a resume: ``superseded: "resume"``), every group's
statistics once, and nothing left on the host.

Real runs: the bwrap backend on the host image, the openai agent against a scripted model
server on loopback (its first requests answer 500, so some rollouts are retried), tasks
whose verifier writes reward 1. The seed is printed; SANDFLEET_CHAOS_SEED replays one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from conftest import backend_skip, sandbox_cgroups
from sandfleet.testing.fake_server import FakeModelServer

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

NAMES = [f"t{i}" for i in range(8)]
N = 2
KILLS = 20


def _tasks(root: Path) -> Path:
    for name in NAMES:
        folder = root / name
        for sub in ("environment", "solution", "tests"):
            (folder / sub).mkdir(parents=True)
        (folder / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n')
        (folder / "instruction.md").write_text("Say hello.\n")
        (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
        (folder / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello\n")
        (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.waits  # 70 s of wall, 30 s of CPU (scripts/test.sh: the waits lane, beside the fast pass)
def test_sigkilled_at_20_random_points_each_rollout_counts_once(tmp_path: Path) -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    seed = int(os.environ.get("SANDFLEET_CHAOS_SEED") or random.randrange(1 << 30))
    print(f"seed {seed}")
    rng = random.Random(seed)
    state = Path(tempfile.mkdtemp(prefix="sandfleet-test-eo-", dir="/run"))  # (bwrap must reach it: not tmp_path)
    state.chmod(0o711)
    try:
        _kill_and_resume(tmp_path, state, rng)
    finally:
        shutil.rmtree(state, ignore_errors=True)
        from sandfleet.sandbox import cgroups

        for root in set(cgroups.detect().mounts.values()):  # the runs' cgroup parent, empty by now
            d = root / f"sf-test-eo-{os.getpid()}"
            if d.is_dir():
                d.rmdir()


def _meta(sdir: Path) -> str:
    """A leftover sandbox's marker, and whether its owner and its processes still run."""
    try:
        meta = json.loads((sdir / "meta.json").read_text())
    except (OSError, ValueError) as e:
        return f"no readable meta.json ({e}); files {sorted(p.name for p in sdir.iterdir())}"
    alive = {pid: Path(f"/proc/{pid}").exists() for pid in [meta.get("owner_pid"), *meta.get("pids", [])]
             if isinstance(pid, int)}
    return f"{json.dumps(meta)[:600]} alive {alive}"


def _kill_and_resume(tmp_path: Path, state: Path, rng: random.Random) -> None:
    tasks = _tasks(tmp_path / "tasks")
    env = {**os.environ, "SANDFLEET_STATE": str(state), "SANDFLEET_CGROUP_PARENT": f"sf-test-eo-{os.getpid()}"}
    script = [{"bash": "sleep 0.2", "delay_s": 0.3}, "Done."]
    kills: list[tuple[int, float]] = []
    rounds = 0
    with FakeModelServer(script, faults=["500"] * 3) as model:
        while len(kills) < KILLS:  # a run is killed until it gets through; then a new one
            out = tmp_path / f"out{rounds}"
            argv = [sys.executable, "-m", "sandfleet", "run", "--tasks", str(tasks), "--backend", "bwrap",
                    "--image", "host", "-n", str(N), "--concurrency", "4", "--attempts", "2", "--out", str(out),
                    "--agent", "openai", "--model-url", model.url]
            model.faults.extend(["500"] * 3)  # (retried attempts in every run)
            for k in range(100):
                proc = subprocess.Popen([*argv, *(["--resume"] if k else [])], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                at = rng.uniform(0.3, 4.5)
                try:
                    proc.wait(at)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGKILL)
                _, err = proc.communicate(timeout=30)
                assert proc.returncode in (-9, 0, 1), err.decode()[-2000:]
                if proc.returncode != -9:
                    break
                kills.append((rounds, round(at, 2)))
                if len(kills) >= KILLS:
                    break
            final = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=300)
            assert final.returncode in (0, 1), (out / "summary.json").read_text()[:3000] + final.stderr[-3000:]
            _check(out)
            rounds += 1
    print(f"{len(kills)} kills (run, seconds after its start) in {rounds} runs: {kills}")
    # the killed runs' sandboxes were reaped by the runs after them: no marker, no cgroup, no process
    # (seen once, not reproduced: five markers left; what they say decides whose they were)
    assert [p.name for p in state.glob("sf-*")] == [], (
        f"kills {kills}; last run's stderr: {final.stderr[-2000:]}; markers: "
        + "; ".join(f"{p.name}: {_meta(p)}" for p in state.glob("sf-*")))
    assert not sandbox_cgroups(f"sf-test-eo-{os.getpid()}")
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(tmp_path))]


def _check(out: Path) -> None:
    """Every (task, sample) exactly once, its attempts recorded and numbered once each."""
    records = _lines(out / "rollouts.jsonl")
    assert Counter((r["task"], r["sample"]) for r in records) == Counter(
        {(t, i): 1 for t in NAMES for i in range(N)})  # none lost, none twice
    for r in records:  # (two of the model's 500s may hit one rollout: --attempts 2)
        assert r["final"] is True and ((r["status"], r["reward"]) == ("completed", 1.0)
                                       or (r["reason"], r["attempt"]) == ("model_http_500", 2)), r
    traces = _lines(out / "trace.jsonl")
    by_key: dict[tuple[object, object], list[dict[str, object]]] = {}
    for t in traces:
        by_key.setdefault((t["task"], t["sample"]), []).append(t)
    assert set(by_key) == {(t, i) for t in NAMES for i in range(N)}
    for key, rows in by_key.items():
        assert sum(r["final"] is True for r in rows) == 1, rows
        numbers = sorted(int(r["attempt"]) for r in rows)  # type: ignore[call-overload]
        assert numbers == list(range(1, len(rows) + 1)), (key, numbers)  # attempts recorded, each once
        last = max(rows, key=lambda r: int(r["attempt"]))  # type: ignore[call-overload]
        assert last["final"] is True
        assert {r["rollout_id"] for r in rows if r["final"]} == {
            r["rollout_id"] for r in records if (r["task"], r["sample"]) == key}
    groups = _lines(out / "groups.jsonl")
    assert sorted(str(g["group"]) for g in groups) == sorted(NAMES)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_rollouts"] == len(NAMES) * N and summary["n_attempts"] == len(traces)
    assert summary["interrupted"] is False
    print(f"{out.name}: {len(traces)} attempts for {len(records)} rollouts, "
          f"{sum(t.get('superseded') == 'resume' for t in traces)} superseded by a resume")


def _mentions(p: Path, text: str) -> bool:
    try:
        return text.encode() in (p / "cmdline").read_bytes()
    except OSError:
        return False
