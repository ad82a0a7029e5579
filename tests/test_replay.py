"""Replay (issue 45): runs recorded on bwrap, replayed from records.jsonl in fresh sandboxes,
compared command by command; edited records and edited tasks told apart before anything runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandfleet.rollout import RunConfig, ScriptedPolicy, run_suite
from sandfleet.rollout.loop import OpenAIPolicy
from sandfleet.rollout.record import image_digest, item_sha, read_records
from sandfleet.rollout.replay_run import replay_run
from sandfleet.testing.scripted_model import ScriptedModel
from test_rollout_support import make_task, needs_bwrap

pytestmark = needs_bwrap()

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks"
ORACLE_TASKS = ("csv-awk-aggregate", "jq-json-summary", "shell-quoting-bug")


def sandfleet(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "sandfleet", *map(str, args)], capture_output=True, text=True,
                          timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"sandfleet {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three bundled tasks (copied), one oracle rollout each, recorded with the default mode."""
    root = tmp_path_factory.mktemp("oracle")
    for name in ORACLE_TASKS:
        shutil.copytree(EXAMPLES / name, root / "tasks" / name)
    sandfleet("run", "--tasks", root / "tasks", "--agent", "oracle", "-n", "1", "--backend", "bwrap",
              "--out", root / "run")
    return root


def replay_json(run_dir: Path, *args: str | Path) -> tuple[int, dict[str, Any]]:
    proc = sandfleet("replay", run_dir, "--json", *args, check=False)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_oracle_run_replays_identical(oracle_run: Path) -> None:
    records = read_records(oracle_run / "run" / "records.jsonl")
    assert sorted(r["task"] for r in records) == sorted(ORACLE_TASKS)
    assert all(r["mode"] == "commands" and r["commands"] and r["image"]["digest"] for r in records)
    rc, report = replay_json(oracle_run / "run", "--out", oracle_run / "replay")
    assert rc == 0, report
    assert json.loads((oracle_run / "replay" / "replay.json").read_text()) == report
    html = (oracle_run / "replay" / "report.html").read_text()
    assert html.count("<h2 class=identical>") == 3 and "csv-awk-aggregate#0" in html
    assert len(read_records(oracle_run / "replay" / "records.jsonl")) == 3  # a replay can be replayed
    s = report["summary"]
    assert (s["rollouts"], s["same_reward"], s["identical"], s["drifted"], s["diverged"]) == (3, 3, 3, 0, 0)
    for row in report["rollouts"]:
        assert row["same_reward"] and row["diverged_at"] is None
        assert row["commands"] == row["commands_identical"] >= 1
        assert row["verifier"]["exit_code"] == "same"
        assert row["verifier"]["output"] in ("same", "same after normalizers")  # pytest: "passed in 0.27s"


