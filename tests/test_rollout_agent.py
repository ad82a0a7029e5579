"""The agent loop against the scripted OpenAI-compatible server, over loopback."""

from __future__ import annotations

from pathlib import Path

import httpx

from sandfleet.rollout import AgentConfig, OpenAIPolicy
from sandfleet.rollout.agent import fenced_commands, truncate
from sandfleet.testing.fake_server import FakeModelServer
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

    from sandfleet.rollout.chat import ChatClient

    async with ChatClient("http://nowhere", "m", transport=httpx.MockTransport(handler)) as chat:
        reply = await chat.complete([{"role": "user", "content": "hi"}])
    assert reply.content == "ok" and reply.prompt_tokens == 5
