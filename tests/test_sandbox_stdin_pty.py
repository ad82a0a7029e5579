"""The sandbox contract's live input: ``exec(..., stdin=True)`` (a pipe fed while the
command runs), ``exec(..., pty=(cols, rows))`` (a real pseudo-terminal in the guest agent,
resizable), and signals to a running command, on every local backend."""

from __future__ import annotations

import asyncio
import signal

import pytest

from sandfleet.agent.client import RunningCommand
from sandfleet.errors import SandfleetError
from sandfleet.sandbox.base import Sandbox


async def _started(box: dict[str, RunningCommand]) -> RunningCommand:
    async with asyncio.timeout(30):
        while "p" not in box:
            await asyncio.sleep(0.01)
    return box["p"]


async def test_stdin_pipe_fed_while_running(sb: Sandbox) -> None:
    box: dict[str, RunningCommand] = {}
    seen: list[bytes] = []
    task = asyncio.create_task(sb.exec(["sh", "-c", "read x; echo got:$x; cat; echo end"], stdin=True,
                                       on_start=lambda p: box.setdefault("p", p),
                                       on_output=lambda _, d: seen.append(d), timeout=60))
    p = await _started(box)
    assert p.pid > 0 and not p.pty
    p.send_stdin(b"one\n")
    async with asyncio.timeout(30):  # the first line is answered before stdin closes
        while b"got:one" not in b"".join(seen):
            await asyncio.sleep(0.01)
    p.send_stdin(b"two\n")
    p.close_stdin()
    res = await task
    assert (res.exit_code, res.stdout) == (0, "got:one\ntwo\nend\n")
    assert p.done
    p.send_stdin(b"late")  # the command is gone: dropped, not an error


async def test_pty_is_a_terminal_and_resizes(sb: Sandbox) -> None:
    box: dict[str, RunningCommand] = {}
    out: list[bytes] = []
    task = asyncio.create_task(sb.exec(["sh", "-c", 'read line; tty; stty size; read x; stty size; exit 4'],
                                       pty=(100, 30), on_start=lambda p: box.setdefault("p", p),
                                       on_output=lambda _, d: out.append(d), timeout=60))
    p = await _started(box)
    assert p.pty
    p.send_stdin(b"go\n")
    async with asyncio.timeout(30):
        while b"30 100" not in b"".join(out):
            await asyncio.sleep(0.01)
    await p.resize(120, 40)
    p.send_stdin(b"\n")
    res = await task
    text = res.stdout
    assert res.exit_code == 4
    assert "go\r\n" in text  # the terminal echoes what was typed
    assert "/dev/pts/" in text and "30 100" in text and "40 120" in text
    assert res.stderr == ""  # a terminal has one stream


async def test_resize_without_a_pty_is_refused(sb: Sandbox) -> None:
    box: dict[str, RunningCommand] = {}
    task = asyncio.create_task(sb.exec(["sleep", "30"], on_start=lambda p: box.setdefault("p", p), timeout=60))
    p = await _started(box)
    with pytest.raises(SandfleetError, match="no terminal"):
        await p.resize(80, 24)
    p.signal(signal.SIGINT)
    res = await task
    assert res.signal == signal.SIGINT and res.exit_code == 128 + signal.SIGINT


async def test_bad_terminal_size_is_refused(sb: Sandbox) -> None:
    with pytest.raises(SandfleetError, match="terminal size"):
        await sb.exec(["true"], pty=(0, 24))


async def test_files_api_checks_the_users_own_permissions() -> None:
    """A READ or WRITE as a user is checked as that user's shell would be (the agent's
    helper drops the capabilities that entering the sandbox's user namespace gave it)."""
    from conftest import backend_skip
    from sandfleet.errors import GuestError
    from sandfleet.sandbox import create_sandbox

    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    sb = await create_sandbox(backend="bwrap", ttl_s=120)
    try:
        shell = await sb.exec("touch /root/by-shell", user="agent")
        assert shell.exit_code != 0 and "Permission denied" in shell.stderr
        with pytest.raises(GuestError, match="Permission denied"):
            await sb.write_file("/root/by-files-api", "x", user="agent")
        await sb.write_file("/root/secret", "s", user="root", mode=0o600)
        with pytest.raises(GuestError, match="Permission denied"):
            await sb.read_file("/root/secret", user="agent")
        await sb.write_file("mine.txt", "ok", user="agent")  # its own directory still works
        assert await sb.read_file("mine.txt", user="agent") == b"ok"
        assert (await sb.exec("ls /root", user="root")).stdout.split() == ["secret"]
    finally:
        await sb.close()


@pytest.mark.parametrize("backend", ["process", "bwrap"])
async def test_commands_take_signals_even_when_the_owner_ignores_them(backend: str) -> None:
    """A service started by nohup, or as a non-interactive shell's background job, ignores
    SIGINT, and an ignored signal survives exec: the guest agent gives every command the default
    actions, so an interrupt (SWE-ReX's, E2B's) still ends it."""
    from conftest import backend_skip
    from sandfleet.sandbox import create_sandbox
    from sandfleet.sandbox.spec import SandboxSpec

    if why := backend_skip(backend):
        pytest.skip(why)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent is started from here: it inherits it
    try:
        sb = await create_sandbox(SandboxSpec(backend=backend))
    finally:
        signal.signal(signal.SIGINT, old)
    try:
        box: dict[str, RunningCommand] = {}
        task = asyncio.create_task(sb.exec(["sleep", "30"], on_start=lambda p: box.setdefault("p", p), timeout=60))
        p = await _started(box)
        p.signal(signal.SIGINT)
        res = await task
        assert res.signal == signal.SIGINT and res.duration_s < 20, res
    finally:
        await sb.close()
