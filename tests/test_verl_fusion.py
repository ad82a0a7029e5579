"""verl's own SandboxFusion code reward, unchanged, scoring through a real ``sandfleet serve``.

verl (0.9.1) reaches SandboxFusion in one place: ``verl.utils.reward_score.sandbox_fusion``,
called by ``default_compute_score`` for code data sources (``codecontests``, ``apps``,
``codeforces``, ``taco``) when ``reward.sandbox_fusion.url`` is set; its trainer wraps it in a
partial with that URL, a semaphore and ``memory_limit_mb`` (``verl.trainer.ppo.reward``) and
hands it to the reward manager. Here the same partial goes to verl's ``NaiveRewardManager``
over a ``DataProto`` batch. And sandfleet's code interpreter tool
(``sandfleet.integrations.verl``, issue 47) loaded by verl's own tools config reader. Opt-in
(marker ``verl``): ``scripts/test-integrations.sh verl`` installs verl with torch's CPU build.
"""

from __future__ import annotations

import importlib.util
import json
import threading
from functools import partial
from typing import Any

import httpx
import pytest

pytestmark = [
    pytest.mark.verl,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # ray.experimental, imported by verl
    pytest.mark.skipif(importlib.util.find_spec("verl") is None,
                       reason="needs verl (scripts/test-integrations.sh verl installs it)"),
]

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService


@pytest.fixture(scope="module")
def svc(running_services: Any) -> RunningService:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view()


