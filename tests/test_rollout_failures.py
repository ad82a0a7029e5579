"""Failures: model server down, 500, malformed, hanging; cancellation; image build errors.

Each rollout is marked failed with its reason (retried per the policy), its sandbox is
reaped, and the run goes on."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

from sandfleet.analysis.trace import load_run
from sandfleet.rollout import OpenAIPolicy, RetryPolicy, RunConfig, ScriptedPolicy
from sandfleet.rollout.suite import run_suite
from sandfleet.sandbox.state import state_root
from sandfleet.testing.fake_server import FakeModelServer
from test_rollout_support import make_task, needs_bwrap, run

pytestmark = needs_bwrap()
SOLVE = [{"bash": "echo hello > /app/out.txt"}, "Done."]


def reaped(sandbox_id: str | None) -> bool:
    return sandbox_id is None or not (state_root() / sandbox_id).exists()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_model_down_fails_with_reason_and_retries(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    policy = OpenAIPolicy(f"http://127.0.0.1:{closed_port()}/v1", "m", api_key="")
    retry = RetryPolicy(max_attempts=2, backoff_s=0.01)
    report = await run([task], policy, tmp_path / "out", retry=retry)
    r = report.results[0]
    assert r.status == "failed" and r.reason == "model_unreachable" and r.attempt == 2
    assert len(report.attempts) == 2 and all(reaped(a.sandbox_id) for a in report.attempts)
    assert len(load_run(tmp_path / "out").rollouts) == 2  # failed attempts are traced too


async def test_500_then_success_and_malformed_answers(tmp_path: Path) -> None:
    good = make_task(tmp_path, "good")
    retry = RetryPolicy(max_attempts=2, backoff_s=0.01)
    with FakeModelServer(SOLVE, faults=["500"]) as server:
        report = await run([good], OpenAIPolicy(server.url, "m"), retry=retry)
    r = report.results[0]
    assert r.status == "completed" and r.reward == 1.0 and r.attempt == 2
    assert report.attempts[0].reason == "model_http_500"

    for fault in ("malformed", "bad_shape"):
        with FakeModelServer(SOLVE, faults=[fault] * 2) as server:
            report = await run([good], OpenAIPolicy(server.url, "m"), retry=retry)
        r = report.results[0]
        assert r.status == "failed" and r.reason == "model_malformed", fault
        assert reaped(r.sandbox_id)


async def test_hanging_server_times_out(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    with FakeModelServer([{"fault": "hang"}]) as server:
        policy = OpenAIPolicy(server.url, "m", request_timeout_s=0.5)
        report = await run([task], policy, retry=RetryPolicy(max_attempts=1))
    r = report.results[0]
    assert r.status == "failed" and r.reason == "model_timeout" and reaped(r.sandbox_id)
    assert (r.verdict, r.reward, (r.fault or {}).get("cause")) == ("infra_fault", None, "model_timeout")
    model = [s for s in r.spans if s["name"] == "model"]
    assert model and model[0]["error"] == "model_timeout"


async def test_cancelled_rollout_is_recorded_and_reaped(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    seen: list[str] = []
    out = tmp_path / "out"
    running = asyncio.create_task(run_suite(
        [task], ScriptedPolicy(["sleep 60"]), RunConfig(backend="bwrap"), out_dir=out,
        on_result=lambda r: seen.append(r.status)))  # fmt: skip
    await asyncio.sleep(1.0)
    running.cancel()
    try:
        await running
    except asyncio.CancelledError:
        pass
    assert seen == ["cancelled"]
    line = json.loads((out / "trace.jsonl").read_text())
    assert line["status"] == "cancelled" and reaped(line["sandbox_id"])
    assert line["verdict"] == "infra_fault" and line["reward"] is None and line["fault"]["cause"] == "cancelled"
    load_run(out)  # still a valid trace


async def test_image_build_failure_fails_its_rollouts_and_the_run_goes_on(tmp_path: Path) -> None:
    broken = make_task(tmp_path, "broken", dockerfile="FROM python:3.11-slim-bookworm\n"
                       "WORKDIR /app\nRUN echo building && false\n")  # fmt: skip
    fine = make_task(tmp_path, "fine")
    from sandfleet.rollout import OraclePolicy

    report = await run([broken, fine], OraclePolicy(), n=2)
    b = [r for r in report.results if r.task == "broken"]
    f = [r for r in report.results if r.task == "fine"]
    assert all(r.status == "failed" and r.reason == "image_build" for r in b)
    assert ":3" in (b[0].error or "")  # names the Dockerfile line
    assert [r.reward for r in f] == [1.0, 1.0]
    assert report.summary()["failures"] == {"image_build": 2}
    assert all((r.verdict, r.reward, r.attempt) == ("infra_fault", None, 1) for r in b)  # masked, not rebuilt
    assert report.summary()["masked_causes"] == {"image_build": 2} and report.groups["broken"]["complete"] is False


def test_retry_policy_names_reasons() -> None:
    from sandfleet.rollout.result import RolloutResult

    def result(reason: str, attempt: int = 1) -> RolloutResult:
        return RolloutResult("r", "t", "t", 0, "a", "bwrap", 0.0, 1.0, "failed", [],
                             attempt=attempt, reason=reason)

    policy = RetryPolicy(max_attempts=3)
    assert policy.should_retry(result("model_http_503"))
    assert not policy.should_retry(result("model_http_400"))
    assert not policy.should_retry(result("image_build"))
    assert not policy.should_retry(result("model_timeout", attempt=3))
    assert policy.should_retry(result("model_timeout", attempt=2))  # the last retry is still allowed
