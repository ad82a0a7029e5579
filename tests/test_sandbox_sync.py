"""SyncSandbox: every member of the Sandbox contract, with the same parameters, and each one
working from plain synchronous code on a real sandbox."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from conftest import backend_skip
from sandfleet.errors import GuestError, SandboxClosedError
from sandfleet.sandbox.base import Sandbox, Session
from sandfleet.sandbox.sync import SyncSandbox, SyncSession


def _members(cls: type) -> set[str]:
    """Public names a class declares: annotated attributes, methods, properties."""
    return {n for n in [*vars(cls).get("__annotations__", {}), *vars(cls)] if not n.startswith("_")}


def _params(fn: object) -> list[tuple[str, object, object, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()]


@pytest.mark.parametrize(("contract", "sync"), [(Sandbox, SyncSandbox), (Session, SyncSession)])
def test_every_member_of_the_contract_with_the_same_parameters(contract: type, sync: type) -> None:
    wanted = _members(contract)
    assert {"exec", "read_file", "session", "snapshot", "close"} <= wanted or contract is Session
    missing = wanted - _members(sync)
    assert not missing, f"{sync.__name__} lacks {sorted(missing)}"
    for name in sorted(wanted):
        theirs, ours = getattr(contract, name, None), getattr(sync, name, None)
        if isinstance(theirs, property):
            assert isinstance(ours, property), name
        elif callable(theirs):
            assert callable(ours), name
            assert not inspect.iscoroutinefunction(ours), f"{sync.__name__}.{name} must block, not be a coroutine"
            assert _params(ours) == _params(theirs), f"{sync.__name__}.{name}: parameters differ from the contract"


@pytest.mark.parametrize("backend", ["process", "bwrap"])
def test_sync_sandbox_end_to_end(backend: str, tmp_path: Path) -> None:
    why = backend_skip(backend)
    if why:
        pytest.skip(why)
    seen: list[bytes] = []
    with SyncSandbox(image="host", backend=backend, ttl_s=120) as sb:
        assert sb.alive and sb.backend == backend and sb.spec.backend == backend and sb.id.startswith("sf-")
        res = sb.exec("echo hi; echo err >&2", on_output=lambda stream, data: seen.append(data))
        assert res.exit_code == 0 and res.stdout == "hi\n" and res.stderr == "err\n"
        assert b"".join(seen).count(b"hi") == 1
        assert sb.exec(["cat"], stdin="piped").stdout == "piped"
        sb.write_file("/work/a.txt", "data", mode=0o600)
        assert sb.read_file("/work/a.txt") == b"data"
        with pytest.raises(GuestError, match="read limit"):
            sb.read_file("/work/a.txt", max_bytes=2)
        local = tmp_path / "up"
        local.mkdir()
        (local / "f.txt").write_text("uploaded")
        sb.upload(local, "/work/dst")
        assert sb.exec("cat dst/f.txt").stdout == "uploaded"  # relative: the process backend maps no /work
        got = sb.download("/work/dst", tmp_path / "down")
        assert (got / "f.txt").read_text() == "uploaded"
        session = sb.session(cwd="/work")
        assert session.run("X=5; cd dst").exit_code == 0
        assert session.run("echo $X; cat f.txt").stdout == "5\nuploaded"
        assert session.usable
        session.close()
        pid = sb.exec("sleep 300 >/dev/null 2>&1 & echo $!").stdout.strip()
        assert sb.exec(f"kill -0 {pid} && echo alive").stdout == "alive\n"
        sb.kill_user(sb.spec.user)
        if backend != "process":  # unisolated, the agent kills its jobs' groups only; close() takes the rest
            assert sb.exec(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone").stdout == "gone\n"
        snap = sb.snapshot()
        try:
            assert snap.backend == backend
        finally:
            snap.delete()
    assert not sb.alive
    sb.close()  # a second close does nothing
    with pytest.raises(SandboxClosedError, match="is closed"):
        sb.exec("true")
    with pytest.raises(SandboxClosedError, match="is closed"):
        session.run("true")
