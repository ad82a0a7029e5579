"""Verdicts from types (issue 43): each error carries its cause, a dead sandbox's error how it
ended; nothing in rollout/verdict.py reads an exception's name or message."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

import sandfleet.errors as errors_module
from sandfleet.errors import (
    ConfigError,
    SandboxDiedError,
    SandboxEnd,
    SandboxUnresponsiveError,
    SandfleetError,
    ServiceError,
    from_wire,
    to_wire,
)
from sandfleet.rollout import verdict
from sandfleet.rollout.runner import failure_reason
from sandfleet.sandbox import create_sandbox
from sandfleet.settings import current, installed
from sandfleet.testing.faultpolicies import kill_from_host
from test_rollout_support import needs_bwrap

VERDICT = Path(verdict.__file__)


def test_no_verdict_code_reads_an_exceptions_name_or_message() -> None:
    """No ``__name__``/``__class__``/``.args``, no ``str(...)``/``type(...)``/``repr(...)``, no
    regular expression in rollout/verdict.py."""
    tree = ast.parse(VERDICT.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("__name__", "__class__", "__qualname__", "args"):
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "type", "repr",
                                                                                              "format"):
            found.append(f"{node.lineno}: {node.func.id}()")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if "re" in names or "traceback" in names:
                found.append(f"{node.lineno}: import {names}")
        elif isinstance(node, ast.JoinedStr):  # an f-string could quote an error
            found.append(f"{node.lineno}: f-string")
    assert not found, found


def _classes() -> list[type[SandfleetError]]:
    out, todo = [], [SandfleetError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return out


def test_no_reason_code_is_a_class_name() -> None:
    """The reason codes the verdict looks up are codes, not exception classes' names."""
    names = {c.__name__ for c in _classes()}
    assert not names & set(verdict.REASON_CAUSES)
    assert set(verdict.REASON_CAUSES.values()) <= set(verdict.CAUSES)


def test_every_error_class_names_a_cause_of_the_table_or_none() -> None:
    for cls in _classes():
        own = cls.__dict__.get("cause")
        assert own is None or isinstance(own, property) or own in verdict.CAUSES, cls
        assert isinstance(cls.reason, str) and cls.reason, cls
    assert errors_module.ImageBuildError.reason == "image_build"  # a class above it says so
    assert failure_reason(SandboxUnresponsiveError("x")) == "agent_unresponsive"
    assert failure_reason(ConfigError("x")) == "ConfigError"
    assert failure_reason(KeyError("x")) == "internal_KeyError"
    refused = errors_module.ImageBuildError("base image 'x': unknown base")
    refused.reason = "unknown base"  # images/bases.py: the coverage group, not the rollout's reason
    assert failure_reason(refused) == "image_build"
    assert verdict.cause_of("failed", None, refused, "start") == "image_build"


@pytest.mark.parametrize(("end", "cause"), [
    (None, "sandbox_died"),
    (SandboxEnd(signal="SIGKILL"), "sandbox_died"),
    (SandboxEnd(signal="SIGKILL", oom_kills=1, own_limit_reached=True), "sandbox_oom"),
    (SandboxEnd(signal="SIGKILL", oom_kills=1, own_limit_reached=False), "sandbox_died"),  # an OOM killer outside
    (SandboxEnd(exit_status=1, oom_kills=3, own_limit_reached=None), "sandbox_oom"),  # cgroup v1: no "oom" count
    (SandboxEnd(exit_status=2, pids_limit_hits=40), "sandbox_pids"),  # gVisor's Sentry after a fork bomb
    (SandboxEnd(signal="SIGKILL", pids_limit_hits=40), "sandbox_died"),  # killed from outside all the same
    (SandboxEnd(exit_status=2, oom_kills=1, own_limit_reached=True, pids_limit_hits=4), "sandbox_oom"),
])
def test_a_dead_sandboxs_cause_is_how_it_ended(end: SandboxEnd | None, cause: str) -> None:
    e = SandboxDiedError("whatever the text says: 9 OOM kill(s) in its memory cgroup", end=end)
    assert e.cause == cause
    assert verdict.cause_of("failed", "sandbox_died", e, "agent") == cause
    # across the wire (a sandbox of a service) the end travels with it
    status, code, extra = to_wire(e) or (0, "", {})
    back = from_wire(status, {"code": code, "message": str(e), **extra})
    assert isinstance(back, SandboxDiedError) and back.end == end and back.cause == cause


