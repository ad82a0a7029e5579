"""Exactly once, for replay (issue 45): a ``sandfleet replay --out D`` SIGKILLed at random points,
each time resumed with ``--resume``, ends with every recorded rollout replayed and counted
exactly once: one row in ``replays.jsonl`` (the journal), one in ``replay.json``, one record
in the replays' ``records.jsonl``, and nothing left on the host.

Real runs: an oracle run of 12 tasks x 2 samples (a second each) on bwrap (host image), recorded, then replayed
at 4 at once. The seed is printed; SANDFLEET_CHAOS_SEED replays one.
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

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

NAMES = [f"r{i}" for i in range(12)]
N = 2
KILLS = 6


def _tasks(root: Path) -> Path:
    for name in NAMES:
        folder = root / name
        for sub in ("environment", "solution", "tests"):
            (folder / sub).mkdir(parents=True)
        (folder / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60\n[verifier]\ntimeout_sec = 30\n')
        (folder / "instruction.md").write_text("Say hello.\n")
        (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
        (folder / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 1\necho hello | tee /tmp/said\n")
        (folder / "tests" / "test.sh").write_text(
            "#!/bin/bash\nif grep -qx hello /tmp/said; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
    return root


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _mentions(p: Path, text: str) -> bool:
    try:
        return text.encode() in (p / "cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.waits  # 23 s of wall, 4 s of CPU (scripts/test.sh: the waits lane, beside the fast pass)
def test_replay_sigkilled_at_random_points_counts_each_rollout_once(tmp_path: Path) -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    seed = int(os.environ.get("SANDFLEET_CHAOS_SEED") or random.randrange(1 << 30))
    print(f"seed {seed}")
    rng = random.Random(seed)
    state = Path(tempfile.mkdtemp(prefix="sandfleet-test-rr-", dir="/run"))  # (bwrap must reach it: not tmp_path)
    state.chmod(0o711)
    parent = f"sf-test-rr-{os.getpid()}"
    try:
        _kill_and_resume(tmp_path, state, parent, rng)
    finally:
        shutil.rmtree(state, ignore_errors=True)
        from sandfleet.sandbox import cgroups

        for root in set(cgroups.detect().mounts.values()):  # the replays' cgroup parent, empty by now
            d = root / parent
            if d.is_dir():
                d.rmdir()


def _kill_and_resume(tmp_path: Path, state: Path, parent: str, rng: random.Random) -> None:
    env = {**os.environ, "SANDFLEET_STATE": str(state), "SANDFLEET_CGROUP_PARENT": parent}
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "sandfleet", "run", "--tasks", str(_tasks(tmp_path / "tasks")),
                    "--backend", "bwrap", "--image", "host", "-n", str(N), "--agent", "oracle", "--out", str(run)],
                   env=env, check=True, capture_output=True, timeout=600)
    expected = {f"{t}#{i}" for t in NAMES for i in range(N)}
    assert {str(r["rollout_id"]) for r in _lines(run / "records.jsonl")} == expected
    out = tmp_path / "replay"
    argv = [sys.executable, "-m", "sandfleet", "replay", str(run), "--out", str(out), "--concurrency", "4", "--json"]
    kills: list[float] = []
    journal_rows: list[int] = []
    for k in range(100):
        proc = subprocess.Popen([*argv, *(["--resume"] if k else [])], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        at = rng.uniform(1.5, 6.0)  # (a sitting takes 2-3 s to start its first sandbox here)
        try:
            proc.wait(at)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode in (-9, 0), err.decode()[-2000:]
        journal_rows.append(max(0, len(_lines(out / "replays.jsonl")) - 1) if (out / "replays.jsonl").exists() else 0)
        if proc.returncode == 0:
            break  # it got through before its kill
        kills.append(round(at, 2))
        if len(kills) >= KILLS:
            break
    final = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    print(f"{len(kills)} kills (seconds after the start) {kills}; rows in the journal after each: {journal_rows}")
    assert final.returncode == 0, final.stderr[-3000:]
    report = json.loads(final.stdout)
    assert report == json.loads((out / "replay.json").read_text())
    s = report["summary"]
    assert (s["rollouts"], s["same_reward"], s["identical"], s["refused"]) == (len(expected),) * 3 + (0,), s
    assert Counter(r["rollout_id"] for r in report["rollouts"]) == Counter({i: 1 for i in expected})
    journal = _lines(out / "replays.jsonl")
    assert journal[0]["replay_journal"] == 1
    assert Counter(r["rollout_id"] for r in journal[1:]) == Counter({i: 1 for i in expected})  # none twice
    assert Counter(r["rollout_id"] for r in _lines(out / "records.jsonl")) == Counter({i: 1 for i in expected})
    if kills:
        assert s["resumed"] == journal_rows[-1]  # the last sitting took those from the journal
    # the killed sittings' sandboxes were reaped by the sittings after them
    assert [p.name for p in state.glob("sf-*")] == []
    assert not sandbox_cgroups(parent)
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(tmp_path))]
