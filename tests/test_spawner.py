"""The process spawner (sandbox/spawner.py, agent/spawner.c): what it starts is the caller's own
child with exactly the descriptors asked for, an exec that fails says why and leaves nothing,
and the spawner itself never outlives its owner."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sandfleet.bench.procfs import children_map, process_tree
from sandfleet.sandbox import spawner

pytestmark = pytest.mark.sandbox  # it runs sandfleet-agent (the quick tier's guard refuses that)

SH = "/bin/sh"


def _run(argv: list[str], *, pass_fds: tuple[int, ...] = (), new_session: bool = False,
         env: dict[str, str] | None = None, cwd: str | None = "/") -> tuple[spawner.Spawned, str]:
    """``argv`` from the spawner with a pipe on its stdout; (the process, what it wrote)."""
    r, w = os.pipe()
    null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        proc = spawner.spawn(argv, stdin=null, stdout=w, stderr=w, cwd=cwd, env=env or {"PATH": "/usr/bin:/bin"},
                             new_session=new_session, pass_fds=pass_fds)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
        os.close(null)
    assert proc is not None, "the spawner should take an absolute argv"
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    proc.wait()
    return proc, out


def test_a_spawned_process_is_the_callers_child_with_only_its_descriptors() -> None:
    keep = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)  # not asked for: must not reach the child
    a, b = os.pipe()
    high = os.dup2(a, 777, inheritable=False)  # asked for under its own number
    try:
        script = 'echo "ppid=$PPID"; echo "pwd=$(pwd)" "x=$X"; ls /proc/self/fd | tr "\\n" " "'
        proc, out = _run([SH, "-c", script], pass_fds=(high,), env={"PATH": "/usr/bin:/bin", "X": "y z"}, cwd="/tmp")
    finally:
        for fd in (keep, a, b, high):
            os.close(fd)
    assert proc.returncode == 0
    lines = out.splitlines()
    assert lines[0] == f"ppid={os.getpid()}", out  # CLONE_PARENT: ours, not the spawner's
    assert lines[1] == "pwd=/tmp x=y z", out
    fds = {int(x) for x in lines[2].split()} - {3}  # (3: ls's own /proc/self/fd)
    assert fds == {0, 1, 2, 777}, out


def test_a_new_session_and_a_wait_that_reaps() -> None:
    proc, out = _run([SH, "-c", 'ps -o sid= -p $$ 2>/dev/null || cut -d" " -f6 /proc/$$/stat; exit 3'],
                     new_session=True)
    assert proc.returncode == 3
    assert int(out.split()[0]) == proc.pid  # a session of its own, led by it
    with pytest.raises(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)  # reaped: nothing left


def test_the_callers_limits_as_they_are_now() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    _run([SH, "-c", "true"])  # the spawner started before the change below
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1234), hard))
    try:
        _, out = _run([SH, "-c", "ulimit -n"])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert out.strip() == str(min(soft, 1234))


def test_an_exec_that_fails_raises_its_error_and_leaves_no_child(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("not a program")
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x01\x02 not a program")
    garbage.chmod(0o755)
    with pytest.raises(FileNotFoundError) as e:
        _run(["/nonexistent/program"])
    assert e.value.errno == errno.ENOENT and "/nonexistent/program" in str(e.value)
    with pytest.raises(PermissionError):
        _run([str(plain)])  # not executable
    with pytest.raises(OSError) as e:
        _run([str(garbage)])
    assert e.value.errno == errno.ENOEXEC
    zombies = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _is_our_zombie(int(p.name))]
    assert zombies == []  # each failed child reaped


def _is_our_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[0] == "Z" and int(stat[1]) == os.getpid()


def test_what_it_cannot_take_is_left_to_popen() -> None:
    assert spawner.spawn(["sh", "-c", "true"], stdin=0, stdout=1, stderr=2, cwd=None, env={}, new_session=False) is None
    big = {"X": "y" * spawner.MAX_MSG}
    assert spawner.spawn([SH, "-c", "true"], stdin=0, stdout=1, stderr=2, cwd=None, env=big, new_session=False) is None


def test_a_killed_spawner_is_replaced() -> None:
    _run([SH, "-c", "true"])
    sp = spawner._spawner
    assert sp is not None
    os.kill(sp.proc.pid, signal.SIGKILL)
    sp.proc.wait()
    proc, out = _run([SH, "-c", "echo again"])
    assert out == "again\n" and proc.returncode == 0
    assert spawner._spawner is not None and spawner._spawner.proc.pid != sp.proc.pid


def test_the_spawner_ends_with_its_owner_and_a_fork_gets_its_own() -> None:
    """An owner killed with SIGKILL leaves no spawner; a child forked from an owner starts its own
    (the parent's socket closed in it), and the parent's still works."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from sandfleet.sandbox import spawner
        def go():
            p = spawner.spawn(["{SH}", "-c", "true"], stdin=0, stdout=2, stderr=2, cwd="/", env={{}}, new_session=False)
            p.wait()
            return spawner._spawner.proc.pid
        mine = go()
        child = os.fork()
        if child == 0:
            theirs = go()
            os._exit(0 if theirs != mine else 1)
        _, st = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(st) == 0, "the fork used its parent's spawner"
        go()
        print(mine, flush=True)
        time.sleep(60)
    """)
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        with owner.stdout:
            line = owner.stdout.readline()
        assert line.strip().isdigit(), f"the owner failed: {line!r}"
        sp = int(line)
        assert Path(f"/proc/{sp}").exists()
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(sp):
        time.sleep(0.05)
    assert not _alive(sp), "the spawner outlived its owner"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _sockets(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            link = str(fd.readlink())
        except OSError:
            continue
        if link.startswith("socket:"):
            found.add(link)
    return found


@pytest.mark.parametrize("backend", ["bwrap", "gvisor"])
async def test_no_process_of_a_sandbox_holds_the_spawners_socket(backend: str) -> None:
    """The spawner takes requests from whoever holds its socket: no process of a sandbox it
    started (the launcher, bwrap or runsc, the guest agent, a command) holds either end."""
    from conftest import backend_skip
    from sandfleet.sandbox import create_sandbox

    if why := backend_skip(backend):
        pytest.skip(why)
    box = await create_sandbox(backend=backend, ttl_s=120)
    try:
        await box.exec(["sh", "-c", "sleep 30 &"])
        sp = spawner._spawner
        assert sp is not None and sp.owner == os.getpid(), "the sandbox was not started by the spawner"
        ends = _sockets(sp.proc.pid) | {f"socket:[{os.fstat(sp.sock.fileno()).st_ino}]"}
        tree = process_tree(box.agent.proc.pid, children_map())  # type: ignore[attr-defined]
        assert len(tree) >= 3, tree  # the launcher, the agent, the command at least
        held = {p: mine for p in tree if (mine := _sockets(p) & ends)}
        assert held == {}, f"processes of the sandbox hold the spawner's socket: {held}"
    finally:
        await box.close()


def test_a_holder_of_one_sandbox_starts_no_spawner() -> None:
    """``sandbox create``'s holder holds one sandbox (a small descriptor table): it starts it with
    Popen, not with a spawner that would be one process more per held sandbox."""
    import socket
    import struct

    from test_sandbox_holder import created

    with created("bwrap") as (_, ctl):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(ctl))
            cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        holder = struct.unpack("3i", cred)[0]
        kids = children_map().get(holder, [])
        cmds = [Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0") for k in kids]
        assert kids, "the holder's sandbox process is not its child"
        assert not [c for c in cmds if b"spawner" in c], cmds


async def test_starts_cancelled_at_every_moment_leave_no_process_and_no_sandbox() -> None:
    """A sandbox's process starts in a worker thread (sandbox/_spawn.py: the spawner's answer comes
    after the exec, and the event loop is not held for it). Creates cancelled at any moment of
    their start -- before, during and after that thread's start -- leave no process of this one's
    (what the thread started is killed and reaped) and no sandbox behind; the ones that finished
    close as usual."""
    import asyncio

    from conftest import backend_skip
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.base import Sandbox
    from sandfleet.sandbox.state import read_meta, state_root

    if why := backend_skip("bwrap"):
        pytest.skip(why)
    warm = await create_sandbox(backend="bwrap")  # the spawner started, the agent built
    await warm.close()

    def mine() -> set[int]:
        sp = spawner._spawner
        return set(children_map().get(os.getpid(), [])) - ({sp.proc.pid} if sp is not None else set())

    def my_markers() -> set[str]:  # this process's (other workers of the suite make theirs meanwhile)
        return {p.name for p in state_root().iterdir()
                if str(os.getpid()) in p.name or (read_meta(p) or {}).get("owner_pid") == os.getpid()}

    before, markers = mine(), my_markers()
    cancelled = 0
    for delay in (0, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012, 0.02):
        tasks = [asyncio.ensure_future(create_sandbox(backend="bwrap")) for _ in range(3)]
        await asyncio.sleep(delay)
        for t in tasks:
            t.cancel()
        for got in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(got, Sandbox):
                await got.close()
            else:
                cancelled += isinstance(got, asyncio.CancelledError)
    assert cancelled > 0
    deadline = time.monotonic() + 10
    while (mine() - before or my_markers() - markers) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert mine() - before == set(), process_tree(os.getpid(), children_map())
    assert my_markers() - markers == set()
