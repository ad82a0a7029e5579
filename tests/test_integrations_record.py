"""The trainers' integrations write the record (issue 45): with ``SANDFLEET_RECORD_DIR`` (here
``Settings(record_dir=...)``) every rollout of TRL's reward and of Miles' ``run`` appends its
record to that folder's ``records.jsonl``, and ``sandfleet replay FOLDER`` runs it again: a
reward seen in training, replayed from the training run's output. No TRL or torch: TRL's
reward is called as GRPOTrainer calls it; Miles' session server is the scripted fake."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandfleet.errors import ConfigError
from sandfleet.integrations import miles
from sandfleet.integrations._common import Settings
from sandfleet.integrations.trl import Runner, SandfleetReward
from sandfleet.rollout.record import read_records, sha
from sandfleet.tasks.generate import generate
from sandfleet.testing.fake_server import FakeModelServer
from test_rollout_support import make_task, needs_bwrap

pytestmark = needs_bwrap()

PROMPT = [{"role": "system", "content": "You are a careful agent."},
          {"role": "user", "content": "Write the word hello into /app/out.txt."}]


def replay(folder: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "sandfleet", "replay", str(folder), "--json", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


async def test_trl_reward_records_and_replays(tmp_path: Path) -> None:
    made = generate("bash-basics", tmp_path / "g", n=2, seed=5, templates=("count-lines",))
    task = next(g.path for g in made if g.split == "train")
    out = tmp_path / "trl-run"  # the trainer's output_dir
    reward = SandfleetReward(runner=Runner(settings=Settings(backend="bwrap", record_dir=str(out)), cpus=0.5))
    completions = ["```bash\nwc -l < notes.txt > count.txt\n```", "```bash\necho 0 > count.txt\n```"]
    values = await reward(completions=completions, sandfleet_task=[str(task)] * 2)
    assert values == [1.0, 0.0]
    records = read_records(out / "records.jsonl")
    assert sorted(r["result"]["reward"] for r in records) == [0.0, 1.0]
    assert len({r["rollout_id"] for r in records}) == 2 and all(r["mode"] == "commands" for r in records)
    assert all(r["commands"][0]["command"].endswith("count.txt") for r in records)
    rc, report, err = replay(out)
    s = report["summary"]
    assert rc == 0 and (s["rollouts"], s["identical"], s["same_reward"]) == (2, 2, 2), (report, err)
    assert sorted(r["reward"]["replayed"] for r in report["rollouts"]) == [0.0, 1.0]


@pytest.mark.parametrize("mode", ["commands", "full"])
async def test_miles_run_records_and_replays_its_session(tmp_path: Path, mode: str) -> None:
    task = make_task(tmp_path / "tasks")
    out = tmp_path / "miles-run"
    settings = Settings(backend="bwrap", record_dir=str(out), record=mode)
    script = [{"bash": "cd /app"}, {"tool_calls": ["echo hel > x", "echo hello > out.txt"]}, "Done."]
    with FakeModelServer(script, strict_sessions=True) as server:
        got = await miles.run(server.session_url("rollout-1"), PROMPT, {"temperature": 0.7, "max_tokens": 64},
                              {"sandfleet_task": str(task.path)}, settings=settings)
        assert server.rejections == []
    assert got["reward"] == 1.0
    (record,) = read_records(out / "records.jsonl")
    assert record["policy"]["class"] == "SessionPolicy" and record["policy"]["args"] == {"prompt": PROMPT}
    assert len(record["requests"]) == 3 and len(record["commands"]) == 3
    assert record["rollout_id"].startswith(f"{task.name}#0-")  # one of its own in the run's folder
    rc, report, err = replay(out)  # no model server: the replay answers from the record
    (row,) = report["rollouts"]
    assert rc == 0 and row["status"] == "identical" and row["same_reward"], (report, err)
    assert row["commands"] == row["commands_identical"] == 3
    # the trainer's prompt is part of what is compared: another one diverges at the first request
    record["policy"]["args"]["prompt"][1]["content"] = "Write hello."
    record["head"]["policy"] = sha(record["policy"])  # made consistent: not refused as edited
    (out / "records.jsonl").write_text(json.dumps(record) + "\n")
    rc, report, err = replay(out)
    (row,) = report["rollouts"]
    assert row["status"] == "diverged" and row["diverged_at"]["turn"] == 1, report
    assert "message 2 (user) differs" in row["diverged_at"]["what"]


def test_record_settings_from_the_environment() -> None:
    env = {"SANDFLEET_RECORD_DIR": "/tmp/x", "SANDFLEET_RECORD": "full"}
    s = Settings.from_env(env)
    assert (s.record_dir, s.record, s.record_mode) == ("/tmp/x", "full", "full")
    assert Settings.from_env({}).record_mode == "none"
    with pytest.raises(ConfigError, match="unknown record mode 'some'"):
        Settings.from_env({"SANDFLEET_RECORD_DIR": "/tmp/x", "SANDFLEET_RECORD": "some"})
