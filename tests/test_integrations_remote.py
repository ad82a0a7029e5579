"""The integrations with their sandboxes on a sandfleet service (``sandfleet serve`` on
loopback): SANDFLEET_REMOTE for Miles' run, ``remote=`` for slime's sandbox and mini's
environment."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from sandfleet.client import RemoteSandbox, connect
from sandfleet.integrations import miles, slime
from sandfleet.integrations._common import Settings
from sandfleet.integrations.minisweagent import SandfleetEnvironment
from sandfleet.testing.fake_server import FakeModelServer
from test_rollout_support import make_task, needs_bwrap

pytestmark = [
    needs_bwrap(),
    pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                       reason="the service needs the server extra (pip install -e '.[server]')"),
]


@pytest.fixture(scope="module")
def service(running_services: Any) -> Any:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view()


async def test_miles_run_slime_sandbox_and_mini_on_the_service(tmp_path: Path, service: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFLEET_TOKEN", service.token)
    task = make_task(tmp_path)
    script = [{"bash": "sleep 1; echo hello > /app/out.txt"}, "Done."]
    async with await connect(service.url, service.token) as svc:
        with FakeModelServer(script, strict_sessions=True) as server:
            run = asyncio.create_task(miles.run(server.session_url("remote-1"), None, {},
                                                {"sandfleet_task": str(task.path)},
                                                settings=Settings(backend="bwrap", remote=service.url)))
            seen: list[dict[str, Any]] = []
            async with asyncio.timeout(60):
                while not seen and not run.done():
                    seen = await svc.find({"task": "hello"})
                    await asyncio.sleep(0.1)
            out = await run
    assert [s["id"] for s in seen] == [out["sandfleet_rollout"]["sandbox_id"]]  # the rollout's sandbox: the service's
    assert out["reward"] == 1.0 and server.rejections == []
    async with slime.SandfleetSandbox(remote=service.url, image="host", ttl_s=120) as sb:
        assert await sb.exec("id -u", user="agent") == (0, "1000\n", "")
        await sb.write_file("/work/x", "y")
        assert await sb.read_file("/work/x") == "y"
        assert isinstance(sb.sandbox, RemoteSandbox)
    env = SandfleetEnvironment(remote=service.url, backend="bwrap", timeout=5)
    try:
        out_mini = await asyncio.to_thread(env.execute, {"command": "echo hi"})
        assert isinstance(env.sandbox, RemoteSandbox)
    finally:
        env.close()
    assert out_mini["output"] == "hi\n"
