"""``sandfleet.integrations.verl.SandfleetCodeInterpreterTool`` (issue 47) without verl, through
real sandboxes: the calls verl 0.9.1's ``ToolAgentLoop._call_tool`` makes (create, execute with
``agent_data``, release, per tool call), state kept per trajectory, the BaseTool contract
without ``agent_data``, errors, timeouts, idle trajectories closed, and a sandfleet service as
the sandboxes' home. With verl installed: tests/test_verl_fusion.py (opt-in)."""

from __future__ import annotations

import asyncio
import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import backend_skip
from sandfleet.errors import ConfigError
from sandfleet.integrations.verl import SCHEMA, SandfleetCodeInterpreterTool

VERL = importlib.util.find_spec("verl") is not None


def _backend() -> str:
    return "process" if backend_skip("bwrap") else "bwrap"


async def call(tool: SandfleetCodeInterpreterTool, code: str, request_id: str | None) -> tuple[Any, float, dict]:
    """One tool call as verl 0.9.1's ToolAgentLoop makes it: create, execute, release."""
    iid, _ = await tool.create(create_kwargs={})
    try:
        agent_data = SimpleNamespace(request_id=request_id) if request_id else None
        return await tool.execute(iid, {"code": code}, **({"agent_data": agent_data} if agent_data else {}))
    finally:
        await tool.release(iid)


def test_schema_and_config() -> None:
    tool = SandfleetCodeInterpreterTool({"type": "native", "backend": "process"})
    if not VERL:
        assert tool.name == "code_interpreter" and tool.get_openai_tool_schema() == SCHEMA
    with pytest.raises(ConfigError, match="unknown config key.*timout_s.*known: backend"):
        SandfleetCodeInterpreterTool({"type": "native", "timout_s": 3})


async def test_state_per_trajectory_across_calls() -> None:
    tool = SandfleetCodeInterpreterTool({"type": "native", "backend": _backend(), "timeout_s": 20})
    try:
        resp, reward, metrics = await call(tool, "x = 41\nprint('set')", "traj-a")
        assert resp.text == "set\n" and reward == 0.0 and metrics["error"] is None and metrics["cell_ms"] > 0
        # a new instance of the same trajectory sees the state; another trajectory does not
        resp, _, _ = await call(tool, "x += 1\nx", "traj-a")
        assert resp.text == "42\n"
        resp, _, metrics = await call(tool, "x", "traj-b")
        assert metrics["error"] == "NameError" and "NameError: name 'x' is not defined" in resp.text
        assert tool.sandboxes == 2
        # stderr, the last value, an error's traceback, all in the text
        resp, _, _ = await call(tool, "import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7", "traj-a")
        assert resp.text == "out\nerr\n42\n"
        resp, _, _ = await call(tool, "def f():\n    return 1 / 0\nf()", "traj-a")
        assert "return 1 / 0" in resp.text and resp.text.rstrip().endswith("ZeroDivisionError: division by zero")
        resp, _, _ = await call(tool, "y = 1", "traj-a")
        assert resp.text == "(no output)"
        # a cell past its timeout is interrupted, and the trajectory's state stays
        iid, _ = await tool.create()
        resp, _, metrics = await tool.execute(iid, {"code": "import time\ntime.sleep(30)", "timeout": 1},
                                              agent_data=SimpleNamespace(request_id="traj-a"))
        await tool.release(iid)
        assert metrics["error"] == "KeyboardInterrupt"
        assert (await call(tool, "x", "traj-a"))[0].text == "42\n"
        await tool.close("traj-b")
        assert tool.sandboxes == 1
    finally:
        await tool.close()
    assert tool.sandboxes == 0


async def test_instance_contract_without_agent_data() -> None:
    tool = SandfleetCodeInterpreterTool({"type": "native", "backend": _backend()})
    try:
        iid, first = await tool.create("mine")
        assert iid == "mine" and first.text is None
        await tool.execute(iid, {"code": "z = 5"})
        assert (await tool.execute(iid, {"code": "z * 2"}))[0].text == "10\n"
        assert await tool.calc_reward(iid) == 0.0
        assert tool.sandboxes == 1
        await tool.release(iid)
        assert tool.sandboxes == 0  # the instance's own sandbox is closed with it
        assert "NameError" in (await call(tool, "z", None))[0].text
    finally:
        await tool.close()


async def test_idle_trajectories_are_closed() -> None:
    tool = SandfleetCodeInterpreterTool({"type": "native", "backend": _backend(), "idle_s": 0.5})
    try:
        await call(tool, "a = 1", "old")
        await asyncio.sleep(0.8)
        await call(tool, "b = 1", "new")  # the call's create and release look for idle ones
        assert tool.sandboxes == 1
        assert (await call(tool, "b", "new"))[0].text == "1\n"
    finally:
        await tool.close()


async def test_concurrent_calls_of_one_trajectory_share_one_sandbox() -> None:
    tool = SandfleetCodeInterpreterTool({"type": "native", "backend": _backend()})
    try:
        await asyncio.gather(*(call(tool, f"v{i} = {i}", "same") for i in range(4)))
        assert tool.sandboxes == 1
        assert (await call(tool, "v0 + v1 + v2 + v3", "same"))[0].text == "6\n"
    finally:
        await tool.close()


def test_on_a_service(running_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("fastapi") is None:
        pytest.skip("the service needs the server extra (pip install -e '.[server]')")
    svc = running_services.view()
    monkeypatch.setenv("SANDFLEET_TOKEN", svc.token)

    async def go() -> None:
        tool = SandfleetCodeInterpreterTool({"type": "native", "remote": svc.url})
        try:
            await call(tool, "import os\nn = 3", "t")
            resp, _, metrics = await call(tool, "n * 'ab'", "t")
            assert resp.text == "'ababab'\n" and metrics["error"] is None
        finally:
            await tool.close()

    asyncio.run(go())


def test_the_docs_tools_config_loads_as_verl_would() -> None:
    """docs/integrations.md's tools config: its class_name imports, its config is accepted."""
    import importlib
    import re
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[1] / "docs" / "integrations.md").read_text()
    section = doc.split("## verl (code interpreter tool)", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    [entry] = yaml.safe_load(block.group(1))["tools"]
    module, name = entry["class_name"].rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    assert cls is SandfleetCodeInterpreterTool
    tool = cls(config=entry["config"], tool_schema=entry.get("tool_schema"))
    assert (tool.timeout_s, tool.idle_s) == (30.0, 600.0)


async def test_a_trajectory_whose_sandbox_is_gone_starts_afresh() -> None:
    tool = SandfleetCodeInterpreterTool({"type": "native", "backend": _backend()})
    try:
        await call(tool, "x = 1", "t")
        await tool._sessions["trajectory:t"].sandbox.close()  # as its ttl_s would
        with pytest.raises(Exception):  # noqa: B017 (this call fails as verl sees it: "Error executing tool")
            await call(tool, "x", "t")
        resp, _, metrics = await call(tool, "x", "t")
        assert metrics["error"] == "NameError" and tool.sandboxes == 1
    finally:
        await tool.close()
