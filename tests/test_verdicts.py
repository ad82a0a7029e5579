"""Verdicts: every rollout ends scored, policy_fault (reward 0) or infra_fault (masked, reward
null), by the one rule of sandfleet/rollout/verdict.py; one test per cause of its table
(docs/rollouts.md), real rollouts where the cause can be made here, and refill in place."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

from sandfleet.cluster.services import HostLostError
from sandfleet.errors import (
    GuestError,
    GuestExecError,
    ImageBuildError,
    ModelError,
    SandboxDiedError,
    SandboxEnd,
    SandboxExpiredError,
    ServiceError,
)
from sandfleet.rollout import OpenAIPolicy, OraclePolicy, RetryPolicy, RunConfig
from sandfleet.rollout.result import RolloutResult, group_advantages
from sandfleet.rollout.suite import run_suite
from sandfleet.rollout.verdict import CAUSES, INFRA, POLICY, RULES, SCORED, cause_of, sandbox_end, settle
from sandfleet.sandbox.state import state_root
from sandfleet.tasks import load_task
from sandfleet.testing.fake_server import FakeModelServer
from sandfleet.testing.faultpolicies import KillFromHost
from test_rollout_support import make_task, run

DOCS = Path(__file__).resolve().parents[1] / "docs" / "rollouts.md"
SOLVE = [{"bash": "echo hello > /app/out.txt"}, "Done."]
KILLED = ("sandbox sb-1: the guest agent's stream ended; its process was killed by SIGKILL; "
          "its log ends: agent: serving")
OOM = ("sandbox sb-1: the guest agent's stream ended; its process was killed by SIGKILL; "
       "2 OOM kill(s) in its memory cgroup; its log ends: agent: serving")

HOST_OOM = ("sandbox sb-1: the guest agent's stream ended; its process was killed by SIGKILL; "
            "1 OOM kill(s) in its memory cgroup; its own memory limit was never reached (killed by an OOM killer "
            "outside its cgroup); its log ends: agent: serving")

PIDS = ("sandbox sb-1: the guest agent's stream ended; its process exited with status 2; "
        "40 fork(s) refused at its own pids limit")


def died(text: str, end: SandboxEnd) -> SandboxDiedError:
    """The error a local sandbox's owner raises (agent/client.py), its text made from ``end``:
    checked to be the text it has always had."""
    head = "sandbox sb-1: the guest agent's stream ended"
    assert f"{head}; {end.describe()}" == text
    return SandboxDiedError(text, end=end, head=f"{head}; {end.describe(log=False)}")


KILLED_E = died(KILLED, SandboxEnd(signal="SIGKILL", log_tail="agent: serving"))
OOM_E = died(OOM, SandboxEnd(signal="SIGKILL", oom_kills=2, own_limit_reached=True, log_tail="agent: serving"))
PIDS_E = died(PIDS, SandboxEnd(exit_status=2, pids_limit_hits=40))  # gVisor's Sentry after a fork bomb
HOST_OOM_E = died(HOST_OOM, SandboxEnd(signal="SIGKILL", oom_kills=1, own_limit_reached=False,
                                       log_tail="agent: serving"))


def _needs_bwrap() -> pytest.MarkDecorator:
    from test_rollout_support import needs_bwrap

    return needs_bwrap()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reaped(sandbox_id: str | None) -> bool:
    return sandbox_id is None or not (state_root() / sandbox_id).exists()


def test_the_rule_is_written_down_cause_by_cause() -> None:
    """docs/rollouts.md's table holds every cause of RULES with its verdict, and nothing else."""
    text = DOCS.read_text()
    rows = dict(re.findall(r"^\| `([a-z_0-9]+)` \| `(scored|policy_fault|infra_fault)` \|", text, re.M))
    assert rows == {r.cause: r.verdict for r in RULES}


