"""sandfleet as PID 1 of a pid namespace (a container's command): ``unshare --pid --fork
--mount-proc sandfleet serve``. Every sandbox create works (the launcher once took "my parent
is 1" for "my owner is gone"), 200 lifecycles leave no zombie in the namespace, and SIGTERM or
SIGINT sent to PID 1 stop the service cleanly (exit 0) with its open sandboxes closed.

The 10,000-lifecycle run is ``python -m sandfleet.testing.pid1 --n 10000`` (docs/service.md)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import backend_skip

pytestmark = [
    pytest.mark.chaos, pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="the service needs the server extra"),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"),
]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_as_pid1_runs_lifecycles_leaves_no_zombie_and_stops_on_signal(tmp_path: Path, sig: int) -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    from sandfleet.testing.pid1 import run

    n = 200 if sig == signal.SIGTERM else 20
    r = run(n, concurrency=4, backend="bwrap", stop_signal=sig, live_at_stop=2, dir=tmp_path)
    assert r.failures == [] and r.ok == n
    assert r.zombies_at_end == []
    assert r.exit_code == 0  # a clean stop, not a kill
    assert r.leftovers == []  # the two sandboxes left open were closed by the stop


def test_cli_reaps_what_its_sandbox_leaves(tmp_path: Path) -> None:
    """``sandfleet sandbox run`` under a subreaper: bwrap returns before its own child has
    ended; the CLI reaps that child itself (it was left to init, as a zombie, before)."""
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    res = subprocess.run([sys.executable, str(probe), sys.executable, "-m", "sandfleet", "sandbox", "run",
                          "--network" if shutil.which("pasta") else "--no-network", "--", "/bin/echo", "hi"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "hi" in res.stdout
    assert res.stderr.strip().splitlines()[-1] == "orphans: []"


def test_cli_as_pid1_creates_sandboxes() -> None:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-m",
                          "sandfleet", "sandbox", "run", "--", "/bin/sh", "-c", "exit 3"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 3, res.stderr  # the command's own status, through the init
    assert "owner already gone" not in res.stderr


PROBE = '''
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here, not to init
rc = subprocess.run(sys.argv[1:]).returncode
time.sleep(1.0)
me, orphans = os.getpid(), []
for d in filter(str.isdigit, os.listdir("/proc")):
    try:
        st = open(f"/proc/{d}/stat").read()
    except OSError:
        continue
    if int(st[st.rindex(")") + 2:].split()[1]) == me:
        orphans.append(st[st.index("(") + 1:st.rindex(")")])
print(f"orphans: {orphans}", file=sys.stderr)
sys.exit(rc)
'''