TESTS = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}
RIGHT = "Here it is:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
HALF = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else a - b)\n```"
WRONG = "```python\na, b = map(int, input().split())\nprint(a + b + 1)\n```"
CRASH = "```python\nraise SystemExit(3)\n```"
SLOW = "```python\nimport time\ntime.sleep(30)\n```"


def score_fn(svc: RunningService, memory_limit_mb: int = 1024) -> Any:
    """What verl.trainer.ppo.reward.load_reward_manager builds from reward.sandbox_fusion."""
    from verl.utils.reward_score import default_compute_score

    return partial(default_compute_score, sandbox_fusion_url=f"{svc.url}/sandbox-fusion/{svc.token}/run_code",
                   concurrent_semaphore=threading.Semaphore(8), memory_limit_mb=memory_limit_mb)


def test_default_compute_score(svc: RunningService) -> None:
    score = score_fn(svc)
    gt = json.dumps(TESTS)
    assert score(data_source="codecontests", solution_str=RIGHT, ground_truth=gt) == 1.0
    assert score(data_source="apps", solution_str=HALF, ground_truth=gt) == pytest.approx(2 / 3)
    assert score(data_source="taco", solution_str=WRONG, ground_truth=gt) == pytest.approx(0.0)
    assert score(data_source="codeforces", solution_str=CRASH, ground_truth=gt) == 0.0


def test_metadata_statuses(svc: RunningService) -> None:
    """verl's own classification of each answer: success, wrong_answer, runtime_error, timeout,
    compile_error (cpp); never api_error or sandbox_error."""
    from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

    url = f"{svc.url}/sandbox-fusion/{svc.token}/run_code"
    one = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    seen = {}
    for name, code, lang, timeout in (("right", "a, b = map(int, input().split())\nprint(a + b)", "python", 10),
                                      ("wrong", "print(4)", "python", 10),
                                      ("crash", "raise ValueError('boom')", "python", 10),
                                      ("slow", "import time\ntime.sleep(30)", "python", 2),
                                      ("cpp", "#include <cstdio>\nint main(){int a,b;scanf(\"%d %d\",&a,&b);"
                                              "printf(\"%d\\n\",a+b);}", "cpp", 60),
                                      ("cpp_bad", "int main() { return nope; }", "cpp", 60)):
        res, meta = check_correctness(url, one, code, timeout=timeout, language=lang)
        seen[name] = (res[0], meta[0]["status"])
    assert seen == {"right": (True, "success"), "wrong": (False, "wrong_answer"), "crash": (-2, "runtime_error"),
                    "slow": (-3, "timeout"), "cpp": (True, "success"), "cpp_bad": (-4, "compile_error")}


def test_naive_reward_manager_batch(svc: RunningService) -> None:
    """verl's NaiveRewardManager over a DataProto: the reward lands on each response's last token."""
    import numpy as np
    import torch
    from verl import DataProto
    from verl.workers.reward_manager.naive import NaiveRewardManager

    class Chars:  # a tokenizer: one token per character
        def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
            return "".join(chr(int(i)) for i in ids if int(i) > 0)

    responses = [RIGHT, WRONG, HALF, SLOW]
    width = max(len(r) for r in responses)
    prompt = torch.tensor([[ord(c) for c in "solve"]] * len(responses))
    resp = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), prompt.shape[1] + width, dtype=torch.long)
    mask[:, : prompt.shape[1]] = 1
    for i, r in enumerate(responses):
        resp[i, : len(r)] = torch.tensor([ord(c) for c in r])
        mask[i, prompt.shape[1]: prompt.shape[1] + len(r)] = 1
    gt = json.dumps({**TESTS, "inputs": TESTS["inputs"][:1], "outputs": TESTS["outputs"][:1]})
    data = DataProto.from_dict(
        tensors={"prompts": prompt, "responses": resp, "attention_mask": mask},
        non_tensors={"data_source": np.array(["codecontests"] * len(responses), dtype=object),
                     "reward_model": np.array([{"ground_truth": gt}] * len(responses), dtype=object)})
    mgr = NaiveRewardManager(tokenizer=Chars(), num_examine=0, compute_score=score_fn(svc))
    rewards = mgr(data)
    last = [float(rewards[i, len(r) - 1]) for i, r in enumerate(responses)]
    # HALF is right on the first case (1 2 -> 3); SLOW times out at verl's default 10 s
    assert last == [1.0, 0.0, 1.0, 0.0]
    assert float(rewards.sum()) == 2.0
    r = httpx.get(f"{svc.url}/v1/sandboxes", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    assert r.json()["sandboxes"] == []


def test_a_reward_verl_saw_is_replayed_from_the_services_record(tmp_path: Any) -> None:
    """Issue 45: a service started with SANDFLEET_RECORD_DIR records each of verl's run_code
    calls; ``sandfleet replay`` runs them again, with the same statuses and outputs."""
    from click.testing import CliRunner

    from sandfleet.cli import cli
    from sandfleet.server.testing import running_service

    rec = tmp_path / "verl-run"
    with running_service(tmp_path / "svc", env={"SANDFLEET_RECORD_DIR": str(rec)}) as own:
        score = score_fn(own)
        gt = json.dumps(TESTS)
        assert score(data_source="apps", solution_str=HALF, ground_truth=gt) == pytest.approx(2 / 3)
    lines = [json.loads(x) for x in (rec / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and {r["request"]["stdin"] for r in lines} == set(TESTS["inputs"])
    assert [r["result"]["status"] for r in lines] == ["Success"] * 3
    done = CliRunner().invoke(cli, ["replay", str(rec), "--json"])
    assert done.exit_code == 0, done.output
    got = json.loads(done.stdout)
    assert got["summary"]["rollouts"] == 3 and got["summary"]["identical"] == 3, got["summary"]
    outputs = sorted(r["command_rows"][0]["output"] for r in got["rollouts"])
    assert outputs == ["same"] * 3


TOOLS_YAML = """\
tools:
  - class_name: sandfleet.integrations.verl.SandfleetCodeInterpreterTool
    config:
      type: native
      remote: {url}
      timeout_s: 20
"""


def test_code_interpreter_tool_from_verls_own_registry(svc: RunningService, tmp_path: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 47: sandfleet's code interpreter tool, loaded by verl's own tools config reader
    (``verl.tools.tool_registry.initialize_tools_from_config``), is a verl ``BaseTool`` that
    answers verl's ``ToolResponse``; driven as verl 0.9.1's ``ToolAgentLoop._call_tool`` drives
    a ``BaseTool`` (create, execute with ``agent_data``, release, per tool call), its Python
    state lasts the trajectory, on the sandboxes of a real ``sandfleet serve``."""
    import asyncio
    from types import SimpleNamespace

    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse
    from verl.tools.tool_registry import initialize_tools_from_config

    monkeypatch.setenv("SANDFLEET_TOKEN", svc.token)
    config = tmp_path / "tools.yaml"
    config.write_text(TOOLS_YAML.format(url=svc.url))
    [tool] = initialize_tools_from_config(str(config))
    assert isinstance(tool, BaseTool) and tool.name == "code_interpreter"
    assert tool.get_openai_tool_schema().function.parameters.required == ["code"]

    async def call_tool(arguments: str, request_id: str) -> tuple[Any, float, dict]:
        # what ToolAgentLoop._call_tool does for a BaseTool (verl 0.9.1)
        instance_id, _ = await tool.create(create_kwargs={})
        try:
            return await tool.execute(instance_id, json.loads(arguments),
                                      agent_data=SimpleNamespace(request_id=request_id))
        finally:
            await tool.release(instance_id)

    async def go() -> None:
        try:
            first, reward, _ = await call_tool(json.dumps({"code": "import math\nr = math.isqrt(50)"}), "traj-1")
            assert isinstance(first, ToolResponse) and first.text == "(no output)" and reward == 0.0
            resp, _, metrics = await call_tool(json.dumps({"code": "print(r * 2)\nr ** 2"}), "traj-1")
            assert resp.text == "14\n49\n" and metrics["error"] is None
            resp, _, metrics = await call_tool(json.dumps({"code": "r"}), "traj-2")
            assert metrics["error"] == "NameError" and "NameError" in resp.text
        finally:
            await tool.close()

    asyncio.run(go())
    r = httpx.get(f"{svc.url}/v1/sandboxes", headers={"Authorization": f"Bearer {svc.token}"}, timeout=30)
    assert r.json()["sandboxes"] == []
