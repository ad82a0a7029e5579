"""The warm pool and the sandbox CLI, on real sandboxes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandfleet.errors import ConfigError, PoolError
from sandfleet.sandbox.pool import WarmPool
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.sandbox.state import state_root

# The backend matrix where it adds coverage (issue 43): the pool's admission and the CLI's exit
# codes and timeout message are the same code on every backend, so they run on process and bwrap
# (the default); each backend's own exit codes and timeouts are the contract suite's
# (test_sandbox_contract.py: test_exec_argv_and_shell, test_timeout_kills_whole_tree, on all of
# them). Cut: microvm and gvisor here, 15 s of the fast pass (exit codes 8.3 + 6.6 s, pool 2.3 s).
# Detached create/exec/rm stays on every backend: each keeps its sandbox past its creator its own way.
SHARED_LOGIC = pytest.mark.parametrize("backend", ["process", "bwrap"], indirect=True)


@SHARED_LOGIC
async def test_pool_keeps_warm_and_admits_at_most_max_busy(backend: str) -> None:
    async with WarmPool(SandboxSpec(backend=backend), size=2, max_busy=1) as pool:
        await pool.wait_ready()
        a = await pool.acquire()
        assert pool.busy == 1
        second = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0.2)
        assert not second.done()  # admission limit
        await pool.release(a)
        b = await asyncio.wait_for(second, 10)
        assert b.id != a.id and (await b.exec("echo ok")).stdout == "ok\n"
        await pool.release(b)
        await pool.wait_ready()
        ready_ids = [sb.id for sb in list(pool._ready._queue)]  # type: ignore[attr-defined]
    for sid in [a.id, b.id, *ready_ids]:
        assert not (state_root() / sid).exists()


async def test_pool_rejects_bad_config_and_closed_use() -> None:
    with pytest.raises(ConfigError):
        WarmPool(size=-1)
    with pytest.raises(ConfigError):
        WarmPool(max_busy=0)
    pool = WarmPool(SandboxSpec(backend="process"), size=0)
    await pool.close()
    with pytest.raises(PoolError):
        await pool.acquire()


def sf(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sandfleet", *args], capture_output=True, text=True,
                          timeout=timeout)


@SHARED_LOGIC
def test_cli_sandbox_run_exit_codes(backend: str) -> None:
    r = sf("sandbox", "run", "--backend", backend, "--", "sh", "-c", "echo hi; exit 3")
    assert r.returncode == 3 and r.stdout == "hi\n"
    r = sf("sandbox", "run", "--backend", backend, "--timeout", "0.5", "--", "sleep", "30")
    assert r.returncode == 124 and "timed out" in r.stderr
    r = sf("sandbox", "run", "--backend", "nope", "--", "true")
    assert r.returncode == 2 and "Invalid value for '--backend'" in r.stderr


def test_cli_detached_create_exec_rm(backend: str) -> None:
    r = sf("sandbox", "create", "--backend", backend, "--ttl", "120")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    try:
        r = sf("sandbox", "exec", sid, "--", "sh", "-c", "echo in; exit 4")
        assert r.returncode == 4 and r.stdout == "in\n"
        listed = json.loads(sf("sandbox", "ls", "--json").stdout)
        assert any(m["id"] == sid and m["alive"] for m in listed)
    finally:
        r = sf("sandbox", "rm", sid)
    assert r.returncode == 0
    assert not (state_root() / sid).exists()


def test_cli_doctor_json() -> None:
    r = sf("doctor", "--json")
    d = json.loads(r.stdout)
    assert {"arch", "page_size", "cgroup", "backends"} <= set(d)
    for name in ("process", "bwrap", "microvm"):
        assert set(d["backends"][name]) >= {"available", "reason"}
    lim = d["limits"]  # what bounds idle sandboxes: the open-file limit, and the host's task ceiling named
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    threads_max = int(Path("/proc/sys/kernel/threads-max").read_text())
    assert lim["task_limit"]["value"] == min(pid_max, threads_max)
    assert lim["task_limit"]["name"] in lim["hint"] and "sysctl -w" in lim["hint"]
    assert lim["idle_per_process_by_open_files"] > 0


def test_sigterm_mid_run_closes_every_sandbox(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs the bwrap backend (root)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandfleet", "run", "--tasks", "examples/tasks", "--agent", "oracle",
         "-n", "2", "--concurrency", "2", "--out", str(tmp_path / "out")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    def owned_by_run() -> list[Path]:
        found = []
        for d in state_root().glob("sf-*"):
            try:
                if json.loads((d / "meta.json").read_text()).get("owner_pid") == proc.pid:
                    found.append(d)
            except (OSError, ValueError):
                continue  # not written yet, or just removed
        return found

    owned: list[Path] = []
    try:
        # on a fresh host the run first builds the tasks' image (python:3.11-bookworm: a
        # debootstrap base, minutes on busy cores): wait while it is alive, not a fixed minute
        deadline = time.monotonic() + 900
        while not owned and proc.poll() is None and time.monotonic() < deadline:
            owned = owned_by_run()
            time.sleep(0.05)
        assert owned, f"the run never started a sandbox (exit status {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
    finally:
        if proc.poll() is None:  # a failed check must not leave the run behind for later tests
            proc.kill()
            proc.wait()
    assert not any(d.exists() for d in owned)
    assert not owned_by_run()
