"""A verifiers (0.4) task scores a right and a wrong answer by running them in a sandfleet
sandbox: its ``@vf.reward`` takes the ``runtime``, which is ``SandfleetRuntime``, locally and
on a real ``sandfleet serve``. Opt-in (marker ``verifiers``): ``scripts/test-integrations.sh
verifiers`` installs verifiers."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.verifiers,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.skipif(importlib.util.find_spec("verifiers") is None,
                       reason="needs verifiers (scripts/test-integrations.sh verifiers installs it)"),
]

TESTS = "from solution import add\nassert add(2, 3) == 5\nassert add(-1, 1) == 0\nprint('ok')\n"
RIGHT = "Here is the function:\n```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"


def make_task() -> Any:
    import verifiers.v1 as vf

    class AddTask(vf.Task):
        """Write ``add``; the tests run in the runtime."""

        @vf.reward
        async def passes(self, trace: Any, runtime: Any) -> float:
            reply = trace.last_reply
            code = reply.split("```python")[-1].split("```")[0] if "```" in reply else reply
            await runtime.write("solution.py", code.encode())
            await runtime.write("test_add.py", TESTS.encode())
            res = await runtime.run(["python3", "test_add.py"], {})
            return 1.0 if res.exit_code == 0 and res.stdout == "ok\n" else 0.0

    return AddTask(vf.TaskData(prompt="Write add(a, b)."))


def make_trace(task: Any, reply: str) -> Any:
    import verifiers.v1 as vf
    from verifiers.v1.trace import AgentInfo, TraceTask

    return vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data), agent=AgentInfo(config=vf.AgentConfig()),
                    root_reply=reply)


async def score_both(runtime: Any) -> tuple[float, float]:
    task = make_task()
    await runtime.start()
    try:
        right, wrong = make_trace(task, RIGHT), make_trace(task, WRONG)
        await task.score(right, runtime=runtime)
        await task.score(wrong, runtime=runtime)
        assert await runtime.alive()
        assert await runtime.read("solution.py", max_bytes=1000) == b"\ndef add(a, b):\n    return a - b\n"
    finally:
        await runtime.stop()
    return right.reward, wrong.reward


def test_scores_in_a_local_sandbox() -> None:
    from sandfleet.integrations.verifiers import SandfleetRuntime

    assert asyncio.run(score_both(SandfleetRuntime())) == (1.0, 0.0)


def test_scores_on_a_service(tmp_path: Path) -> None:
    import httpx

    from sandfleet.integrations.verifiers import SandfleetRuntime
    from sandfleet.server.testing import running_service

    with running_service(tmp_path / "svc") as svc:
        rt = SandfleetRuntime(remote=svc.url, token=svc.token)
        assert asyncio.run(score_both(rt)) == (1.0, 0.0)
        r = httpx.get(f"{svc.url}/v1/sandboxes", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
        assert r.json()["sandboxes"] == []
