"""sandfleet.integrations.verl_tree without verl (issue 44): the groups an agent loop worker
opens, the leaf a row claims, and the AgentLoopOutput fields of a real branched group grown with
the shipped scripted token engine in real sandboxes. verl's own classes and the estimator are
tested in verl (tests/test_verl_tree.py, scripts/test-integrations.sh verl)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from sandfleet.errors import ConfigError
from sandfleet.integrations._common import Runner, Settings
from sandfleet.integrations._tokens import TokenModel, TreeAgent, grow_group
from sandfleet.integrations.verl_tree import TOKENS_KEY, TreeGroups, leaf_fields, seed_of, task_of
from sandfleet.rollout.loop import AgentConfig
from sandfleet.rollout.tree import parse_branch
from sandfleet.sandbox.state import list_sandboxes
from sandfleet.tasks import load_task
from test_rollout_support import needs_bwrap

BRANCH = Path(__file__).resolve().parents[1] / "examples" / "branch"


def test_groups_are_claimed_row_by_row_and_a_split_group_is_refused() -> None:
    groups = TreeGroups()
    opened = groups.open(["a", "a", "a", "a", "b", "b", "b", "b"], expected=4)
    assert opened == ["a", "b"] and len(groups) == 2
    assert [groups.claim("a")[1] for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="all have taken their leaf"):
        groups.claim("a")
    with pytest.raises(ConfigError, match="agent_loop_manager_class=sandfleet.integrations.verl_tree"):
        groups.claim("c")  # a row whose worker is verl's own: no group open
    with pytest.raises(ConfigError, match="already being generated"):
        groups.open(["b"])
    groups.close(opened)
    assert len(groups) == 0
    # verl chunks the batch between its workers: a group cut in two is two tree sets, refused
    with pytest.raises(ConfigError, match=r"group x has 2 of its 4 rows .* multiple of actor_rollout_ref"):
        groups.open(["y", "y", "y", "y", "x", "x"], expected=4)
    assert len(groups) == 0  # nothing half-opened


def test_a_row_names_its_task_in_extra_info() -> None:
    assert task_of({"extra_info": {"sandfleet_task": "t1"}, "uid": "u"}) == "t1"
    assert task_of({"sandfleet_task": "t2"}) == "t2"
    with pytest.raises(ConfigError, match=r"extra_info\['sandfleet_task'\]"):
        task_of({"extra_info": {"index": 3}, "raw_prompt": []})
    assert seed_of("u1") == seed_of("u1") != seed_of("u2")


@needs_bwrap()
async def test_a_grown_group_answers_each_row_its_leaf_with_per_token_tree_advantages() -> None:
    from sandfleet.testing.token_engine import CharEngine

    task = load_task(BRANCH / "tasks" / "branch-demo")
    script = json.loads((BRANCH / "script.json").read_text())
    prompt = [{"role": "user", "content": (BRANCH / "tasks" / "branch-demo" / "instruction.md").read_text()}]
    plan = parse_branch("2:4")
    engine = CharEngine(script)
    model = TokenModel(engine)
    config = AgentConfig(tool_mode="text", max_turns=3)
    rows = await grow_group(Runner(settings=Settings(backend="bwrap")), task, prompt, plan, 1, model,
                            lambda k: TreeAgent("", prompt, model=model, request_kwargs={"seed": 7}, config=config))
    assert len(rows) == 4 and sorted(r.reward for r in rows) == [0.0, 0.0, 1.0, 1.0]  # type: ignore[type-var]
    assert len(engine.requests) == 2 + 4  # the prefix's two turns once, the third per leaf
    full = leaf_fields(rows[0], 100_000)
    assert full["response_ids"] == rows[0].completion_ids and full["response_mask"] == rows[0].env_mask
    assert full["reward_score"] == rows[0].reward and full["num_turns"] == 7
    per = full["extra_fields"][TOKENS_KEY]
    assert len(per) == len(full["response_ids"])
    mean = 0.5
    assert {a for a, m in zip(per, full["response_mask"], strict=True) if m} == {0.0, rows[0].reward - mean}
    info = full["extra_fields"]["sandfleet"]
    assert info["verdict"] == "scored" and info["tree"]["node_id"].startswith("0.") and not info["cut"]
    assert info["tree_advantages"] == [0.0, 0.0, rows[0].reward - mean]
    # cut at verl's response_length: tokens, mask and advantages alike
    cut = leaf_fields(rows[1], 50)
    assert len(cut["response_ids"]) == len(cut["response_mask"]) == len(cut["extra_fields"][TOKENS_KEY]) == 50
    assert cut["extra_fields"]["sandfleet"]["cut"]
    # a masked leaf (an infra fault: reward None) trains nothing and scores 0
    rows[2].reward = None
    masked = leaf_fields(rows[2], 100_000)
    assert set(masked["response_mask"]) == {0} and masked["reward_score"] == 0.0
    assert set(masked["extra_fields"][TOKENS_KEY]) == {0.0}
    await asyncio.sleep(0)
    assert [m for m in list_sandboxes() if m.get("owner_pid") == os.getpid()] == []
