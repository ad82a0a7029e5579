"""Miles' custom agent function, driven through the scripted server in strict-session mode."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from sandfleet.errors import ConfigError
from sandfleet.integrations import miles
from sandfleet.integrations._common import LIVE, Settings
from sandfleet.testing.fake_server import FakeModelServer
from sandfleet.testing.scripted_model import ScriptedModel
from sandfleet.traceschema import SPAN_NAMES
from test_rollout_model import ModelEndpoint, model_server  # noqa: F401  (the opt-in real-model fixture)
from test_rollout_support import make_task, needs_bwrap

BWRAP = Settings(backend="bwrap")
PROMPT = [{"role": "system", "content": "You are a careful agent."},
          {"role": "user", "content": "Write the word hello into /app/out.txt."}]


def test_strict_sessions_refuse_a_history_that_does_not_extend_the_last() -> None:
    with FakeModelServer([{"bash": "ls"}, "Done."], strict_sessions=True) as server, httpx.Client() as http:
        url = server.session_url("s1") + "/v1/chat/completions"
        first = [{"role": "user", "content": "hi"}]
        reply = http.post(url, json={"model": "m", "messages": first}).json()["choices"][0]["message"]
        assert reply["content"] is None and reply["tool_calls"]
        echoed = {k: v for k, v in reply.items() if v is not None}
        tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "x"}
        second = http.post(url, json={"model": "m", "messages": [*first, echoed, tool]})
        assert second.status_code == 200
        done = second.json()["choices"][0]["message"]
        # an edited assistant message, a dropped message, a restart: all refused
        edited = {**echoed, "tool_calls": [{**echoed["tool_calls"][0], "id": "other"}]}
        more = {"role": "user", "content": "go on"}
        assert http.post(url, json={"model": "m", "messages": [*first, edited, tool, done, more]}).status_code == 400
        assert http.post(url, json={"model": "m", "messages": first}).status_code == 400
        assert http.post(url, json={"model": "m", "messages": [*first, echoed, tool, done, more]}).status_code == 200
        assert len(server.rejections) == 2 and "message 1 differs" in server.rejections[0]
        # another session is a conversation of its own
        other = server.session_url("s2") + "/v1/chat/completions"
        assert http.post(other, json={"model": "m", "messages": first}).status_code == 200


@needs_bwrap()
async def test_run_solves_the_task_under_session_rules(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    script = [{"bash": "cd /app"}, {"tool_calls": ["echo hel > x", "echo hello > out.txt"]}, "Done."]
    with FakeModelServer(script, strict_sessions=True) as server:
        out = await miles.run(server.session_url("rollout-1"), PROMPT, {"temperature": 0.7, "max_tokens": 64},
                              {"sandfleet_task": str(task.path)}, settings=BWRAP)
        bodies = server.requests
    assert server.rejections == []
    assert out["reward"] == 1.0 and out["exit_status"] == "done"
    m = out["agent_metrics"]
    assert m["turns"] == 3 and m["commands"] == 3 and m["total_tool_time"] > 0
    assert m["prompt_tokens"] > 0 and m["completion_tokens"] > 0
    spans = out["sandfleet_spans"]
    assert {s["name"] for s in spans} <= set(SPAN_NAMES)
    assert sum(s["end"] - s["start"] for s in spans) == pytest.approx(m["wall_time"], abs=1e-6)
    # the trainer's prompt as given, its sampling settings in every request, full history
    assert bodies[0]["messages"] == PROMPT
    assert all(b["temperature"] == 0.7 and b["max_tokens"] == 64 for b in bodies)
    for before, after in zip(bodies, bodies[1:], strict=False):
        assert after["messages"][: len(before["messages"])] == before["messages"]
    assert json.dumps(out)  # all of it goes into Miles' sample metadata


@needs_bwrap()
async def test_run_with_a_model_passed_in(tmp_path: Path) -> None:
    """A trainer's in-process engine (here a ScriptedModel) answers in place of the session
    server: the same prompt, sampling settings, echoed history and outcome; no transport."""
    task = make_task(tmp_path)
    model = ScriptedModel([{"bash": "echo hello > /app/out.txt"}, "Done."])
    out = await miles.run("http://127.0.0.1:1", PROMPT, {"temperature": 0.7, "max_tokens": 64},
                          {"sandfleet_task": str(task.path)}, settings=BWRAP, model=model)
    assert out["reward"] == 1.0 and out["exit_status"] == "done" and out["agent_metrics"]["turns"] == 2
    assert model.requests[0]["messages"] == PROMPT
    assert all(b["temperature"] == 0.7 and b["max_tokens"] == 64 for b in model.requests)
    second = model.requests[1]["messages"]
    assert second[len(PROMPT)]["tool_calls"] and "content" not in second[len(PROMPT)]  # echoed, None dropped
    with pytest.raises(ConfigError, match="takes a model, not a transport"):
        await miles.run("http://127.0.0.1:1", PROMPT, {}, {"sandfleet_task": str(task.path)},
                        transport=httpx.MockTransport(lambda r: httpx.Response(500)))


@needs_bwrap()
async def test_task_by_name_text_mode_and_the_reward_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_task(tmp_path / "tasks")
    monkeypatch.setenv("SANDFLEET_TASKS", str(tmp_path / "tasks"))
    script = [{"text": "```bash\necho nope > /app/out.txt\n```"}, "Finished."]
    with FakeModelServer(script, strict_sessions=True) as server:
        out = await miles.run(server.session_url("r2"), "Do the task.", {}, {"sandfleet_task": "hello",
                              "sandfleet_tool_mode": "text"}, settings=BWRAP)
        assert server.rejections == [] and "tools" not in server.requests[0]
        assert server.requests[0]["messages"][1]["content"] == "Do the task."
    assert out["reward"] == 0.0 and out["agent_metrics"]["commands"] == 1
    samples = [SimpleNamespace(metadata=out), SimpleNamespace(metadata={"reward": 1.0}), SimpleNamespace(metadata={})]
    assert await miles.custom_rm(None, samples) == [0.0, 1.0, 0.0]
    assert await miles.custom_rm(None, samples[1]) == 1.0
    with pytest.raises(KeyError, match="sandfleet_task"):
        await miles.run("http://127.0.0.1:9", PROMPT, {}, {})


@dataclass
class MilesSample:
    """The fields of Miles' Sample the reward hook and the sample filter touch (its Status enum's names)."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    metadata: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.COMPLETED
    remove_sample: bool = False