# (status, reason, error, phase) -> cause, for each cause of the table; the ones made by real
# rollouts below are checked there too. The error is the exception the rollout failed with where
# its type decides (a text: a reason code alone decides; the text is never read).
CASES = [
    ("completed", None, None, "verifier", "scored"),
    ("completed", "verifier_timeout", "the tests outlived their 2 s limit", "verifier", "verifier_timeout"),
    ("failed", "reward_missing", "no reward file", "verifier", "no_reward_file"),
    ("completed", "no_reward_file", "no reward file", "verifier", "no_reward_file"),
    ("completed", "bad_reward_file", "/logs/verifier/reward.txt: a link", "verifier", "bad_reward_file"),
    ("failed", "reward_malformed", "reward 'abc' is not a number", "verifier", "bad_reward_value"),
    ("completed", "bad_reward_value", "nan", "verifier", "bad_reward_value"),
    ("completed", "reward_conflict", "1 in reward.txt, 0 in reward.json", "verifier", "reward_conflict"),
    ("failed", "verifier_setup", "No space left on device", "verifier", "verifier_setup_failed"),
    ("completed", "verifier_setup_failed", "No space left on device", "verifier", "verifier_setup_failed"),
    ("completed", "tests_killed", "the tests' processes were killed", "verifier", "tests_killed"),
    ("completed", "tests_detached", "1 process(es) of the tests outlived the program that started them", "verifier",
     "tests_detached"),
    ("completed", "tests_status", "the tests' output reads as a pass, but the test command exited 1", "verifier",
     "tests_status"),
    ("completed", "transfer_too_large", "workdir over 1 GiB", "verifier", "transfer_too_large"),
    ("completed", "transfer_refused", "a link leads outside", "verifier", "transfer_too_large"),
    ("failed", "model_http_400", "context window", "agent", "model_content"),
    ("failed", "model_http_413", "too large", "agent", "model_content"),
    ("failed", "model_content", "no action in the reply", "agent", "model_content"),
    ("failed", "sandbox_died", OOM_E, "agent", "sandbox_oom"),
    ("failed", "sandbox_died", PIDS_E, "verifier", "sandbox_pids"),
    ("failed", "agent_unresponsive", "the guest agent did not answer", "agent", "agent_unresponsive"),
    ("failed", "sandbox_timeout", "read_file outlived 30 s", "agent", "sandbox_timeout"),
    ("failed", "no_solution", "task t has no reference solution", "agent", "no_solution"),
    ("failed", "internal_KeyError", "'x'", "agent", "unlisted"),
    ("failed", "GuestExecError", GuestExecError("no such program"), "agent", "unlisted"),
    ("completed", "image_build", "an infra reason on a verified rollout is still the policy's", "verifier",
     "unlisted"),
    ("failed", "GuestError", GuestError("prepare.sh: no such file"), "start", "sandbox_start"),
    ("failed", "prepare_failed", "prepare.sh exited with 3", "start", "sandbox_start"),
    ("failed", "image_build", ImageBuildError("RUN false", file="Dockerfile", line=3), "start", "image_build"),
    ("failed", "sandbox_died", KILLED_E, "agent", "sandbox_died"),
    ("failed", "sandbox_died", HOST_OOM_E, "agent", "sandbox_died"),  # OOM-killed from outside its cgroup
    ("failed", "sandbox_died", SandboxExpiredError("sandbox sb-1 expired (its TTL passed)"), "verifier",
     "sandbox_died"),
    ("failed", "sandbox_died", OOM_E, "start", "sandbox_start"),  # the prepare step's OOM: the agent had not acted
    ("failed", "node_lost", "node n1 was lost", None, "node_lost"),
    ("failed", "no_node", "no node of arch arm64", None, "no_node"),
    ("failed", "model_unreachable", "ConnectError", "agent", "model_unreachable"),
    ("failed", "model_timeout", "ReadTimeout", "agent", "model_timeout"),
    ("failed", "model_http_503", "overloaded", "agent", "model_overloaded"),
    ("failed", "model_http_429", "rate limited", "agent", "model_overloaded"),
    ("failed", "model_http_401", "bad key", "agent", "model_refused_auth"),
    ("failed", "model_malformed", "not a chat completion", "agent", "model_malformed"),
    ("failed", "ServiceError", ServiceError("cannot reach the service at http://h:1"), "agent",
     "service_unreachable"),
    ("failed", "HostLostError", HostLostError("host lost"), "verifier", "service_unreachable"),
    ("failed", "grader_missing", "needs the swebench package", "verifier", "task_grader"),
    ("cancelled", "cancelled", "rollout cancelled", "agent", "cancelled"),
]


