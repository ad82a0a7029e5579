"""sandfleet.integrations.trl without TRL or torch: the reward function and SandfleetBashEnv
drive real sandboxes over generated tasks, and close every one."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from sandfleet.integrations._common import Settings
from sandfleet.integrations.trl import HackMonitor, Runner, SandfleetBashEnv, SandfleetReward, extract_script
from sandfleet.rollout.result import RolloutResult
from sandfleet.sandbox.state import list_sandboxes
from sandfleet.tasks.generate import generate
from test_rollout_support import needs_bwrap

BWRAP = Settings(backend="bwrap")


def mine() -> list[dict[str, object]]:
    return [m for m in list_sandboxes() if m.get("owner_pid") == os.getpid()]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("bb") / "g"
    made = generate("bash-basics", out, n=2, seed=5, templates=("make-dirs", "count-lines", "write-text"))
    return {g.template: g.path for g in made if g.split == "train"}


def test_extract_script_takes_the_fenced_blocks_else_the_text() -> None:
    assert extract_script("Sure!\n```bash\nls -l\n```\nand\n```\necho hi\n```") == "ls -l\necho hi"
    assert extract_script("```sh\n$ mkdir a\n") == "mkdir a"  # unterminated fence, prompt sign dropped
    assert extract_script("  echo plain  \n") == "echo plain"


@needs_bwrap()
async def test_reward_runs_each_completion_in_its_own_sandbox(tasks: dict[str, Path]) -> None:
    got: list[RolloutResult] = []
    reward = SandfleetReward(runner=Runner(settings=BWRAP, cpus=0.5, on_result=got.append))
    dirs = [line for line in (tasks["make-dirs"] / "solution" / "solve.sh").read_text().splitlines()
            if line.startswith("mkdir")][0].split()[2:]  # fmt: skip
    completions = [
        [{"role": "assistant", "content": "```bash\nwc -l < notes.txt > count.txt\n```"}],  # right
        [{"role": "assistant", "content": "```bash\necho 0 > count.txt\n```"}],  # wrong
        "```bash\nmkdir -p " + dirs[0] + "\n```",  # one directory of several: partial credit
        "exit 3",
        "```python\nprint(1)\n```",  # run as bash: starts python, which must see EOF, not wait for input
    ]
    refs = [str(tasks["count-lines"])] * 2 + [str(tasks["make-dirs"])] * 3
    values = await reward(completions=completions, sandfleet_task=refs)
    assert values[:2] == [1.0, 0.0], [(r.status, r.error, r.verifier_output, r.info) for r in got]
    assert values[2] == pytest.approx(1 / len(dirs)) and 0 < values[2] < 1
    assert values[3:] == [0.0, 0.0]
    assert len(got) == 5 and len({r.sandbox_id for r in got}) == 5  # a fresh sandbox each
    py = next(r for r in got if "print(1)" in r.info["script"])
    assert py.duration < 10 and not any(s.get("timed_out") for s in py.spans)
    assert all(r.status == "completed" and r.to_trace()["spans"] for r in got)
    assert reward.last.rollouts == 5 and reward.last.wall_s > 0
    assert {r.info["script"] for r in got} >= {"wc -l < notes.txt > count.txt", "exit 3"}
    for r in got:
        assert r.spans and all(s["name"] != "model" for s in r.spans)
    assert mine() == []
    with pytest.raises(KeyError, match="sandfleet_task"):
        await reward(completions=["ls"])


@needs_bwrap()
async def test_monitor_flags_a_reward_the_oracle_disagrees_with(tasks: dict[str, Path]) -> None:
    from sandfleet.integrations._common import resolve_task

    task = resolve_task(str(tasks["count-lines"]))
    monitor = HackMonitor(Runner(settings=BWRAP))
    assert await monitor.check(task, "wc -l < notes.txt > count.txt", 1.0) is None  # agrees, reruns the same
    flag = await monitor.check(task, "n=$(wc -l < notes.txt); echo \"  $n\" > count.txt", 1.0)
    assert flag is not None and flag["flags"] == ["oracle_disagrees"]  # the verifier forgives the spaces
    flag = await monitor.check(task, "echo 0 > count.txt", 1.0)  # a reward the re-run does not give
    assert flag is not None and "rerun_lower" in flag["flags"]
    assert await monitor.check(task, "true", 0.0) is None
    oracles = []
    monitor = HackMonitor(Runner(settings=BWRAP, on_result=oracles.append))
    await asyncio.gather(*(monitor.check(task, "wc -l < notes.txt > count.txt", 1.0) for _ in range(3)))
    assert sum(r.info.get("monitor") == "oracle" for r in oracles) == 1  # one oracle run, shared
    assert mine() == []


@needs_bwrap()
async def test_monitor_flags_a_rewarded_workdir_holding_a_conftest(tasks: dict[str, Path]) -> None:
    from sandfleet.integrations._common import resolve_task

    task = resolve_task(str(tasks["count-lines"]))
    monitor = HackMonitor(Runner(settings=BWRAP))
    flag = await monitor.check(task, "wc -l < notes.txt > count.txt; echo 'import os' > conftest.py", 1.0)
    assert flag is not None and flag["flags"] == ["workdir_conftest"], flag  # the residual risk, flagged
    assert flag["rerun_reward"] == 1.0 and "conftest.py" in flag["risks"][0]
    # a virtual environment's .pth file and pytest configuration in the workdir: flagged too
    flag = await monitor.check(task, "wc -l < notes.txt > count.txt; python3 -m venv --without-pip .venv && "
                               "echo 'import os' > .venv/lib/$(ls .venv/lib)/site-packages/zz.pth && "
                               "printf '[pytest]\\naddopts = -p evil\\n' > pytest.ini", 1.0)
    assert flag is not None and flag["flags"] == ["workdir_pth", "workdir_tool_config"], flag
    assert mine() == []


@needs_bwrap()
def test_bash_env_scores_a_correct_command_and_closes_its_sandbox(tasks: dict[str, Path]) -> None:
    got: list[RolloutResult] = []
    SandfleetBashEnv.runner = Runner(settings=BWRAP, on_result=got.append)
    try:
        env = SandfleetBashEnv()
        path = tasks["write-text"]
        instruction = env.reset(sandfleet_task=str(path), prompt=[])
        assert instruction.startswith((path / "instruction.md").read_text().strip())
        live = mine()
        assert len(live) == 1
        solve = (path / "solution" / "solve.sh").read_text().split("cd /app\n")[1].strip()
        assert env.bash("pwd").strip() == "/app"
        assert "(no output, exit code 0)" in env.bash(solve)
        assert env.get_reward() == 1.0
        assert env.get_reward() == 1.0  # once: the verifier ran once
        assert mine() == []
        assert "episode has ended" in env.bash("ls")
        # a pooled instance is reset for the next row; an unscored episode is ended first
        env.reset(sandfleet_task=str(path))
        env.bash("echo wrong > " + solve.split("> ")[-1])
        env.reset(sandfleet_task=str(path))
        assert env.get_reward() == 0.0
        assert len(got) == 3 and [r.reward for r in got] == [1.0, 0.0, 0.0]
        assert got[0].commands == 2 and got[0].agent == "trl-bash-env"
        with pytest.raises(KeyError, match="sandfleet_task"):
            env.reset(prompt=[])
        env.reset(sandfleet_task=str(path))
        assert len(mine()) == 1
    finally:
        assert SandfleetBashEnv.close_all() >= 1
        SandfleetBashEnv.runner = None
    assert mine() == []
    assert not [t for t in threading.enumerate() if t.name == "sandfleet-bash-env"]


def test_bash_tool_has_the_google_docstring_trl_renders() -> None:
    import inspect

    doc = inspect.getdoc(SandfleetBashEnv.bash) or ""
    assert "Args:\n    command:" in doc and "Returns:" in doc
    public = [n for n, _ in inspect.getmembers(SandfleetBashEnv, predicate=inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["bash", "get_reward", "reset"]  # TRL makes every other public method a tool
    assert asyncio.iscoroutinefunction(SandfleetReward.__call__)


@needs_bwrap()
async def test_an_infra_fault_is_refilled_then_masked_as_none(tasks: dict[str, Path]) -> None:
    """A completion's sandbox killed from the host: run again in a fresh sandbox (same task and
    script) and scored; killed on every attempt: masked, and the reward function's value is
    None, TRL's own "can't score this completion"."""
    from sandfleet.integrations.trl import reward_of
    from sandfleet.rollout.runner import RetryPolicy
    from sandfleet.tasks import load_task
    from sandfleet.testing.faultpolicies import KillFromHost

    got: list[RolloutResult] = []
    runner = Runner(settings=BWRAP, on_result=got.append, retry=RetryPolicy(max_attempts=2, backoff_s=0.01))
    task = load_task(tasks["count-lines"])
    solve = KillFromHost(1, ["wc -l < notes.txt > count.txt"])
    result = await runner.rollout(task, solve)
    assert (result.verdict, result.attempt, reward_of(result)) == ("scored", 2, 1.0)
    assert [r.verdict for r in got] == ["infra_fault", "scored"]
    result = await runner.rollout(task, KillFromHost(2, ["wc -l < notes.txt > count.txt"]))
    assert (result.verdict, result.attempt, result.reward, reward_of(result)) == ("infra_fault", 2, None, None)
    assert result.fault and result.fault["cause"] == "sandbox_died"
    assert mine() == []


