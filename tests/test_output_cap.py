"""Output over the serve caps, through the real clients: each dialect says so in its own way
(SandboxFusion: status Failed and a message; E2B: the command's error), never a silent cut.
SWE-ReX's ``failure_reason`` is checked in test_e2b_parity.py (--swerex-max-output)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                       reason="the service needs the server extra (pip install -e '.[server]')"),
]

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService, running_service


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with running_service(tmp_path_factory.mktemp("cap"), args=["--max-ttl", "900", "--max-output", "64",
                                                                "--e2b-max-output", "1"]) as s:
        yield s


@pytest.mark.skipif(importlib.util.find_spec("sandbox_fusion") is None, reason="needs the test extra")
def test_sandboxfusion_marks_a_cut_run_failed(svc: RunningService) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    ep = f"{svc.url}/sandbox-fusion/{svc.token}"
    ok = run_code(RunCodeRequest(code="print('x' * 1000)", language="python"), endpoint=ep, max_attempts=1)
    assert ok.status == RunStatus.Success and ok.message == ""
    big = run_code(RunCodeRequest(code="print('x' * 200_000)", language="python"), endpoint=ep, max_attempts=1)
    assert big.status == RunStatus.Failed, big
    assert "output truncated" in big.message and "--max-output" in big.message and "65536-byte" in big.message
    assert big.run_result is not None and big.run_result.return_code == 0


def test_e2b_command_over_the_cap_fails(svc: RunningService, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2b import Sandbox
    from e2b.exceptions import SandboxException

    for k, v in {"E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}.items():
        monkeypatch.setenv(k, v)
    for k in ("E2B_DEBUG", "E2B_DOMAIN"):
        monkeypatch.delenv(k, raising=False)
    sbx = Sandbox.create(timeout=120)
    try:
        assert len(sbx.commands.run("head -c 500000 /dev/zero | tr '\\0' x").stdout) == 500_000
        with pytest.raises(SandboxException) as ei:
            sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' x")
        assert "output truncated" in str(ei.value) and "--e2b-max-output" in str(ei.value)
        h = sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' x", background=True)
        with pytest.raises(SandboxException, match="e2b-max-output"):
            h.wait()
        assert sbx.commands.run("echo still").stdout == "still\n"
    finally:
        sbx.kill()