@pytest.mark.parametrize(("status", "reason", "error", "phase", "cause"), CASES,
                         ids=[f"{c[4]}-{c[1]}-{c[3]}" for c in CASES])
def test_cause_of_each_ending(status: str, reason: str | None, error: BaseException | str | None,
                              phase: str | None, cause: str) -> None:
    err = error if isinstance(error, BaseException) else None
    assert cause_of(status, reason, err, phase) == cause
    if err is not None:  # the reason the runner records for it is the row's
        from sandfleet.rollout.runner import failure_reason

        assert failure_reason(err) == reason


# (status, reason, reward, verifier outside_share) -> cause: the contention rule (docs/rollouts.md),
# for a task that declares itself load_sensitive; any other task's 0 stands (below)
CONTENTION_CASES = [
    ("completed", None, 0.0, 0.6, "host_contention"),  # failing tests under outside contention: masked
    ("completed", "verifier_timeout", 0.0, 0.6, "host_contention"),
    ("completed", None, 0.5, 0.5, "host_contention"),  # below 1 is failing
    ("completed", None, 1.0, 0.9, "scored"),  # a passing one stays scored
    ("completed", None, 0.0, 0.45, "scored"),  # below the threshold: the 0 stands
    ("completed", None, 0.0, None, "scored"),  # not measured: never masked
    ("completed", "bad_reward_file", 0.0, 0.9, "bad_reward_file"),  # not what a slow CPU makes
    ("failed", "sandbox_timeout", None, 0.9, "sandbox_timeout"),
]


@pytest.mark.parametrize(("status", "reason", "reward", "share", "cause"), CONTENTION_CASES)
def test_cause_under_contention(status: str, reason: str | None, reward: float | None, share: float | None,
                                cause: str) -> None:
    assert cause_of(status, reason, None, "verifier", reward=reward, outside_share=share, load_sensitive=True) == cause
    # a task that does not declare it: its failure under any contention is the 0 it scored
    undeclared = cause_of(status, reason, None, "verifier", reward=reward, outside_share=share)
    assert undeclared == (cause if cause != "host_contention" else ("verifier_timeout" if reason else "scored"))


def test_every_cause_of_the_table_has_a_case() -> None:
    assert {c[4] for c in CASES} | {c[4] for c in CONTENTION_CASES} == set(CAUSES)


def _result(status: str, reason: str | None, reward: float | None, error: BaseException | str | None = None,
            phase: str | None = None, sample: int = 0) -> RolloutResult:
    """A result as the runner leaves it: settled with the exception it failed with, where there is one."""
    r = RolloutResult(f"t#{sample}", "t", "t", sample, "a", "bwrap", 0.0, 1.0, status, [], reason=reason,  # type: ignore[arg-type]
                      reward=reward, error=str(error) if error is not None else None,
                      info={"phase": phase} if phase else {})
    if isinstance(error, BaseException):
        settle(r, error)
    return r


def test_settle_sets_reward_and_evidence() -> None:
    masked = _result("failed", "sandbox_died", None, KILLED_E, "agent")
    assert settle(masked) == INFRA and masked.reward is None and masked.masked
    assert masked.fault is not None and masked.fault["cause"] == "sandbox_died"
    assert masked.fault["sandbox_end"]["signal"] == "SIGKILL" and masked.fault["sandbox_end"]["oom_kills"] == 0
    assert masked.fault["log_tail"] == "agent: serving"
    oom = _result("failed", "sandbox_died", None, OOM_E, "agent")
    assert settle(oom) == POLICY and oom.reward == 0.0 and oom.fault and oom.fault["sandbox_end"]["oom_kills"] == 2
    scored = _result("completed", None, 0.0)
    assert settle(scored) == SCORED and scored.fault is None and scored.reward == 0.0
    # a masked row's reward is null in both files, never 0; a policy fault's is 0
    assert masked.to_record()["reward"] is None and masked.to_trace()["verdict"] == INFRA
    assert oom.to_record()["reward"] == 0.0 and oom.to_record()["verdict"] == POLICY
    assert sandbox_end(ModelError("model server answered HTTP 500", reason="model_http_500")) is None
    assert masked.fault["sandbox_end"]["text"] == "sandbox sb-1: the guest agent's stream ended; its process was " \
        "killed by SIGKILL"