# -- trees (issue 44): a TRL rollout_func whose groups are branched rollouts
BRANCH = Path(__file__).resolve().parent.parent / "examples" / "branch"


def test_token_and_combined_advantages() -> None:
    from sandfleet.integrations.trl import combine_advantages, token_advantages

    # glue (turn 0) gets 0; a turn past the list, or a None value, 0
    assert token_advantages([1, 1, 0, 2, 2, 0, 3], [0.0, 0.5, None]) == [0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0]
    assert token_advantages([1, 2], None) == [0.0, 0.0]
    assert combine_advantages(1.5, [0.0, -0.5], "sum") == [1.5, 1.0]
    assert combine_advantages(1.5, [0.0, -0.5], "tree") == [0.0, -0.5]
    assert combine_advantages(1.5, [0.0, -0.5], "group") == [1.5, 1.5]
    with pytest.raises(ValueError, match="combine must be one of"):
        combine_advantages(0.0, [], "mean")


class _Trainer:  # what TreeRollout reads of a GRPOTrainer
    def __init__(self, n: int):
        self.num_generations = n


@needs_bwrap()
def test_tree_rollout_gives_trl_a_branched_group_with_tree_advantages() -> None:
    import json

    from sandfleet.integrations.trl import TreeRollout, tree_reward
    from sandfleet.testing.token_engine import CharEngine

    task = BRANCH / "tasks" / "branch-demo"
    script = json.loads((BRANCH / "script.json").read_text())
    prompt = [{"role": "user", "content": (task / "instruction.md").read_text()}]
    got: list[RolloutResult] = []
    engine = CharEngine(script)
    rollout = TreeRollout(engine, "2:4", [{"prompt": prompt, "sandfleet_task": str(task)}],
                          runner=Runner(settings=BWRAP, on_result=got.append))
    try:
        with pytest.raises(ValueError, match="multiple of it"):
            rollout([prompt] * 6, _Trainer(6))
        out = rollout([prompt] * 4, _Trainer(4))
        rows = rollout.rows
        assert len(out["completion_ids"]) == 4 and out["logprobs"] is None
        assert sorted(str((r.leaf.tree or {})["node_id"]) for r in rows if r.leaf) == ["0.0", "0.1", "0.2", "0.3"]
        rewards = out["sandfleet_reward"]
        assert tree_reward(sandfleet_reward=rewards) == rewards
        assert all(r.leaf is not None and r.leaf.status == "completed" for r in rows), [r.leaf for r in rows]
        assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]  # two children write 42, two 41
        mean = sum(rewards) / 4
        prefix = None
        for r, ids, mask, adv in zip(rows, out["completion_ids"], out["env_mask"], out["sandfleet_tree_advantages"],
                                     strict=True):  # fmt: skip
            assert len(ids) == len(mask) == len(adv)
            text = engine.decode([i for i, m in zip(ids, mask, strict=True) if m], skip_special=False)
            # the model's tokens: its three replies, as sampled; the commands' output is glue (mask 0)
            assert text.count("```bash") == 3 and "prefix-one" in text and "exit code" not in text
            glue = engine.decode([i for i, m in zip(ids, mask, strict=True) if not m], skip_special=False)
            assert "exit code: 0" in glue
            # turns 1 and 2 (the root's) 0; turn 3 the leaf's value minus the root's
            assert r.reward is not None and r.leaf is not None
            assert {a for a, m in zip(adv, mask, strict=True) if m} == {0.0, r.reward - mean}  # 0/1 over 4: exact
            assert sum(1 for a, m in zip(adv, mask, strict=True) if m and a) == len(engine.encode(
                "```bash\n" + script[2]["choices"][0]["bash"] + "\n```")) + 1  # turn 3's reply and its end token
            assert r.leaf.tree_advantages == [0.0, 0.0, r.reward - mean]
            # the prefix ran once and every leaf trains on the same prefix tokens
            cut = engine.decode(ids, skip_special=False).index("echo child")
            upto = next(k for k in range(len(ids)) if len(engine.decode(ids[:k], skip_special=False)) >= cut)
            prefix = prefix or ids[:upto]
            assert ids[:upto] == prefix and len(prefix) > 100
        assert len({req[1] for req in engine.requests[2:]}) == 4  # each child samples with a seed of its own
        assert len(engine.requests) == 2 + 4  # turns 1-2 once, turn 3 per child
        assert {r.leaf.to_trace()["agent"] for r in rows if r.leaf} == {"trl-tree"}  # the traces' name, kept
        assert len(got) == 4 and mine() == []

        # a tree whose agent stops before its split is one leaf: the rest are fillers TRL masks
        early = TreeRollout(engine, "5:2", [{"prompt": prompt, "sandfleet_task": str(task)}],
                            runner=Runner(settings=BWRAP))
        try:
            out = early([prompt] * 2, _Trainer(2))
        finally:
            early.close()
        assert out["sandfleet_reward"][1] is None and out["env_mask"][1] == [0]
        assert early.rows[0].leaf is not None and (early.rows[0].leaf.tree or {})["node_id"] == "0"
        assert mine() == []
    finally:
        rollout.close()


@needs_bwrap()
def test_a_reply_cut_inside_its_fence_still_runs_its_command() -> None:
    import json

    from sandfleet.integrations.trl import TreeRollout
    from sandfleet.rollout.loop import AgentConfig
    from sandfleet.testing.token_engine import CharEngine

    task = BRANCH / "tasks" / "branch-demo"
    script = json.loads((BRANCH / "script.json").read_text())
    prompt = [{"role": "user", "content": "go"}]
    # 31 tokens: "```bash\necho prefix-one > /app/" -- the fence is never closed
    rollout = TreeRollout(CharEngine(script), "1:2", [{"prompt": prompt, "sandfleet_task": str(task)}],
                          runner=Runner(settings=BWRAP),
                          agent_config=AgentConfig(tool_mode="text", max_turns=2, max_tokens_per_turn=31))
    try:
        rollout([prompt] * 2, _Trainer(2))
    finally:
        rollout.close()
    leaves = [r.leaf for r in rollout.rows]
    assert all(leaf is not None and leaf.commands == 2 and leaf.turns == 2 for leaf in leaves), leaves
    assert mine() == []
