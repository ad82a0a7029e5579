"""The sandbox boundary (issue "Boundary I/II", audit findings 17, 18, 20, 21, 24, 27): each
test tries the attack from inside a real bwrap sandbox and asserts that it fails.

Written against the public API that 490e57a already had where it can be (exec, read_file,
write_file), so on that commit they fail by their assertions."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from sandfleet.errors import SandboxError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"),
                                reason="the bwrap backend needs root and bubblewrap")

PTRACE = ("import ctypes, os, sys; libc = ctypes.CDLL(None, use_errno=True); "
          "r = libc.ptrace(16, int(sys.argv[1]), 0, 0); print(r, ctypes.get_errno())")


@pytest.fixture(params=["bwrap", "gvisor"])
async def box(request: pytest.FixtureRequest) -> Sandbox:
    if request.param == "gvisor" and not shutil.which("runsc"):
        pytest.skip("gVisor not installed (apt-get install runsc)")
    sb = await create_sandbox(backend=request.param, ttl_s=120)
    try:
        yield sb
    finally:
        await sb.close()


async def _agent_pid(sb: Sandbox) -> int:
    # the guest agent is the parent of every command
    r = await sb.exec("echo $PPID")
    return int(r.stdout)


async def _as_root(sb: Sandbox, cmd: str) -> str:
    """Run as the sandbox's root where users exist (on 490e57a there was one user)."""
    try:
        r = await sb.exec(cmd, user="root")  # type: ignore[call-arg]
    except TypeError:
        r = await sb.exec(cmd)
    return r.stdout + r.stderr


@pytest.mark.parametrize("who", ["agent", "root"])
async def test_commands_can_not_ptrace_or_read_the_guest_agent(box: Sandbox, who: str) -> None:
    """Finding 18: a command could PTRACE_ATTACH the agent and open /proc/<agent>/mem."""
    pid = await _agent_pid(box)
    run = _as_root if who == "root" else (lambda sb, c: sb.exec(c))
    out = await run(box, f"python3 -c '{PTRACE}' {pid}")
    text = out if isinstance(out, str) else out.stdout + out.stderr
    assert text.split()[0] == "-1", f"ptrace attach to the guest agent succeeded: {text}"
    for f in ("mem", "environ"):
        if f == "environ" and box.backend == "gvisor":  # gVisor shows it: the agent starts with none but HOME
            out = await run(box, f"tr '\\0' '\\n' < /proc/{pid}/environ")
            text = out if isinstance(out, str) else out.stdout
            assert text.split() in ([], ["HOME=/root"]), f"the guest agent's environment: {text}"
            continue
        out = await run(box, f"cat /proc/{pid}/{f} >/dev/null && echo READ || echo DENIED")
        text = out if isinstance(out, str) else out.stdout
        assert "DENIED" in text, f"/proc/<agent>/{f} was readable as {who}"
    # (on gvisor the agent is root, as root's commands are: the seccomp filter refuses every
    # way to signal it, pid 1; docs/security.md, "Backends")
    out = await run(box, f"kill -STOP {pid} && echo SENT || echo DENIED")
    text = out if isinstance(out, str) else out.stdout
    assert "DENIED" in text
    if box.backend == "gvisor":
        probe = ("import ctypes, fcntl, os, socket, sys; libc = ctypes.CDLL(None, use_errno=True); "
                 "p = int(sys.argv[1]); L = ctypes.c_long; "
                 "calls = [(62, (p | 1 << 32, 19)), (200, (p, 19)), (234, (p, p, 19)), (129, (p, 19, 0)), "
                 "(297, (p, p, 19, 0))]; "
                 "print([libc.syscall(n, *map(L, a)) == -1 and ctypes.get_errno() == 1 for n, a in calls]); "
                 "a, b = socket.socketpair(); "
                 "print([libc.fcntl(a.fileno(), 8, o) == -1 and ctypes.get_errno() == 1 for o in (p, -p)] + "
                 "[libc.ioctl(a.fileno(), c, ctypes.byref(ctypes.c_int(p))) == -1 and ctypes.get_errno() == 1 "
                 "for c in (0x8901, 0x8902)])")  # F_SETOWN to it and its group, FIOSETOWN, SIOCSPGRP
        out = await run(box, f"python3 -c '{probe}' {pid}")
        text = out if isinstance(out, str) else out.stdout + out.stderr
        assert text.splitlines()[:2] == [str([True] * 5), str([True] * 4)], text
    assert (await box.exec("echo alive", timeout=10)).stdout == "alive\n"  # not frozen