def test_group_statistics_leave_masked_members_out() -> None:
    rs = [_result("completed", None, 1.0, sample=0), _result("completed", None, 0.0, sample=1),
          _result("failed", "reward_missing", None, "no reward", "verifier", sample=2),
          _result("failed", "sandbox_died", None, KILLED_E, "agent", sample=3)]
    stats = group_advantages(rs)
    assert stats["n"] == 3 and stats["masked"] == 1 and stats["complete"] is False
    assert stats["mean"] == pytest.approx(1 / 3)  # the policy fault counts as 0, the masked one not at all
    assert rs[3].advantage is None and rs[2].advantage is not None and rs[2].advantage < 0


def test_retry_refills_infra_faults_only() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert policy.should_retry(_result("failed", "sandbox_died", None, KILLED_E, "agent"))
    assert policy.should_retry(_result("failed", "node_lost", None, "lost"))
    assert not policy.should_retry(_result("failed", "sandbox_died", None, OOM_E, "agent"))  # its own OOM
    assert not policy.should_retry(_result("failed", "reward_missing", None, "none", "verifier"))
    assert not policy.should_retry(_result("failed", "model_http_400", None, "too long", "agent"))


# -- real rollouts (bwrap) -------------------------------------------------------------------

SLEEPY_TESTS = "#!/bin/bash\nsleep 30\n"
NO_REWARD = "#!/bin/bash\necho 'tests ran, wrote nothing'\n"
BAD_VALUE = "#!/bin/bash\nmkdir -p /logs/verifier; echo abc > /logs/verifier/reward.txt\n"
LINKED = "#!/bin/bash\nmkdir -p /logs/verifier; ln -sf /etc/hostname /logs/verifier/reward.txt\n"