def test_an_errors_text_decides_nothing() -> None:
    """The words of a message are not evidence: a model error that quotes a dead sandbox's
    words is not a dead sandbox, a service error says service_unreachable whatever it says."""
    quoting = ServiceError("its process was killed by SIGKILL; 2 OOM kill(s) in its memory cgroup")
    assert verdict.cause_of("failed", "ServiceError", quoting, "agent") == "service_unreachable"
    assert verdict.sandbox_end(quoting) is None


@needs_bwrap()
async def test_a_sandbox_killed_from_the_host_carries_how_it_ended() -> None:
    """A real bwrap sandbox SIGKILLed from the host: its error carries the signal (its owner
    saw the process end), the same words as before, and the cause sandbox_died."""
    sb = await create_sandbox(backend="bwrap", ttl_s=120)
    try:
        assert (await sb.exec(["true"], timeout=10)).exit_code == 0
        kill_from_host(sb)
        with pytest.raises(SandboxDiedError) as info:
            for _ in range(50):
                await sb.exec(["true"], timeout=10)
        with pytest.raises(SandboxDiedError) as again:  # a later call on the dead sandbox: the same evidence
            await sb.exec(["true"], timeout=10)
        assert again.value.end == info.value.end and again.value is not info.value
    finally:
        await sb.close()
    e = info.value
    assert e.end is not None and e.end.signal == "SIGKILL" and e.end.oom_kills == 0, e.end
    assert "its process was killed by SIGKILL" in str(e) and e.head in str(e)
    assert e.cause == "sandbox_died" and failure_reason(e) == "sandbox_died"
    fault = verdict.sandbox_end(e)
    assert fault is not None and fault["signal"] == "SIGKILL" and "its log ends" not in fault["text"]


FORKS = """import os, time
for _ in range(400):
    try:
        if os.fork() == 0:
            os.closerange(0, 3)
            time.sleep(5)
            os._exit(0)
    except OSError:
        pass
"""


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("runsc") or os.geteuid() != 0, reason="needs gVisor's runsc, as root")
async def test_a_sandbox_that_died_of_its_own_fork_bomb_is_the_agents() -> None:
    """gVisor's Sentry needs host processes of its own: a fork bomb of the sandbox's processes
    that reaches its pids limit (160) ends runsc (exit 2, no OOM kill). The dead sandbox's end
    carries the forks its cgroup refused (pids.events), and the cause is sandbox_pids, a policy
    fault: round III's fork-bomb-in-tests was masked so (sandbox_died, infra) 1 run in 3."""
    sb = await create_sandbox(backend="gvisor", ttl_s=120, pids=160)
    try:
        with pytest.raises(SandboxDiedError) as info:
            await sb.exec(["python3", "-c", FORKS], timeout=60)
    finally:
        await sb.close()
    end = info.value.end
    assert end is not None and end.pids_limit_hits > 0 and end.signal is None and not end.oom_kills, end
    assert "fork(s) refused at its own pids limit" in str(info.value)
    assert info.value.cause == "sandbox_pids"
    assert verdict.cause_of("failed", failure_reason(info.value), info.value, "verifier") == "sandbox_pids"


@needs_bwrap()
@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="the service needs the server extra")
async def test_a_service_that_reaped_a_killed_sandbox_still_says_how_it_ended(tmp_path: Path) -> None:
    """A sandbox of a service, SIGKILLed from the host and reaped by the service before the
    client's next call: the answer's error carries the signal (the words as before)."""
    from sandfleet.client.remote import on_remote
    from sandfleet.server.testing import running_service

    async def go() -> SandboxDiedError:
        sb = await create_sandbox(backend="bwrap", ttl_s=120)
        try:
            kill_from_host(sb)
            await asyncio.sleep(2.0)  # the service's reaper (every 0.2 s) closes it meanwhile
            with pytest.raises(SandboxDiedError) as info:
                await sb.exec(["true"], timeout=10)
            return info.value
        finally:
            await sb.close()

    with running_service(tmp_path / "svc") as svc:
        with installed(current().replace(token=svc.token)):
            e = await on_remote(svc.url, go)
    assert str(e).endswith(" died") and e.end is not None and e.end.signal == "SIGKILL", (e, e.end)
    assert verdict.cause_of("failed", failure_reason(e), e, "agent") == "sandbox_died"
    fault = verdict.sandbox_end(e)
    assert fault is not None and fault["signal"] == "SIGKILL" and "killed by SIGKILL" in fault["text"]