async def test_guest_agent_runs_as_a_uid_no_command_has(box: Sandbox) -> None:
    if box.backend == "gvisor":
        pytest.skip("on gvisor the agent is the sandbox's root (gVisor can't setns into a user namespace S): "
                    "docs/security.md, \"Backends side by side\"")
    pid = await _agent_pid(box)
    agent_uid = (await box.exec(f"stat -c %u /proc/{pid}")).stdout.strip()
    for user in ("agent", "root", "verifier"):
        try:
            r = await box.exec("id -u", user=user)  # type: ignore[call-arg]
        except TypeError:
            r = await box.exec("id -u")
        assert r.stdout.strip() != agent_uid, f"{user} runs as the guest agent's uid {agent_uid}"
    # its environment is gone, and nothing of the launcher's PATH is left for a command to read
    env = await _as_root(box, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert "PATH=" not in env


async def test_timeout_kills_setsid_escapees(box: Sandbox) -> None:
    """Finding 21: an orphan that called setsid() survived the command's timeout."""
    r = await box.exec("setsid sh -c 'sleep 300.5 &'; sleep 300.6", timeout=1)
    assert r.timed_out
    await asyncio.sleep(0.2)
    left = await box.exec("pgrep -f 'sleep 300[.]5' || true")
    assert left.stdout.strip() == "", f"the escapee survived the timeout: {left.stdout}"


async def test_background_processes_of_a_finished_command_keep_running(box: Sandbox) -> None:
    """As with docker exec and E2B: only a timeout or a kill ends what a command left behind."""
    r = await box.exec("sleep 300.7 >/dev/null 2>&1 & echo started")
    assert r.stdout == "started\n"
    assert "sleep 300.7" in (await box.exec("pgrep -af 'sleep 300[.]7'")).stdout


async def test_close_returns_after_every_process_is_gone() -> None:
    sb = await create_sandbox(backend="bwrap", ttl_s=120)
    await sb.exec("setsid sh -c 'sleep 300.8 &' ; sleep 300.9 >/dev/null 2>&1 &")
    cg = getattr(sb, "cgroup", None)
    await sb.close()
    if cg is not None:
        assert not cg.pids(), "processes outlived close()"
    proc = await asyncio.create_subprocess_exec("pgrep", "-f", "sleep 300[.][89]", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert out.strip() == b"", f"sandbox processes outlived close(): {out!r}"


async def test_a_fifo_never_wedges_the_agent(box: Sandbox) -> None:
    """Finding 20: read_file on a FIFO blocked the single-threaded agent forever."""
    await box.exec("mkfifo pipe")
    t0 = time.monotonic()
    with pytest.raises(SandboxError):
        await asyncio.wait_for(box.read_file("pipe"), 10)
    with pytest.raises(SandboxError):
        await asyncio.wait_for(box.write_file("pipe", "x"), 10)
    assert time.monotonic() - t0 < 5
    assert (await box.exec("echo ok", timeout=10)).stdout == "ok\n"


async def test_agent_user_can_not_write_system_dirs(box: Sandbox) -> None:
    r = await box.exec("for d in /usr /etc /usr/lib/python3*; do touch $d/.x 2>/dev/null && echo WROTE $d; done; true")
    assert "WROTE" not in r.stdout


async def _with_host_file(path: Path, text: str, cmd: str) -> str:
    """The output of ``cmd`` in a new bwrap sandbox started while the host has ``path``
    (world-readable, holding ``text``); the file is removed after."""
    path.write_text(text)
    path.chmod(0o644)
    try:
        sb = await create_sandbox(backend="bwrap", ttl_s=60)
        try:
            return (await sb.exec(cmd)).stdout
        finally:
            await sb.close()
    finally:
        path.unlink()


async def test_host_top_level_files_and_var_lib_are_hidden(box: Sandbox, tmp_path: Path) -> None:
    """Finding 24: a top-level host file was readable inside the host image."""
    secret = Path("/sandfleet-test-secret.txt")
    out = await _with_host_file(secret, "TOPSECRET\n", f"cat {secret} 2>&1; ls /var/lib 2>&1 | head -3; "
                                "ls /var/spool /var/mail 2>&1 | head -3")
    assert "TOPSECRET" not in out
    assert "dpkg" not in out and "apt" not in out, f"/var/lib is visible: {out}"


async def test_a_host_file_made_just_after_a_start_is_hidden_from_the_next() -> None:
    """The host root's hidden entries are scanned once and reused while ``/`` and ``/var`` are
    unchanged (bwrap._host_hidden): a file made at the top level right after one sandbox's
    start, in the same second, is still hidden from the next sandbox."""
    secret = Path(f"/sandfleet-test-late-{os.getpid()}.txt")
    for _ in range(3):
        first = await create_sandbox(backend="bwrap", ttl_s=60)
        await first.close()
        out = await _with_host_file(secret, "LATESECRET\n", f"cat {secret} 2>&1; ls / | grep -c sandfleet-test-late")
        assert "LATESECRET" not in out and out.split()[-1] == "0", out


async def test_launcher_never_chmods_through_an_image_symlink(tmp_path: Path, with_python_base_cache: Path) -> None:
    """Finding 17: an image whose /logs is a symlink to a host file made the root launcher
    chmod that host file (0600 -> 0755). Now the sandbox is refused and the file untouched."""
    from sandfleet.tasks import load_task
    from sandfleet.tasks.images import build_task_image

    victim = tmp_path / "host-secret"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    tmp_path.chmod(0o755)
    task = tmp_path / "task"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("x\n")
    (task / "task.toml").write_text('version = "1.0"\n')
    (task / "tests" / "test.sh").write_text("true\n")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM python:3.11-slim-bookworm\nRUN ln -s {victim} /sfx-logs\n")
    image = build_task_image(load_task(task))
    with pytest.raises(SandboxError, match="symlink"):
        sb = await create_sandbox(backend="bwrap", image=image.hash, ttl_s=30, writable_dirs=("/sfx-logs",))
        await sb.close()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.stat().st_uid == 0
