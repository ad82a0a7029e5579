"""``Sandbox.branch(n)`` (issue 44, docs/branching.md "The primitive"): real sandboxes on each
backend that branches, the service route, the E2B dialect's fork and the sync wrapper."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from conftest import backend_skip
from sandfleet.errors import BranchError, ConfigError, HostUnsupportedError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.state import list_sandboxes
from support import until

LOCAL = ["bwrap", "gvisor"]  # filesystem and sessions carried, not processes
HAS_SERVER = importlib.util.find_spec("fastapi") is not None


# a background sleep, started so that the exec returns only once the forked shell has become
# sleep: a branch right after it must name "sleep", not the bash that was about to exec it
START_SLEEP = "sleep 300 >/dev/null 2>&1 & while [ \"$(cat /proc/$!/comm 2>/dev/null)\" != sleep ]; do :; done"


async def has(sb: Sandbox, path: str) -> bool:
    return (await sb.exec(["test", "-e", path])).exit_code == 0


@pytest.fixture(params=LOCAL)
async def src(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    why = backend_skip(request.param)
    if why:
        pytest.skip(why)
    box = await create_sandbox(backend=request.param, ttl_s=300)
    try:
        yield box
    finally:
        await box.close()


async def test_children_carry_files_and_sessions_and_part_afterwards(src: Sandbox) -> None:
    s = src.session()
    r = await s.run("cd /tmp && export FOO=bar; X=1; f() { echo fn$1; }; alias hi='echo alias'; "
                    "echo before > /home/agent/before.txt")
    assert r.exit_code == 0, r.output
    kids = await src.branch(3)
    try:
        assert len(kids) == 3 and len({k.id for k in kids} | {src.id}) == 4
        for i, k in enumerate(kids):
            info = k.branch_info  # type: ignore[attr-defined]
            assert info.parent == src.id and info.index == i and info.carried == ["filesystem", "sessions"]
            assert (await k.read_file("/home/agent/before.txt")) == b"before\n"
            # the session goes on: cwd, exported and shell variables, functions, aliases
            (ks,) = info.sessions
            r = await ks.run("shopt -s expand_aliases 2>/dev/null; echo $PWD $FOO $X; f 2; type -t hi || true")
            assert r.stdout.split()[:4] == ["/tmp", "bar", "1", "fn2"], r.output
        # a fresh identity each: hostname, machine-id
        names = [(await k.exec("hostname")).stdout.strip() for k in kids]
        assert names == [k.id for k in kids]
        ids = {(await k.read_file("/etc/machine-id")).strip() for k in kids}
        assert len(ids) == 3
        # after the branch: each writes its own, sees no one else's, nor the source's later writes
        for i, k in enumerate(kids):
            await k.write_file(f"/home/agent/kid{i}.txt", str(i))
        await src.write_file("/home/agent/later.txt", "later")
        for i, k in enumerate(kids):
            assert await has(k, f"/home/agent/kid{i}.txt")
            others = [j for j in range(3) if j != i]
            assert not any([await has(k, f"/home/agent/kid{j}.txt") for j in others])
            assert not await has(k, "/home/agent/later.txt")
        assert not any([await has(src, f"/home/agent/kid{j}.txt") for j in range(3)])
        # the source goes on: its files, its session, its id
        assert (await src.read_file("/home/agent/later.txt")) == b"later"
        assert (await s.run("echo $PWD $X")).stdout.split() == ["/tmp", "1"]
        # a child branches again (a second sealed layer on the stack)
        grand = await kids[0].branch(2)
        try:
            for g in grand:
                assert await has(g, "/home/agent/kid0.txt") and await has(g, "/home/agent/before.txt")
                assert not await has(g, "/home/agent/kid1.txt")
        finally:
            await asyncio.gather(*(g.close() for g in grand))
    finally:
        await asyncio.gather(*(k.close() for k in kids))


async def test_a_directory_made_before_the_branch_is_listed_and_read_in_each_child(src: Sandbox) -> None:
    """coreutils' ls and stat, as a task's tests use them (the example's test.sh: ls | wc -l).
    On gvisor they failed everywhere, branch or not ("ls: cannot access '/tmp/d': Invalid
    argument"): Debian's runsc refuses statx's AT_NO_AUTOMOUNT, which the stat shim drops
    (agent/statcompat.c); a caller's own LD_PRELOAD keeps it."""
    r = await src.exec("mkdir -p /tmp/d/sub && echo hi > /tmp/d/f && echo top > /tmp/t")
    assert r.exit_code == 0, r.output
    kids = await src.branch(2)
    try:
        for i, k in enumerate(kids):
            r = await k.exec(f"ls /tmp/d && cat /tmp/d/f /tmp/t && stat -c '%F %n' /tmp/d /tmp/d/sub && "
                             f"echo {i} > /tmp/d/g{i} && ls /tmp/d | wc -l")
            assert r.exit_code == 0, r.output
            assert r.stdout.split("\n") == ["f", "sub", "hi", "top", "directory /tmp/d", "directory /tmp/d/sub",
                                             "3", ""], r.output
            r = await k.exec("ls -d /tmp/d", env={"LD_PRELOAD": ""})  # a caller's own (empty) LD_PRELOAD
            assert (r.exit_code, r.stdout) == (0, "/tmp/d\n"), r.output
        assert (await src.exec("ls /tmp/d")).stdout.split() == ["f", "sub"]  # no child's g0, g1
    finally:
        await asyncio.gather(*(k.close() for k in kids))


async def test_calls_during_a_branch_wait_and_land_after_it(src: Sandbox) -> None:
    """A call made on the source while it branches waits, then runs on the source after the
    branch: the children never see it (a terminal command too: it needs the guest agent itself)."""
    task = asyncio.ensure_future(src.branch(2))
    await asyncio.sleep(0)  # the branch holds the source's calls from its first step
    r = await src.exec("echo during > /home/agent/during.txt")
    t = await src.exec("tty", pty=(80, 24))
    kids = await task
    try:
        assert r.exit_code == 0 and t.exit_code == 0 and "/dev/pts" in t.stdout
        assert (await src.read_file("/home/agent/during.txt")) == b"during\n"
        assert not any([await has(k, "/home/agent/during.txt") for k in kids])
    finally:
        await asyncio.gather(*(k.close() for k in kids))


async def test_processes_are_named_or_dropped(src: Sandbox) -> None:
    await src.exec(START_SLEEP)
    with pytest.raises(BranchError) as ei:
        await src.branch(2)
    assert "sleep 300" in str(ei.value) and ei.value.processes
    pid, comm, cmd = ei.value.processes[0]
    assert comm == "sleep" and cmd == "sleep 300" and f"pid {pid}" in str(ei.value)
    await src.write_file("/home/agent/f.txt", "x")
    kids = await src.branch(2, processes="drop")
    copied = kids[0].stack[0]  # type: ignore[attr-defined]  # the copy of the layer (processes left running)
    assert copied.refs == 2 and copied is kids[1].stack[0]  # type: ignore[attr-defined]
    try:
        for k in kids:
            assert k.branch_info.dropped == ei.value.processes  # type: ignore[attr-defined]
            assert (await k.read_file("/home/agent/f.txt")) == b"x"
            assert "sleep 300" not in (await k.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")).stdout
        # the source keeps its process
        assert "sleep 300" in (await src.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")).stdout
    finally:
        await asyncio.gather(*(k.close() for k in kids))
    assert copied.refs == 0 and copied._cleanup is None  # removed with the last child


async def test_bad_counts_and_unsupported() -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    sb = await create_sandbox(backend="bwrap", ttl_s=120)
    try:
        for bad in (0, 101, True, "2"):
            with pytest.raises(ConfigError, match="branch count"):
                await sb.branch(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="processes"):
            await sb.branch(1, processes="keep")  # type: ignore[arg-type]
    finally:
        await sb.close()
    p = await create_sandbox(backend="process", ttl_s=60)
    try:
        with pytest.raises(HostUnsupportedError, match="can't branch"):
            await p.branch(1)
    finally:
        await p.close()


def _loop_backing(loop_path: str) -> str | None:
    try:
        return (Path("/sys/block") / Path(loop_path).name / "loop/backing_file").read_text().strip()
    except OSError:
        return None


async def test_nothing_is_left(src: Sandbox) -> None:
    """After everyone closes: no marker, no cgroup, the sealed disk let go (its loop device
    detached), and the branch's held layers freed."""
    from sandfleet.sandbox import cgroups

    loop = getattr(src, "loop", None)
    if loop is None:
        pytest.skip("this host gives sandboxes a tmpfs layer (no loop devices): the copy path")
    backing = _loop_backing(loop.path)
    assert backing
    await src.write_file("/home/agent/a.txt", "a")
    kids = await src.branch(2)
    grand = await kids[0].branch(1)
    stack = [h for b in [src, *kids, *grand] for h in b.stack]  # type: ignore[attr-defined]
    assert stack and all(h.refs > 0 for h in stack)
    ids = {b.id for b in [*kids, *grand]}
    await asyncio.gather(*(b.close() for b in [*grand, *kids, src]))
    assert all(h.refs == 0 for h in stack)
    live = {m["id"] for m in list_sandboxes()}
    assert not ids & live
    assert not {i for i in ids if any(n == i for n in cgroups.leftover_names())}
    await until(lambda: _loop_backing(loop.path) != backing, timeout=15)


async def test_sync_wrapper() -> None:
    from sandfleet.sandbox.sync import SyncSandbox

    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)

    def go() -> None:
        with SyncSandbox(backend="bwrap", ttl_s=120) as sb:
            sb.session().run("cd /tmp; Y=9")
            kids = sb.branch(2)
            assert [k.branch_info.carried for k in kids] == [["filesystem", "sessions"]] * 2
            assert kids[0].sessions()[0].run("echo $Y $PWD").stdout.split() == ["9", "/tmp"]
            sb.close()  # the children keep the loop
            assert kids[1].exec("echo alive").stdout == "alive\n"
            for k in kids:
                k.close()

    await asyncio.to_thread(go)


# -- over the service


@pytest.fixture(scope="module")
def svc(running_services: Any) -> Any:
    if not HAS_SERVER:
        pytest.skip("the service needs the server extra (pip install -e '.[server]')")
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    return running_services.view("--max-ttl", "900")


async def test_service_route(svc: Any) -> None:
    from sandfleet.client.service import connect
    from sandfleet.sandbox.spec import make_spec

    async with await connect(svc.url, svc.token) as client:
        await _service_route(client, make_spec(backend="bwrap", ttl_s=300))


async def _service_route(client: Any, spec: Any) -> None:
    sb = await client.create(spec)
    try:
        s = sb.session()
        await s.run("cd /tmp; Z=3; echo hi > /home/agent/a.txt")
        kids = await sb.branch(2)
        try:
            for k in kids:
                assert k.branch_info.carried == ["filesystem", "sessions"]  # type: ignore[attr-defined]
                assert (await k.read_file("/home/agent/a.txt")) == b"hi\n"
                r = await k.branch_info.sessions[0].run("echo $Z $PWD")  # type: ignore[attr-defined]
                assert r.stdout.split() == ["3", "/tmp"]
            await kids[0].write_file("/home/agent/k.txt", "k")
            assert not await has(kids[1], "/home/agent/k.txt") and not await has(sb, "/home/agent/k.txt")
        finally:
            await asyncio.gather(*(k.close() for k in kids))
        await sb.exec(START_SLEEP)
        with pytest.raises(BranchError, match=r"pid \d+ sleep \(sleep 300\)"):
            await sb.branch(1)
        dropped = await sb.branch(1, processes="drop")
        assert dropped[0].branch_info.dropped[0][1:] == ("sleep", "sleep 300")  # type: ignore[attr-defined]
        await dropped[0].close()
    finally:
        await sb.close()


@pytest.mark.skipif(importlib.util.find_spec("e2b") is None, reason="the e2b SDK is not installed")
def test_e2b_fork_is_a_branch(svc: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"E2B_API_URL": svc.url, "E2B_SANDBOX_URL": svc.url, "E2B_API_KEY": svc.token}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    from e2b import Sandbox as E2BSandbox
    from e2b.exceptions import SandboxException

    sbx = E2BSandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        kids = sbx.fork(count=2)
        try:
            for k in kids:
                assert k.files.read("/home/user/kept.txt") == "kept" and k.sandbox_id != sbx.sandbox_id
            kids[0].files.write("/home/user/only0.txt", "0")
            assert not kids[1].files.exists("/home/user/only0.txt")
        finally:
            for k in kids:
                k.kill()
        # the source kept running; a process running in it is named, never lost silently
        sbx.commands.run("sleep 300", background=True)
        with pytest.raises(SandboxException, match="sleep 300"):
            sbx.fork(count=1)
    finally:
        sbx.kill()


# -- microvm: memory too


@pytest.mark.slow
async def test_microvm_carries_memory_and_processes() -> None:
    why = backend_skip("microvm")
    if why:
        pytest.skip(why)
    src = await create_sandbox(backend="microvm", image="debian-bookworm-amd64", ttl_s=600)
    try:
        # a running process, and a file
        await src.exec("sleep 600 >/dev/null 2>&1 & echo $! > /home/agent/pid; echo x > /home/agent/f")
        pid = (await src.read_file("/home/agent/pid")).decode().strip()
        kids = await src.branch(2)
        held = [h for k in kids for h in k.stack]  # type: ignore[attr-defined]
        snap_dir = kids[0].template.dir  # type: ignore[attr-defined]
        assert snap_dir.is_dir() and kids[1].template.dir == snap_dir  # type: ignore[attr-defined]
        try:
            mids = set()
            for k in kids:
                info = k.branch_info  # type: ignore[attr-defined]
                assert info.carried == ["filesystem", "sessions", "memory", "processes"]
                assert (await k.read_file(f"/proc/{pid}/comm")) == b"sleep\n"  # the process goes on
                assert (await k.read_file("/home/agent/f")) == b"x\n"
                mids.add((await k.read_file("/etc/machine-id")).strip())
            assert len(mids) == 2
            await kids[0].write_file("/home/agent/g", "g")
            assert not await has(kids[1], "/home/agent/g") and not await has(src, "/home/agent/g")
            assert (await src.read_file(f"/proc/{pid}/comm")) == b"sleep\n"  # and in the source
        finally:
            await asyncio.gather(*(k.close() for k in kids))
        # the snapshot the children were restored from goes with the last of them
        assert held and all(h.refs == 0 for h in held)
        assert not snap_dir.exists()
    finally:
        await src.close()