@needs_bwrap()
async def test_a_masked_rollout_reaches_miles_as_an_aborted_sample(tmp_path: Path) -> None:
    """A model server that answers 500: the rollout is an infra fault, reward None in the
    metadata; custom_rm sets the sample ABORTED (Miles' aborted-group filter then drops the
    group); a policy fault keeps reward 0 and its status."""
    task = make_task(tmp_path)
    with FakeModelServer([{"fault": "500"}], strict_sessions=True) as server:
        out = await miles.run(server.session_url("m1"), PROMPT, {}, {"sandfleet_task": str(task.path)}, settings=BWRAP)
    assert out["verdict"] == "infra_fault" and out["reward"] is None and out["fault"]["cause"] == "model_overloaded"
    assert json.dumps(out)
    masked = MilesSample(metadata=out)
    policy = MilesSample(metadata={"verdict": "policy_fault", "reward": 0.0})
    scored = MilesSample(metadata={"verdict": "scored", "reward": 1.0})
    assert await miles.custom_rm(None, [masked, policy, scored]) == [0.0, 0.0, 1.0]
    assert masked.status is MilesSample.Status.ABORTED
    assert policy.status is scored.status is MilesSample.Status.COMPLETED
    other = MilesSample(metadata=out)
    miles.mask_infra_faults(None, [[other, MilesSample(metadata={"verdict": "scored"})]])
    assert other.remove_sample is True


