"""SWE-ReX's own ``RemoteRuntime`` against ``/swerex/<sandbox-id>/`` of a real ``sandfleet serve``
on loopback: sessions, errors as SWE-ReX's exceptions, files, zipped upload, two sandboxes."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastapi") is None,
                                reason="the service needs the server extra (pip install -e '.[server]')")

if importlib.util.find_spec("fastapi") is not None:
    from sandfleet.server.testing import RunningService


@pytest.fixture(scope="module")
def svc(running_services: Any) -> RunningService:
    """The session's shared service, with two tokens of this module's own (tests/conftest.py)."""
    return running_services.view("--max-ttl", "900")


def make_sandbox(svc: RunningService) -> str:
    r = httpx.post(f"{svc.url}/v1/sandboxes", json={"limits": {"ttl_s": 300}},
                   headers={"Authorization": f"Bearer {svc.token}"}, timeout=60)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_remote_runtime(svc: RunningService, tmp_path: Path) -> None:
    from swerex.exceptions import CommandTimeoutError, NonZeroExitCodeError, SessionDoesNotExistError
    from swerex.runtime.abstract import (
        BashAction,
        BashInterruptAction,
        CloseBashSessionRequest,
        Command,
        CreateBashSessionRequest,
        ReadFileRequest,
        UploadRequest,
        WriteFileRequest,
    )
    from swerex.runtime.remote import RemoteRuntime

    ids = [make_sandbox(svc), make_sandbox(svc)]
    rts = [RemoteRuntime(host=f"{svc.url}/swerex/{i}", port=None, auth_token=svc.token, timeout=30) for i in ids]
    src = tmp_path / "tools"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "hello").write_text("#!/bin/sh\necho hello from tools\n")
    (src / "bin" / "hello").chmod(0o755)
    (src / "README").write_text("tools\n")
    single = tmp_path / "one.txt"
    single.write_text("single file\n")

    async def drive(rt: RemoteRuntime, n: int) -> None:
        assert (await rt.is_alive()).is_alive
        await rt.create_session(CreateBashSessionRequest())
        # shell state across commands
        await rt.run_in_session(BashAction(command=f"export MARK=box{n}; mkdir -p /tmp/w{n}; cd /tmp/w{n}"))
        obs = await rt.run_in_session(BashAction(command="echo $MARK; pwd"))
        assert obs.output.split() == [f"box{n}", f"/tmp/w{n}"] and obs.exit_code == 0
        obs = await rt.run_in_session(BashAction(command="echo oops >&2; false", check="silent"))
        assert obs.exit_code == 1 and "oops" in obs.output
        assert (await rt.run_in_session(BashAction(command="false", check="ignore"))).exit_code is None
        with pytest.raises(NonZeroExitCodeError):
            await rt.run_in_session(BashAction(command="exit 3"))
        with pytest.raises(CommandTimeoutError):
            await rt.run_in_session(BashAction(command="sleep 30", timeout=1))
        await rt.run_in_session(BashInterruptAction())
        assert (await rt.run_in_session(BashAction(command="echo $MARK"))).output.strip() == f"box{n}"
        # execute
        r = await rt.execute(Command(command=["sh", "-c", "echo out; echo err >&2; exit 2"]))
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 2)
        with pytest.raises(NonZeroExitCodeError):
            await rt.execute(Command(command="exit 4", shell=True, check=True))
        with pytest.raises(CommandTimeoutError):
            await rt.execute(Command(command="sleep 30", shell=True, timeout=1))
        # files
        await rt.write_file(WriteFileRequest(path=f"/tmp/f{n}/deep/a.txt", content=f"content {n}\n"))
        assert (await rt.read_file(ReadFileRequest(path=f"/tmp/f{n}/deep/a.txt"))).content == f"content {n}\n"
        with pytest.raises(FileNotFoundError):
            await rt.read_file(ReadFileRequest(path="/tmp/no-such-file"))
        # zipped upload of a directory, and a single file
        await rt.upload(UploadRequest(source_path=str(src), target_path="/root/tools"))
        obs = await rt.run_in_session(BashAction(command="/root/tools/bin/hello; cat /root/tools/README"))
        assert obs.output.split("\n")[:2] == ["hello from tools", "tools"]
        await rt.upload(UploadRequest(source_path=str(single), target_path="/tmp/up/one.txt"))
        assert (await rt.read_file(ReadFileRequest(path="/tmp/up/one.txt"))).content == "single file\n"
        await rt.close_session(CloseBashSessionRequest())
        with pytest.raises(SessionDoesNotExistError):
            await rt.run_in_session(BashAction(command="true"))
        # each sandbox keeps its own files: the other's path is not here
        assert (await rt.read_file(ReadFileRequest(path=f"/tmp/f{n}/deep/a.txt"))).content == f"content {n}\n"
        with pytest.raises(FileNotFoundError):
            await rt.read_file(ReadFileRequest(path=f"/tmp/f{1 - n}/deep/a.txt"))
        await rt.close()  # ends the sandbox (SWE-agent's remote deployment stops this way)

    async def main() -> None:
        await asyncio.gather(*(drive(rt, n) for n, rt in enumerate(rts)))

    asyncio.run(main())
    # close ended both sandboxes: their ids answer as deleted, on SWE-ReX's routes and on /v1
    for i in ids:
        r = httpx.get(f"{svc.url}/swerex/{i}/is_alive", headers={"X-API-Key": svc.token})
        assert r.status_code in (404, 410) and "deleted" in r.json()["detail"]
        r = httpx.get(f"{svc.url}/v1/sandboxes/{i}", headers={"Authorization": f"Bearer {svc.token}"})
        assert r.status_code in (404, 410)


def test_auth_and_unknown(svc: RunningService) -> None:
    sid = make_sandbox(svc)
    with httpx.Client(base_url=svc.url, timeout=30) as h:
        assert h.get(f"/swerex/{sid}/is_alive").status_code == 401
        assert h.get(f"/swerex/{sid}/is_alive", headers={"X-API-Key": "x" * 20}).status_code == 401
        assert h.get(f"/swerex/{sid}/is_alive", headers={"X-API-Key": svc.tokens[1]}).status_code == 404
        assert h.get("/swerex/nope/is_alive", headers={"X-API-Key": svc.token}).status_code == 404


def test_request_models_and_the_error_mapper(svc: RunningService) -> None:
    """The bodies are read through the request models: a field of the wrong type is a 422
    naming it (swerex-remote's own answer), a missing one too, fields SWE-ReX sends that
    sandfleet does not use are ignored; a sandbox error is a 511 swerexception naming the class
    the client raises again (builtins.FileNotFoundError)."""
    sid = make_sandbox(svc)
    key = {"X-API-Key": svc.token}
    with httpx.Client(base_url=f"{svc.url}/swerex/{sid}", timeout=30, headers=key) as h:
        r = h.post("/execute", json={"command": "echo hi", "shell": True, "timeout": "soon"})
        assert r.status_code == 422 and "malformed body" in r.json()["detail"] and "timeout" in r.json()["detail"]
        r = h.post("/read_file", json={"encoding": "utf-8"})
        assert r.status_code == 422 and "path" in r.json()["detail"]
        r = h.post("/execute", json={"command": ["echo", "hi"], "timeout": 5, "no_such_field": 1})
        assert r.status_code == 200 and r.json()["stdout"] == "hi\n"
        r = h.post("/read_file", json={"path": "/nope/missing"})
        assert r.status_code == 511
        exc = r.json()["swerexception"]
        assert exc["class_path"] == "builtins.FileNotFoundError" and "/nope/missing" in exc["message"]
        r = h.post("/run_in_session", json={"session": "none-such", "command": "true"})
        assert r.status_code == 511 and r.json()["swerexception"]["class_path"].endswith("SessionDoesNotExistError")
        r = h.post("/execute", content=b"{not json")
        assert r.status_code == 422 and "malformed body" in r.json()["detail"]


def test_remote_deployment(svc: RunningService) -> None:
    """SWE-agent's `remote` deployment: RemoteDeploymentConfig -> start, a command, stop."""
    from swerex.deployment.config import RemoteDeploymentConfig
    from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest

    sid = make_sandbox(svc)
    cfg = RemoteDeploymentConfig(host=f"{svc.url}/swerex/{sid}", port=None, auth_token=svc.token, timeout=10)

    async def main() -> None:
        dep = cfg.get_deployment()
        await dep.start()
        assert (await dep.is_alive()).is_alive
        assert (await dep.runtime.execute(Command(command="echo $0", shell=True))).stdout.strip() == "bash"
        await dep.runtime.create_session(CreateBashSessionRequest(startup_source=["/etc/profile"]))
        assert (await dep.runtime.run_in_session(BashAction(command="whoami"))).output.strip() == "root"
        await dep.stop()

    asyncio.run(main())