@_needs_bwrap()
async def test_verdicts_of_real_rollouts(tmp_path: Path) -> None:
    """One run with a task per cause that a task folder can make: each row's verdict, cause
    and reward, in the result and in both files; the summary counts them."""
    tasks = [
        make_task(tmp_path, "hello"),
        make_task(tmp_path, "wrong", solve="echo nope > /app/out.txt"),
        make_task(tmp_path, "slow-agent", solve="sleep 30", agent_timeout=2),
        make_task(tmp_path, "slow-tests", test_sh=SLEEPY_TESTS, verifier_timeout=2),
        make_task(tmp_path, "no-reward", test_sh=NO_REWARD),
        make_task(tmp_path, "bad-value", test_sh=BAD_VALUE),
        make_task(tmp_path, "linked", test_sh=LINKED),
        make_task(tmp_path, "prep-fails", prepare="#!/bin/bash\necho broken prepare; exit 3\n"),
        make_task(tmp_path, "disk-full", solve="head -c 400000000 /dev/zero > /app/fill; df -h /app; true"),
    ]
    nosol = make_task(tmp_path, "no-solution")
    shutil.rmtree(nosol.path / "solution")
    tasks.append(load_task(nosol.path))
    out = tmp_path / "out"
    report = await run(tasks, OraclePolicy(), out, concurrency=4, retry=RetryPolicy(max_attempts=2, backoff_s=0.01))
    by = {r.task: r for r in report.results}
    want = {"hello": (SCORED, None, 1.0), "wrong": (SCORED, None, 0.0), "slow-agent": (SCORED, None, 0.0),
            "slow-tests": (POLICY, "verifier_timeout", 0.0), "no-reward": (POLICY, "no_reward_file", 0.0),
            "bad-value": (POLICY, "bad_reward_value", 0.0), "linked": (POLICY, "bad_reward_file", 0.0),
            "prep-fails": (INFRA, "sandbox_start", None), "no-solution": (POLICY, "no_solution", 0.0),
            "disk-full": (POLICY, "verifier_setup_failed", 0.0)}
    got = {t: (r.verdict, (r.fault or {}).get("cause"), r.reward) for t, r in by.items()}
    assert got == want
    assert by["slow-agent"].stop_reason == "agent_timeout"  # still verified and scored
    assert "broken prepare" in (by["prep-fails"].fault or {}).get("log_tail", "")
    assert all(r.attempt == 1 for r in report.results)  # policy faults never retried, nor a broken prepare
    assert all(reaped(a.sandbox_id) for a in report.attempts)
    rows = {json.loads(x)["task"]: json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()}
    assert {t: (r["verdict"], r["reward"]) for t, r in rows.items()} == {t: (v, w) for t, (v, _, w) in want.items()}
    assert rows["prep-fails"]["fault"]["phase"] == "start" and "fault" not in rows["hello"]
    traces = [json.loads(x) for x in (out / "trace.jsonl").read_text().splitlines()]
    assert all(t["verdict"] in (SCORED, POLICY, INFRA) for t in traces) and len(traces) == len(tasks)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdicts"] == {SCORED: 3, POLICY: 6, INFRA: 1}
    assert summary["mask_rate"] == pytest.approx(1 / 10)
    assert summary["pass_rate"] == pytest.approx(1 / 9)  # over scored and policy faults
    assert summary["masked_causes"] == {"sandbox_start": 1} and summary["refilled"] == 0
    assert summary["policy_fault_causes"] == {"verifier_timeout": 1, "no_reward_file": 1, "bad_reward_value": 1,
                                              "bad_reward_file": 1, "no_solution": 1, "verifier_setup_failed": 1}


@_needs_bwrap()
async def test_model_server_faults(tmp_path: Path) -> None:
    """500s and answers that are not chat completions, after the retry: masked. A request the
    server refuses for the conversation the policy built (400): the policy's fault."""
    task = make_task(tmp_path)
    retry = RetryPolicy(max_attempts=2, backoff_s=0.01)
    for fault, verdict, cause in (("500", INFRA, "model_overloaded"), ("429", INFRA, "model_overloaded"),
                                  ("malformed", INFRA, "model_malformed")):
        with FakeModelServer(SOLVE, faults=[fault] * 2) as server:
            report = await run([task], OpenAIPolicy(server.url, "m"), retry=retry)
        r = report.results[0]
        assert (r.verdict, (r.fault or {}).get("cause"), r.reward, r.attempt) == (verdict, cause, None, 2), fault
    with FakeModelServer([{"fault": "400"}]) as server:  # every request of the first turn: 400
        report = await run([task], OpenAIPolicy(server.url, "m"), retry=retry)
    r = report.results[0]
    assert (r.verdict, (r.fault or {}).get("cause"), r.reward, r.attempt) == (POLICY, "model_content", 0.0, 1)