@needs_bwrap()
async def test_abort_ends_the_rollouts_in_flight(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    with FakeModelServer([{"bash": "sleep 60"}], strict_sessions=True) as server:
        runs = [asyncio.create_task(miles.run(server.session_url(f"a{i}"), PROMPT, {},
                                              {"sandfleet_task": str(task.path)}, settings=BWRAP)) for i in range(2)]
        async with asyncio.timeout(30):
            while len(server.requests) < 2:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the commands are running
        t0 = asyncio.get_running_loop().time()
        await miles.abort(SimpleNamespace())
        outs = await asyncio.gather(*runs)
    assert asyncio.get_running_loop().time() - t0 < 10
    assert [o["exit_status"] for o in outs] == ["aborted", "aborted"]
    assert [(o["verdict"], o["reward"]) for o in outs] == [("infra_fault", None)] * 2
    assert not LIVE.jobs


@pytest.mark.model
@pytest.mark.skipif(os.environ.get("SANDFLEET_MODEL_TESTS") != "1", reason="real-model tests are opt-in: "
                    "SANDFLEET_MODEL_TESTS=1 (docs/rollouts.md, 'A real model')")
@needs_bwrap()
async def test_run_against_a_real_model(tmp_path: Path, model_server: ModelEndpoint) -> None:  # noqa: F811
    """Miles' ``run`` against a real small model: on the in-process server, through a session
    URL held to the strict-session rules (its replies are the model's own, tool calls or text)."""
    local = model_server.local
    base = local.session_url("miles-real") if local else model_server.url.removesuffix("/v1")
    task = make_task(tmp_path, agent_timeout=240)
    seen, rejected = (len(local.requests), len(local.rejections)) if local else (0, 0)
    out = await miles.run(base, PROMPT, {"max_tokens": 128, "temperature": 0.0},
                          {"sandfleet_task": str(task.path), "model": model_server.name, "sandfleet_max_turns": 4},
                          settings=BWRAP)  # fmt: skip
    assert out["eval_report"]["status"] == "completed", out["eval_report"]
    assert out["exit_status"] in ("done", "max_turns", "max_tokens") and out["reward"] in (0.0, 1.0)
    m = out["agent_metrics"]
    assert m["turns"] >= 1 and m["completion_tokens"] > 0 and m["prompt_tokens"] > 0
    spans = out["sandfleet_spans"]
    assert {s["name"] for s in spans} <= set(SPAN_NAMES)
    models = [s for s in spans if s["name"] == "model"]
    assert len(models) == m["turns"] and all(s["prompt_tokens"] > 0 for s in models)  # the server's usage
    assert sum(s["completion_tokens"] for s in models) == m["completion_tokens"]
    replies = []
    if local:
        assert local.rejections[rejected:] == []
        bodies = local.requests[seen:]
        assert len(bodies) == m["turns"] and bodies[0]["messages"] == PROMPT
        assert all(b["max_tokens"] == 128 and b["temperature"] == 0.0 for b in bodies)
        replies = [json.dumps(msg)[:160] for msg in bodies[-1]["messages"][len(PROMPT):] if msg["role"] == "assistant"]
    assert json.dumps(out)
    print(f"miles run: {out['exit_status']}, reward {out['reward']}, {m['turns']} turns, {m['commands']} commands, "
          f"{m['prompt_tokens']}+{m['completion_tokens']} tokens, {m['wall_time']:.1f} s; replies echoed: {replies}")


def test_settings_and_task_lookup_errors(tmp_path: Path) -> None:
    from sandfleet.integrations._common import resolve_task

    s = Settings.from_env({"SANDFLEET_BACKEND": "process", "SANDFLEET_NETWORK": "1"}, agent_user="root")
    assert (s.backend, s.network, s.agent_user) == ("process", True, "root")
    assert Settings.from_env({"SANDFLEET_REMOTE": "http://svc:8000"}).remote == "http://svc:8000"
    with pytest.raises(ConfigError, match="Ray"):
        Settings.from_env({"SANDFLEET_RAY": "auto"})
    with pytest.raises(ConfigError, match=f"under SANDFLEET_TASKS={tmp_path}"):
        resolve_task("nope", tasks_root=str(tmp_path))


# -- trees (issue 44): generate_tree (one branched rollout a call) and post_process_rewards
BRANCH = Path(__file__).resolve().parent.parent / "examples" / "branch"


def _group(args: Any, task: Path, n: int, group_index: int = 7, **meta: Any) -> list[Any]:
    """The ``n`` samples Miles makes of one prompt (consecutive indices, one group_index)."""
    from test_integrations_slime import Sample

    prompt = [{"role": "user", "content": (task / "instruction.md").read_text()}]
    return [Sample(group_index=group_index, index=group_index * n + j, prompt=prompt,
                   metadata={"sandfleet_task": str(task), **meta}) for j in range(n)]


async def _generate(args: Any, samples: list[Any]) -> list[Any]:
    """Miles' generate_and_rm_group: the group's samples concurrently, each call's output."""
    outs = await asyncio.gather(*(miles.generate_tree(SimpleNamespace(args=args, sample=s,
                                                                      sampling_params={"max_new_tokens": 64}))
                                  for s in samples))
    return [o.samples if isinstance(o.samples, list) else [o.samples] for o in outs]


@needs_bwrap()
async def test_generate_tree_gives_each_sample_of_a_group_a_leaf_per_turn_with_its_tree_advantage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A group of 4 samples is one 2:4 tree: grown once (turns 1-2 once, turn 3 per child), each
    sample answers one leaf as two siblings of one rollout (Miles' rollout_id): the prefix's turns
    at tree advantage 0 and the leaf's own turn at r - 0.5, each with only its turns in the
    loss mask and everything before it as context."""
    from test_integrations_slime import CharChatML, Sample, router_args

    monkeypatch.setenv("SANDFLEET_BACKEND", "bwrap")
    script = json.loads((BRANCH / "script.json").read_text())
    task = BRANCH / "tasks" / "branch-demo"
    tok = CharChatML()
    with FakeModelServer(script) as server:
        args = router_args(server, sandfleet_max_turns=3, n_samples_per_prompt=4)
        with pytest.raises(ConfigError, match="needs a branch"):
            await _generate(args, _group(args, task, 4)[:1])
        samples = _group(args, task, 4, sandfleet_branch="2:4")
        outs = await _generate(args, samples)
        bodies = server.requests
    assert len(bodies) == 2 + 4 and len(miles.GROUPS) == 0  # one tree; the group forgotten once all took a leaf
    assert [[p.metadata["sandfleet"]["tree"]["node_id"] for p in parts] for parts in outs] == \
        [["0.0"] * 2, ["0.1"] * 2, ["0.2"] * 2, ["0.3"] * 2]  # fmt: skip
    rewards = [parts[0].reward for parts in outs]
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]  # two children answer 42, two 41
    for s, parts, r in zip(samples, outs, rewards, strict=True):
        prefix, own = parts
        assert all(p.status is Sample.Status.COMPLETED and p.group_index == 7 and p.reward == r for p in parts)
        assert prefix.rollout_id == own.rollout_id == s.index  # siblings of one rollout
        assert own.metadata["sandfleet"]["tree_advantages"] == [0.0, 0.0, r - 0.5]
        assert (prefix.metadata["sandfleet_turns"], prefix.metadata["sandfleet_tree_advantage"]) == ([1, 2], 0.0)
        assert (own.metadata["sandfleet_turns"], own.metadata["sandfleet_tree_advantage"]) == ([3, 3], r - 0.5)

        def trained(p: Any) -> str:
            return "".join(chr(t) for t, m in zip(p.tokens[-p.response_length:], p.loss_mask, strict=True) if m)

        assert "prefix-one" in trained(prefix) and "echo child" not in trained(prefix)
        assert "echo child" in trained(own) and "prefix-one" not in trained(own) and "exit code" not in trained(own)
        assert own.tokens[:len(prefix.tokens)] == prefix.tokens  # the prefix run is the leaf's context
        assert own.response == tok.decode(own.tokens[-own.response_length:])
        assert s.tokens == []  # the sample Miles passed is copied, not changed
    flat = [p for parts in outs for p in parts]
    raw, processed = miles.post_process_rewards(SimpleNamespace(), flat)
    assert raw == [p.reward for p in flat]
    std = (sum((r - 0.5) ** 2 for r in rewards) / 3) ** 0.5  # over the 4 rollouts, not the 8 samples
    assert processed == [pytest.approx((p.reward - 0.5) / (std + 1e-6) + p.metadata["sandfleet_tree_advantage"])
                         for p in flat]  # fmt: skip


@needs_bwrap()
async def test_generate_tree_two_trees_a_group_leaf_mode_and_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 samples of a 2:4 plan are two trees (seeds apart, each grown once); ``leaf`` mode gives
    one sample a leaf with its own step's advantage; a group size that is not a multiple of the
    plan's leaves, a missing group size or group, and a ninth sample are refused by name."""
    from test_integrations_slime import router_args

    monkeypatch.setenv("SANDFLEET_BACKEND", "bwrap")
    script = json.loads((BRANCH / "script.json").read_text())
    task = BRANCH / "tasks" / "branch-demo"
    with FakeModelServer(script) as server:
        args = router_args(server, sandfleet_max_turns=3, n_samples_per_prompt=8, sandfleet_tree_samples="leaf")
        samples = _group(args, task, 8, group_index=3, sandfleet_branch="2:4")
        outs = await _generate(args, samples)
        seeds = [b.get("seed") for b in server.requests]
        for bad, match in ((dict(n_samples_per_prompt=6), "not a multiple of the 4 leaves"),
                           (dict(n_samples_per_prompt=None), "needs args.n_samples_per_prompt"),
                           (dict(sandfleet_tree_samples="each"), "must be one of turns, leaf")):
            with pytest.raises(ConfigError, match=match):
                await _generate(SimpleNamespace(**{**vars(args), **bad}), samples[:1])
        orphan = _group(args, task, 8, sandfleet_branch="2:4")[0]
        orphan.group_index = None
        with pytest.raises(ConfigError, match="group_index"):
            await _generate(args, [orphan])
    assert len(server.requests) == 2 * (2 + 4) and len(set(seeds)) == len(seeds) - 2  # children's seeds all distinct
    assert all(len(parts) == 1 for parts in outs)
    trees = [parts[0].metadata["sandfleet"]["tree"]["tree_id"] for parts in outs]
    assert len(set(trees[:4])) == 1 and len(set(trees[4:])) == 1 and trees[0] != trees[4]
    for parts in outs:
        (leaf,) = parts
        assert leaf.metadata["sandfleet_tree_advantage"] == leaf.reward - 0.5 and leaf.rollout_id == leaf.index
    groups = miles.TreeGroups()
    group, k = groups.claim(1, 2)
    assert k == 0 and groups.claim(1, 2)[1] == 1
    with pytest.raises(ConfigError, match="all have taken their leaf"):
        groups.claim(1, 2)
    with pytest.raises(ConfigError, match="opened with 2 samples"):
        groups.claim(1, 4)
    # a grown group whose other samples never come is forgotten after STALE_GROUP_S
    stale, _ = groups.claim(2, 4)
    stale.done_at = time.monotonic() - miles.STALE_GROUP_S - 1
    groups.claim(3, 4)
    assert len(groups) == 2  # group 1 (claimed whole, still open here) and 3; 2 is gone


@needs_bwrap()
async def test_cancelling_a_group_mid_growth_cancels_its_trees(monkeypatch: pytest.MonkeyPatch) -> None:
    """Miles aborts a group by cancelling its samples' calls: the growth they shared is cancelled
    with them, the group is forgotten and no sandbox is left."""
    from sandfleet.sandbox.state import list_sandboxes
    from test_integrations_slime import router_args

    def live_sandboxes() -> list[str]:  # this process's (a test module runs alone in its worker)
        return [m["id"] for m in list_sandboxes() if m.get("owner_pid") == os.getpid()]

    monkeypatch.setenv("SANDFLEET_BACKEND", "bwrap")
    script = json.loads((BRANCH / "script.json").read_text())
    script[0] = {"bash": "sleep 30"}  # the prefix's first command outlives the cancel
    task = BRANCH / "tasks" / "branch-demo"
    with FakeModelServer(script) as server:
        args = router_args(server, sandfleet_max_turns=3, n_samples_per_prompt=4)
        calls = asyncio.ensure_future(_generate(args, _group(args, task, 4, sandfleet_branch="2:4")))
        for _ in range(300):
            await asyncio.sleep(0.1)
            if server.requests:
                break
        await asyncio.sleep(1.0)
        assert server.requests and len(miles.GROUPS) == 1 and live_sandboxes()  # the tree's sandbox runs its sleep
        calls.cancel()
        with pytest.raises(asyncio.CancelledError):
            await calls
        for _ in range(100):
            if not live_sandboxes():
                break
            await asyncio.sleep(0.1)
    assert len(miles.GROUPS) == 0 and not live_sandboxes()


def test_post_process_rewards_groups_and_masks() -> None:
    from test_integrations_slime import Sample

    a = Sample(group_index=0, index=0, reward=1.0, status=Sample.Status.COMPLETED,
               metadata={"sandfleet_tree_advantage": 0.25})
    a2 = Sample(group_index=0, index=0, reward=1.0, status=Sample.Status.COMPLETED)  # a's sibling (same rollout)
    b = Sample(group_index=0, index=1, reward=0.0, status=Sample.Status.COMPLETED)
    c = Sample(group_index=0, index=2, reward=0.0, status=Sample.Status.ABORTED)  # masked: out of the group, 0
    d = Sample(group_index=1, index=3, reward=0.5, status=Sample.Status.COMPLETED)
    raw, out = miles.post_process_rewards(SimpleNamespace(grpo_std_normalization=False), [a, a2, b, c, d])
    assert raw == [1.0, 1.0, 0.0, 0.0, 0.5]
    assert out == [0.5 + 0.25, 0.5, -0.5, 0.0, 0.0]  # the mean over 2 rollouts (a, b), not 3 samples
