"""mini-swe-agent's environment call shapes (mini itself is not installed in CI:
scripts/test-integrations.sh runs the real ``mini`` against this environment)."""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandfleet.integrations.minisweagent import SandfleetEnvironment, submitted_class
from test_rollout_support import make_task, needs_bwrap

pytestmark = needs_bwrap()


def test_execute_merges_output_honours_cwd_env_and_timeouts() -> None:
    env = SandfleetEnvironment(backend="bwrap", timeout=1, env={"GREETING": "hi"}, memory_mib=256)
    try:
        out = env.execute({"command": "echo $GREETING; echo err >&2; pwd; exit 4"})
        assert out == {"output": "hi\nerr\n/work\n", "returncode": 4, "exception_info": ""}
        assert env.execute({"command": "pwd"}, cwd="/tmp")["output"] == "/tmp\n"
        assert env.execute({"command": "id -u"})["output"] == "1000\n"
        slow = env.execute({"command": "echo started; sleep 30"})
        assert slow["returncode"] == -1 and slow["output"] == "started\n"
        assert "timed out after 1 seconds" in slow["exception_info"]
        assert slow["extra"]["exception_type"] == "TimeoutExpired"
        assert env.execute({"command": "sleep 1.5; echo late"}, timeout=5)["output"] == "late\n"
        with pytest.raises(submitted_class()) as info:
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
        message = info.value.messages[0]  # type: ignore[attr-defined]
        assert message["extra"] == {"exit_status": "Submitted", "submission": "the patch\n"}
        # a failing command with the marker is not a submission
        assert env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false"})["returncode"] == 1
        info_ = env.serialize()["info"]["config"]
        assert info_["environment_type"] == "sandfleet.integrations.minisweagent.SandfleetEnvironment"
        assert info_["environment"]["timeout"] == 1
        assert {"timeout", "system", "release", "x"} <= set(env.get_template_vars(x=1))
        sandbox = env.sandbox
    finally:
        env.close()
    assert not sandbox.alive
    with pytest.raises(RuntimeError, match="closed"):
        env.sandbox  # noqa: B018


def test_task_environment_and_use_from_worker_threads(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    envs = [SandfleetEnvironment(task=str(task.path), backend="bwrap") for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:  # as mini's batch runner does
        outs = list(pool.map(lambda e: e.execute({"command": "pwd && echo hello > out.txt && cat out.txt"}), envs))
    assert [o["output"] for o in outs] == ["/app\nhello\n"] * 2
    boxes = [e.sandbox for e in envs]
    del envs, pool
    gc.collect()  # collected environments close their sandboxes
    assert not any(b.alive for b in boxes)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="extra"):
        SandfleetEnvironment(imagee="host")
    with pytest.raises(ValueError, match="unknown backend 'bwarp'"):  # before any sandbox is made
        SandfleetEnvironment(backend="bwarp")
    with pytest.raises(ValueError, match="memory_mib"):
        SandfleetEnvironment(memory_mib="lots")


def test_a_sandbox_killed_from_outside_ends_the_run_as_an_infra_fault() -> None:
    """mini's own end of a run (an exit message), with exit status InfraFault, the verdict and
    the evidence; a failure the agent can cause stays a returncode -1 it sees."""
    from sandfleet.integrations.minisweagent import infra_fault_class
    from sandfleet.testing.faultpolicies import kill_from_host

    env = SandfleetEnvironment(backend="bwrap", timeout=10, memory_mib=256)
    try:
        assert env.execute({"command": "echo up"})["output"] == "up\n"
        kill_from_host(env.sandbox)
        with pytest.raises(infra_fault_class()) as info:
            env.execute({"command": "echo again"})
        message = info.value.messages[0]  # type: ignore[attr-defined]
        assert message["role"] == "exit" and message["extra"]["exit_status"] == "InfraFault"
        assert message["extra"]["verdict"] == "infra_fault"
        fault = message["extra"]["fault"]
        assert fault["cause"] == "sandbox_died" and fault["sandbox_end"]["signal"] == "SIGKILL"
    finally:
        env.close()