def test_edited_test_file_is_refused_naming_it(oracle_run: Path, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    shutil.copytree(oracle_run / "tasks", tasks)
    test_file = tasks / "jq-json-summary" / "tests" / "test_outputs.py"
    test_file.write_text(test_file.read_text() + "\n# loosened afterwards\n")
    rc, report = replay_json(oracle_run / "run", "--tasks", tasks, "--rollout", "jq-json-summary#0")
    assert rc == 1
    assert report["summary"]["rollouts"] == 0 and report["summary"]["refused"] == 1
    (why,) = report["refused"][0]["why"]
    assert "test file tests/test_outputs.py was edited" in why
    proc = sandfleet("replay", oracle_run / "run", "--tasks", tasks, "--rollout", "jq-json-summary#0", check=False)
    assert proc.returncode == 1 and "refused jq-json-summary#0: test file tests/test_outputs.py" in proc.stderr


def test_edited_task_file_or_other_image_is_refused_before_anything_runs(oracle_run: Path, tmp_path: Path) -> None:
    tasks, run = tmp_path / "tasks", tmp_path / "run"
    shutil.copytree(oracle_run / "tasks", tasks)
    shutil.copytree(oracle_run / "run", run)
    (tasks / "csv-awk-aggregate" / "instruction.md").write_text("Do something else.\n")
    records = read_records(run / "records.jsonl")
    other = next(r for r in records if r["task"] == "shell-quoting-bug")
    other["image"] = {"ref": "host", "digest": image_digest("host")}  # another image, made to look consistent
    other["spec"]["image"] = "host"
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rc, report = replay_json(run, "--tasks", tasks)
    assert rc == 1
    s = report["summary"]
    assert (s["rollouts"], s["refused"], s["identical"]) == (1, 2, 1)  # jq-json-summary still replays
    why = {r["rollout_id"]: r["why"] for r in report["refused"]}
    assert any("task file instruction.md was edited" in w for w in why["csv-awk-aggregate#0"])
    assert "the record's image was changed after recording" in why["shell-quoting-bug#0"]
    assert "the record's spec was changed after recording" in why["shell-quoting-bug#0"]


def test_changed_command_output_in_the_record_diverges_at_its_turn(oracle_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(oracle_run / "run", run)
    records = read_records(run / "records.jsonl")
    target = next(r for r in records if r["task"] == "csv-awk-aggregate")
    target["commands"][0]["output"] = "region,orders\nnowhere,0\n"  # edited, its digest left as it was
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = sandfleet("replay", run, "--rollout", "csv-awk-aggregate#0", check=False)
    assert proc.returncode == 1
    assert "tampered csv-awk-aggregate#0: commands[0] (turn 1)" in proc.stderr  # said before anything ran
    assert "tampered: commands[0] (turn 1)" in proc.stdout  # and in the report
    rc, report = replay_json(run, "--rollout", "csv-awk-aggregate#0")
    (row,) = report["rollouts"]
    assert row["status"] == "diverged" and row["diverged_at"]["turn"] == 1
    assert "changed after recording" in row["diverged_at"]["what"]


SCRIPT = [
    {"bash": "date +%T.%N; echo step one"},
    {"bash": "echo hel > /tmp/part"},
    {"bash": "echo \"$(cat /tmp/part)lo\" > /app/out.txt; cat /app/out.txt"},
    "Done.",
]


async def scripted_run(tmp_path: Path, mode: str) -> Path:
    task = make_task(tmp_path / "tasks")
    out = tmp_path / f"run-{mode}"
    policy = OpenAIPolicy(model=ScriptedModel(SCRIPT))
    report = await run_suite([task], policy, RunConfig(backend="bwrap", record=mode), out_dir=out)
    assert report.results[0].reward == 1.0 and report.results[0].turns == 4
    return out


@pytest.mark.parametrize("mode", ["commands", "full"])
async def test_multi_turn_scripted_model_replays(tmp_path: Path, mode: str) -> None:
    out = await scripted_run(tmp_path, mode)
    (record,) = read_records(out / "records.jsonl")
    assert len(record["requests"]) == 4 and len(record["commands"]) == 3
    assert ("new_messages" in record["requests"][1]) == (mode == "full")
    report = await replay_run(out)
    s = report.summary()
    assert (s["identical"], s["same_reward"], s["diverged"]) == (1, 1, 0), report.rollouts
    (row,) = report.rollouts
    assert row["command_rows"][0]["output"] == "same after normalizers"  # date(1) differs, normalized
    # without the dates normalizer the second request's tool message differs: the replay stops there
    strict = await replay_run(out, normalizers=("durations", "temp_names", "pids"))
    (row,) = strict.rollouts
    assert row["status"] == "diverged" and row["diverged_at"]["turn"] == 2
    assert "message 4 (tool) differs" in row["diverged_at"]["what"]
    assert row["commands_identical"] == 0 and row["command_rows"][1].get("ran") is False


async def test_changed_model_reply_diverges_at_that_turn(tmp_path: Path) -> None:
    out = await scripted_run(tmp_path, "commands")
    path = out / "records.jsonl"
    (record,) = read_records(path)
    reply = record["requests"][1]["reply"]["message"]["tool_calls"][0]["function"]
    reply["arguments"] = json.dumps({"command": "echo bye > /tmp/part"})
    path.write_text(json.dumps(record) + "\n")  # edited, its digest left as it was
    (row,) = (await replay_run(out)).rollouts
    assert row["tampered"] and row["status"] == "diverged"
    assert row["diverged_at"]["turn"] == 2 and "reply to request 2" in row["diverged_at"]["what"]
    # the same edit with its digest made again: the reply is answered, and the command it asks
    # for is not the recorded one: the replay stops before running it
    record["requests"][1]["sha"] = item_sha(record["requests"][1])
    path.write_text(json.dumps(record) + "\n")
    (row,) = (await replay_run(out)).rollouts
    assert not row["tampered"] and row["status"] == "diverged"
    assert row["diverged_at"] == {"turn": 2, "what": "command 2 is `echo bye > /tmp/part`, recorded "
                                                    "`echo hel > /tmp/part`"}
    assert [c.get("ran", True) for c in row["command_rows"]] == [True, False, False]


async def test_repeat_reports_the_reward_flip_rate(tmp_path: Path) -> None:
    out = await scripted_run(tmp_path, "commands")
    report = await replay_run(out, repeat=2)
    s = report.summary()
    assert s["repeat"] == 2 and s["reward_flip_rate"] == 0.0
    assert [r["reward"] for r in report.rollouts[0]["replays"]] == [1.0, 1.0]


async def test_until_turn_stops_the_policy_there_and_still_scores(tmp_path: Path) -> None:
    out = await scripted_run(tmp_path, "commands")
    report = await replay_run(out, until_turn=2)
    (row,) = report.rollouts
    assert row["status"] == "identical" and row["diverged_at"] is None
    assert row["commands"] == row["commands_identical"] == 2  # the commands of turns 1 and 2
    assert row["reward"] == {"recorded": 1.0, "replayed": 0.0}  # /app/out.txt is written at turn 3
    assert row["verifier"]["exit_code"] == "same"
    (replayed,) = report.records
    assert replayed["result"]["stop_reason"] == "until_turn" and len(replayed["commands"]) == 2


async def test_stop_before_verifier_compares_the_commands_only(tmp_path: Path) -> None:
    out = await scripted_run(tmp_path, "commands")
    report = await replay_run(out, stop_before_verifier=True)
    (row,) = report.rollouts
    assert row["status"] == "identical" and row["commands_identical"] == 3
    assert row["reward"]["replayed"] is None and row["verifier"] is None  # the tests never ran
    (replayed,) = report.records
    assert replayed["verifier"]["exit_code"] is None


async def test_scripted_policy_replays_in_one_shell(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks")
    out = tmp_path / "run"
    policy = ScriptedPolicy(["cd /tmp && X=hel", "cd /app; echo ${X}lo > out.txt; echo $$ $PPID", "exit 3"])
    report = await run_suite([task], policy, RunConfig(backend="bwrap"), out_dir=out)
    assert report.results[0].reward == 1.0
    (record,) = read_records(out / "records.jsonl")
    assert record["policy"] == {"name": "scripted", "class": "ScriptedPolicy", "commands": policy.commands}
    assert [c["exit_code"] for c in record["commands"]] == [0, 0, 3]
    (row,) = (await replay_run(out)).rollouts
    assert row["status"] == "identical" and row["commands_identical"] == 3, row
