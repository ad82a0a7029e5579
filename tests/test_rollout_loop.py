"""The agent loop against the scripted OpenAI-compatible server, over loopback."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from sandfleet.errors import ConfigError
from sandfleet.rollout import AgentConfig, OpenAIPolicy
from sandfleet.rollout.chat import ChatClient
from sandfleet.rollout.loop import fenced_commands, truncate
from sandfleet.testing.fake_server import FakeModelServer
from sandfleet.testing.scripted_model import ScriptedModel
from test_rollout_support import make_task, needs_bwrap, run

pytestmark = needs_bwrap()


def policy(server: FakeModelServer, **config: object) -> OpenAIPolicy:
    return OpenAIPolicy(server.url, "fake", api_key="k", config=AgentConfig(**config))  # type: ignore[arg-type]


async def test_tool_calls_solve_the_task_and_tokens_are_recorded(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    script = [{"bash": "cd /app"}, {"tool_calls": ["echo hel > x", "echo hello > out.txt"]}, "Done."]
    with FakeModelServer(script) as server:
        report = await run([task], policy(server), n=2, concurrency=2)
        bodies = server.requests
    for r in report.results:
        assert r.status == "completed" and r.reward == 1.0 and r.stop_reason == "done"
        assert r.turns == 3 and r.commands == 3
        models = [s for s in r.spans if s["name"] == "model"]
        assert len(models) == 3 and all(s["prompt_tokens"] > 0 for s in models)
        assert r.prompt_tokens == sum(s["prompt_tokens"] for s in models)
        assert r.completion_tokens == sum(s["completion_tokens"] for s in models)
    assert bodies[0]["tools"][0]["function"]["name"] == "bash"
    last = bodies[-1]["messages"]
    assert last[0]["role"] == "system" and "hello" in last[1]["content"]
    assert any(m["role"] == "tool" and m["content"].startswith("exit code: 0") for m in last)


async def test_text_fallback_runs_fenced_blocks_when_tools_are_refused(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    script = [{"text": "I will write it.\n```bash\necho hello > /app/out.txt\n```"}, "Finished."]
    with FakeModelServer(script, accept_tools=False) as server:
        r = (await run([task], policy(server))).results[0]
        assert "tools" not in server.requests[-1]
    assert r.reward == 1.0 and r.info.get("tools_rejected") is True
    assert r.commands == 1


async def test_output_is_truncated_and_says_so(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    with FakeModelServer([{"bash": "seq 1 100000"}]) as server:
        await run([task], policy(server, max_output_chars=300))
        tool_msg = [m for m in server.requests[-1]["messages"] if m["role"] == "tool"][0]
    assert "characters truncated by sandfleet" in tool_msg["content"]
    assert len(tool_msg["content"]) < 500 and tool_msg["content"].rstrip().endswith("100000")


async def test_stops_at_max_turns_max_tokens_and_agent_timeout(tmp_path: Path) -> None:
    forever = [{"bash": "true"}] * 50
    task = make_task(tmp_path)
    with FakeModelServer(forever) as server:
        r = (await run([task], policy(server, max_turns=3))).results[0]
        assert r.stop_reason == "max_turns" and r.turns == 3 and r.reward == 0.0
        r = (await run([task], policy(server, max_tokens=1))).results[0]
        assert r.stop_reason == "max_tokens" and r.turns == 1
    slow = make_task(tmp_path, "slow", agent_timeout=1.5)
    with FakeModelServer([{"bash": "sleep 30"}]) as server:
        r = (await run([slow], policy(server))).results[0]
    assert r.stop_reason == "agent_timeout" and r.status == "completed"
    assert r.duration < 10


def test_fenced_blocks_and_truncation() -> None:
    text = "a\n```bash\nls -la\n```\nthen\n```\necho 1\n```\n```python\nprint(1)\n```"
    assert fenced_commands(text) == ["ls -la", "echo 1"]
    # the prose between two python blocks is not a command (SmolLM2's replies had that shape)
    prose = "Here:\n```python\nprint(1)\n```\nThis prints one.\n```Python\nx = 2\n```\n```sh\npwd\n```"
    assert fenced_commands(prose) == ["pwd"]
    assert truncate("x" * 10, 20) == "x" * 10
    cut = truncate("a" * 50 + "b" * 50, 30)
    assert cut.startswith("a" * 20) and cut.endswith("b" * 10) and "70 characters" in cut


async def test_fake_server_lists_models_and_injectable_transport() -> None:
    with FakeModelServer([], model="m1") as server:
        async with httpx.AsyncClient() as client:
            models = (await client.get(server.url + "/models")).json()
    assert models["data"][0]["id"] == "m1"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}],
                                         "usage": {"prompt_tokens": 5, "completion_tokens": 1}})

    async with ChatClient("http://nowhere", "m", transport=httpx.MockTransport(handler)) as chat:
        reply = await chat.complete([{"role": "user", "content": "hi"}])
    assert reply.content == "ok" and reply.prompt_tokens == 5


async def test_a_model_passed_in_drives_the_loop(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    model = ScriptedModel([{"bash": "cd /app"}, {"tool_calls": ["echo hel > x", "echo hello > out.txt"]}, "Done."])
    policy = OpenAIPolicy(model=model, config=AgentConfig(temperature=0.5), extra_body={"top_p": 0.9})
    report = await run([task], policy, n=2, concurrency=2)  # one model shared by both rollouts
    for r in report.results:
        assert r.status == "completed" and r.reward == 1.0 and r.stop_reason == "done"
        assert r.turns == 3 and r.commands == 3 and r.info["model"] == "scripted-model"
        models = [s for s in r.spans if s["name"] == "model"]
        assert len(models) == 3 and r.prompt_tokens == sum(s["prompt_tokens"] for s in models) > 0
    assert len(model.requests) == 6
    first = model.requests[0]
    assert first["tools"][0]["function"]["name"] == "bash" and first["max_tokens"] == 1024
    assert first["temperature"] == 0.5 and first["top_p"] == 0.9
    last = max(model.requests, key=lambda b: len(b["messages"]))["messages"]
    assert last[0]["role"] == "system" and any(m["role"] == "tool" for m in last)


async def test_a_chat_client_with_its_own_transport_is_a_model(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        done = any(m["role"] == "assistant" for m in seen[-1]["messages"])
        message = ({"role": "assistant", "content": "Done."} if done else
                   {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                       "name": "bash", "arguments": '{"command": "echo hello > /app/out.txt"}'}}]})
        return httpx.Response(200, json={"choices": [{"message": message}],
                                         "usage": {"prompt_tokens": 7, "completion_tokens": 3}})

    async with ChatClient("http://nowhere", "m", transport=httpx.MockTransport(handler)) as chat:
        r = (await run([task], OpenAIPolicy(model=chat))).results[0]
    assert r.reward == 1.0 and r.turns == 2 and r.prompt_tokens == 14 and r.info["model"] == "m"
    assert [b["model"] for b in seen] == ["m", "m"]


def test_bad_models_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="model must be a model name or a Model.*not object"):
        OpenAIPolicy(model=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not both"):
        OpenAIPolicy("http://127.0.0.1:1/v1", ScriptedModel())
    with pytest.raises(ConfigError, match="needs a model server URL"):
        OpenAIPolicy(model="m")
    with pytest.raises(ConfigError, match="not HTTP faults"):
        ScriptedModel([{"fault": "500"}])
    with pytest.raises(ConfigError, match="not a script entry"):
        ScriptedModel([{"command": "ls"}])
