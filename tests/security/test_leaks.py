"""Nothing leaks and nothing is trusted that someone else planted (findings 22, 28, 31, 41).

Each test tries the attack or the fault for real (files, processes, cgroups on this host)
and asserts that it fails. They use the process backend, which needs no image and runs as
this user; what they show is about the state directory, the reaper and the limits, which
every backend shares.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sandfleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandfleet.cli", *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture
def victim() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc  # type: ignore[misc]
    proc.kill()
    proc.wait()


def _plant(state: Path, pid: int) -> None:
    """A marker of a 'dead' sandbox whose reaping would SIGKILL ``pid``."""
    from sandfleet.sandbox.state import proc_start_time

    d = state / "sf-process-planted000"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({
        "id": d.name, "backend": "process", "owner_pid": 999999999, "owner_start": 1,
        "pids": [pid], "pid_starts": {str(pid): proc_start_time(pid)}, "created": 0, "ttl_s": 1,
    }))  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a directory owned by someone else")
def test_state_dir_created_by_someone_else_is_refused(tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    """Finding 28: another user makes the state directory first and plants a marker naming
    a process to kill; sandfleet refuses the directory instead of trusting the marker."""
    state = tmp_path / "state"
    _plant(state, victim.pid)
    os.chown(state, 65534, 65534)  # someone else's
    state.chmod(0o777)
    res = sandfleet("sandbox", "rm", "--orphans", env={"SANDFLEET_STATE": str(state)})
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    assert "belongs to uid 65534" in res.stderr
    time.sleep(0.2)
    assert victim.poll() is None, "the reaper killed a process named by a planted marker"
    assert (state / "sf-process-planted000").exists()


def test_state_dir_writable_by_others_is_refused(tmp_path: Path, victim: subprocess.Popen[bytes]) -> None:
    state = tmp_path / "state"
    _plant(state, victim.pid)
    state.chmod(0o777)  # ours, but anyone could have planted the marker
    res = sandfleet("sandbox", "rm", "--orphans", env={"SANDFLEET_STATE": str(state)})
    assert res.returncode != 0 and "writable by other users" in res.stderr, res.stderr
    assert victim.poll() is None


def test_sandbox_rm_matches_whole_ids_only(tmp_path: Path) -> None:
    """Finding 41: ``sandbox rm <suffix>`` must not remove someone else's live sandbox."""
    env = {"SANDFLEET_STATE": str(tmp_path / "state")}
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import asyncio
        from sandfleet.sandbox import create_sandbox
        async def main():
            sb = await create_sandbox(backend="process")
            print(sb.id, flush=True)
            await asyncio.sleep(300)
        asyncio.run(main())
    """)], env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None
        sid = holder.stdout.readline().strip()
        assert sid.startswith("sf-process-")
        for part in (sid[-1], sid[-4:], sid[3:]):
            res = sandfleet("sandbox", "rm", part, env=env)
            assert res.returncode != 0 and "whole id" in res.stderr, res.stderr
            assert (tmp_path / "state" / sid).exists(), f"rm {part!r} removed {sid}"
        res = sandfleet("sandbox", "rm", sid, env=env)
        assert res.returncode == 0 and not (tmp_path / "state" / sid).exists(), res.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()


def test_limits_are_never_dropped_silently(tmp_path: Path) -> None:
    """Finding 22: without usable cgroups (here turned off: SANDFLEET_CGROUPS=off), a sandbox
    with a memory, pids or cpu limit is refused with a clear error, unless --no-limits."""
    env = {"SANDFLEET_STATE": str(tmp_path / "state"), "SANDFLEET_CGROUPS": "off"}
    res = sandfleet("sandbox", "run", "--backend", "process", "--", "echo", "unlimited", env=env)
    assert res.returncode != 0 and "unlimited" not in res.stdout
    assert "cgroups are unusable" in res.stderr and "--no-limits" in res.stderr and "Traceback" not in res.stderr
    res = sandfleet("sandbox", "run", "--backend", "process", "--no-limits", "--", "echo", "unlimited", env=env)
    assert res.returncode == 0 and res.stdout == "unlimited\n", res.stderr
    assert [p.name for p in (tmp_path / "state").glob("sf-*")] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a writable cgroup tree")
def test_unusable_cgroup_parent_fails_clearly_and_leaks_nothing(tmp_path: Path) -> None:
    """A parent where no cgroup can be made (a path under a file): creation fails with a
    clear error, and no sandbox directory or cgroup is left (finding 36)."""
    env = {"SANDFLEET_STATE": str(tmp_path / "state"), "SANDFLEET_CGROUP_PARENT": "cgroup.procs/sandfleet"}
    res = sandfleet("sandbox", "run", "--backend", "process", "--", "true", env=env)
    assert res.returncode != 0 and "could not create the cgroup" in res.stderr and "Traceback" not in res.stderr
    assert [p.name for p in (tmp_path / "state").glob("sf-*")] == []


def test_snapshots_are_reaped_with_their_owner(tmp_path: Path) -> None:
    """Finding 31: a snapshot whose owner was SIGKILLed is removed by the next reaper."""
    env = {**os.environ, "SANDFLEET_STATE": str(tmp_path / "state")}
    owner = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import asyncio
        from sandfleet.sandbox import create_sandbox
        async def main():
            sb = await create_sandbox(backend="process")
            await sb.write_file("big", "x" * 100000)
            snap = await sb.snapshot()
            await sb.close()
            print(snap.layer, flush=True)
            await asyncio.sleep(300)
        asyncio.run(main())
    """)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    assert owner.stdout is not None
    layer = Path(owner.stdout.readline().strip())
    assert layer.is_dir() and layer.is_relative_to(tmp_path / "state" / "snapshots")
    survivor = subprocess.run([sys.executable, "-m", "sandfleet.cli", "sandbox", "rm", "--orphans"], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    assert survivor.returncode == 0 and layer.is_dir()  # a live owner's snapshot is kept
    owner.send_signal(signal.SIGKILL)
    owner.communicate()
    res = subprocess.run([sys.executable, "-m", "sandfleet.cli", "sandbox", "rm", "--orphans"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not layer.exists() and not layer.parent.exists(), "a dead owner's snapshot was left behind"
    assert layer.parent.name in res.stdout