@_needs_bwrap()
async def test_refused_model_server_is_masked_within_60_s_with_default_flags(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    policy = OpenAIPolicy(f"http://127.0.0.1:{closed_port()}/v1", "m", api_key="")
    t0 = time.monotonic()
    report = await run_suite([task], policy, RunConfig(backend="bwrap"), out_dir=None)  # sandfleet run's defaults
    seconds = time.monotonic() - t0
    r = report.results[0]
    assert (r.verdict, (r.fault or {}).get("cause"), r.reward) == (INFRA, "model_unreachable", None)
    assert r.attempt == RunConfig().retry.max_attempts and seconds < 60, seconds


@_needs_bwrap()
async def test_a_killed_member_is_refilled_in_place(tmp_path: Path) -> None:
    """n=3, one member's sandbox killed from the host: that member alone runs again (same
    task, group and sample) and the group ends whole; with no attempt left it is masked
    instead, the group incomplete, its statistics over the other two."""
    task = make_task(tmp_path)
    out = tmp_path / "refill"
    report = await run([task], KillFromHost(1), out, n=3, retry=RetryPolicy(max_attempts=2, backoff_s=0.01))
    assert [r.verdict for r in report.results] == [SCORED] * 3 and [r.reward for r in report.results] == [1.0] * 3
    killed = [a for a in report.attempts if a.verdict == INFRA]
    assert len(killed) == 1 and not killed[0].final and killed[0].fault
    assert killed[0].fault["cause"] == "sandbox_died" and killed[0].fault["sandbox_end"]["signal"] == "SIGKILL"
    again = [a for a in report.attempts if a.sample == killed[0].sample]
    assert [a.attempt for a in again] == [1, 2] and len(report.attempts) == 4  # nobody else ran again
    group = json.loads((out / "groups.jsonl").read_text())
    assert group["complete"] is True and group["masked"] == 0 and group["n"] == 3
    assert all(reaped(a.sandbox_id) for a in report.attempts)

    out = tmp_path / "masked"
    report = await run([task], KillFromHost(1), out, n=3, retry=RetryPolicy(max_attempts=1))
    masked = [r for r in report.results if r.verdict == INFRA]
    assert len(masked) == 1 and masked[0].reward is None and masked[0].advantage is None
    group = json.loads((out / "groups.jsonl").read_text())
    assert group["complete"] is False and group["masked"] == 1 and group["n"] == 2
    assert group["advantages"][masked[0].rollout_id] is None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdicts"][INFRA] == 1 and summary["pass_rate"] == 1.0 and summary["groups_incomplete"] == 1
    check_analyze_counts_verdicts(out, tmp_path / "report.html")


def check_analyze_counts_verdicts(run_dir: Path, html: Path) -> None:
    """``sandfleet analyze`` of a run with one masked member of 3: text, JSON and HTML."""
    from click.testing import CliRunner

    from sandfleet.cli.analyze import analyze

    res = CliRunner().invoke(analyze, [str(run_dir), "--json"])
    assert res.exit_code == 0, res.output
    runs = json.loads(res.output)["runs"]["A"]
    assert runs["verdicts"] == {SCORED: 2, POLICY: 0, INFRA: 1}
    assert runs["mask_rate"] == pytest.approx(1 / 3) and runs["pass_rate"] == 1.0 and runs["refilled"] == 0
    res = CliRunner().invoke(analyze, [str(run_dir)])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("A ") and "33.3 %" in x)
    assert line.split()[1:4] == ["2", "0", "1"], res.output
    res = CliRunner().invoke(analyze, [str(run_dir), "--html", str(html)])
    assert res.exit_code == 0, res.output
    assert "<h2>Verdicts</h2>" in html.read_text() and "33.3 %" in html.read_text()


@_needs_bwrap()
@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="the service needs the server extra")
async def test_a_killed_member_is_refilled_in_place_with_remote(tmp_path: Path) -> None:
    """The same with ``--remote``: the sandbox dies on the service, that member alone runs again."""
    from sandfleet.client.remote import on_remote
    from sandfleet.server.testing import running_service

    task = make_task(tmp_path)
    with running_service(tmp_path / "svc") as svc:
        os.environ["SANDFLEET_TOKEN"] = svc.token
        try:
            report = await on_remote(svc.url, lambda: run([task], KillFromHost(1), tmp_path / "out", n=2,
                                                          retry=RetryPolicy(max_attempts=2, backoff_s=0.01)))
        finally:
            del os.environ["SANDFLEET_TOKEN"]
    assert [(r.verdict, r.reward) for r in report.results] == [(SCORED, 1.0)] * 2
    killed = [a for a in report.attempts if a.verdict == INFRA]
    assert len(killed) == 1 and not killed[0].final and len(report.attempts) == 3, \
        [(a.rollout_id, a.reason, a.error) for a in report.attempts]
    assert killed[0].fault and killed[0].fault["cause"] == "sandbox_died", killed[0].fault
    assert killed[0].fault["sandbox_end"]["signal"] == "SIGKILL"  # the service relays how it died
