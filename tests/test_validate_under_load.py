"""``sandfleet tasks validate --under-load``: oracles run again beside busy processes; a task
whose reward flips is ``load_sensitive``, naming the test (issue 42)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.cli import cli
from sandfleet.rollout.underload import cpu_load, default_load_procs, failed_tests
from sandfleet.sandbox.sync import SyncSandbox
from test_rollout_support import make_task, needs_bwrap

PYTEST_IMAGE = ("FROM python:3.11-bookworm\n\n# the tests run pytest; the official image has no pytest\n"
                "RUN pip install --no-cache-dir pytest==8.3.5\n\nWORKDIR /app\n")
RUN_PYTEST = """#!/bin/bash
mkdir -p /logs/verifier
cd /app && python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
SOLVED = """
def test_solved():
    assert open("/app/out.txt").read().strip() == "hello"
"""
# An absolute budget in disguise: the test spins for a second of wall time and wants a good part
# of it as its own CPU time. The part is calibrated to the host as it is (it may be busy with
# other work): a probe measures the share a lone spinner gets now, the test wants a third of that,
# and the load is many times the host's current one, so the share under it falls well below.
CPU_SHARE = SOLVED + """
import time


def test_cpu_share():
    wall, cpu = time.monotonic(), time.process_time()
    while time.monotonic() - wall < 1.0:
        pass
    share = (time.process_time() - cpu) / (time.monotonic() - wall)
    print(f"cpu share {share:.2f}")
    assert share > WANT
"""
PROBE = """
import time
wall, cpu = time.monotonic(), time.process_time()
while time.monotonic() - wall < 1.0:
    pass
print((time.process_time() - cpu) / (time.monotonic() - wall))
"""


def cpu_share_now() -> float:
    """The CPU share a busy process in a sandbox gets on this host now (sandboxes share the
    CPU weight of sandfleet's cgroup with every other sandbox of the host)."""
    with SyncSandbox(image="host", ttl_s=120, cpus=1) as sb:
        out = sb.exec(["python3", "-c", PROBE], timeout=60)
    assert out.exit_code == 0, out.stderr
    return min(1.0, float(out.stdout))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cpu_load_is_always_killed() -> None:
    with cpu_load(3) as pids:
        assert len(pids) == 3 and all(_alive(p) for p in pids)
    assert not any(_alive(p) for p in pids)
    with pytest.raises(RuntimeError), cpu_load(2) as pids:
        raise RuntimeError("validate failed half-way")
    assert not any(_alive(p) for p in pids)
    assert default_load_procs() == 2 * (os.cpu_count() or 1)


def test_failed_tests_from_pytest_summary() -> None:
    out = ("=========================== short test summary info ============================\n"
           "PASSED ../tests/test_outputs.py::test_solved\n"
           "FAILED ../tests/test_outputs.py::test_cpu_share - assert 0.12 > 0.35\n"
           "FAILED /tests/test_outputs.py::test_param[3] - AssertionError\n"
           "ERROR /tests/test_outputs.py::test_fixture - RuntimeError\n"
           "FAILED ../tests/test_outputs.py::test_cpu_share - again\n")
    assert failed_tests(out) == ["test_outputs.py::test_cpu_share", "test_outputs.py::test_param[3]",
                                 "test_outputs.py::test_fixture"]
    assert failed_tests("1 passed in 0.1s") == []


@needs_bwrap()
@pytest.mark.slow
def test_under_load_flags_the_task_whose_reward_flips(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    share = cpu_share_now()
    cpus = os.cpu_count() or 1
    # n entities share the CPUs now (cpus / share); 5x as many again leave a sixth of the share
    procs = min(96, max(2 * cpus, math.ceil(5 * cpus / share)))
    make_task(suite, "cpu-budget", dockerfile=PYTEST_IMAGE, test_sh=RUN_PYTEST,
              extra_tests={"test_outputs.py": CPU_SHARE.replace("WANT", f"{share / 3:.3f}")})
    make_task(suite, "steady", dockerfile=PYTEST_IMAGE, test_sh=RUN_PYTEST, extra_tests={"test_outputs.py": SOLVED})
    report = tmp_path / "report.json"
    # one rollout at a time: on the quiet host the CPU-share test competes with no sibling
    result = CliRunner().invoke(cli, ["tasks", "validate", str(suite), "-r", "1", "--concurrency", "1",
                                      "--under-load", "--load-procs", str(procs), "--report", str(report)])
    assert result.exit_code == 1, result.output  # a load-sensitive task fails the run
    verdicts = json.loads(report.read_text())
    flipped, steady = verdicts["cpu-budget"], verdicts["steady"]
    assert flipped["oracle_rewards"] == [1.0], flipped["reason"]
    # failed beside the load: 0, or masked (None) where the verifier saw the host's contention
    assert flipped["under_load_rewards"] in ([0.0], [None]) and flipped["load_sensitive"] is True
    assert flipped["load_flipped"] == ["test_outputs.py::test_cpu_share"]
    assert "load-sensitive" in flipped["reason"] and "test_cpu_share" in flipped["reason"]
    assert steady["oracle_rewards"] == [1.0] and steady["load_sensitive"] is False, steady["reason"]
    assert steady["under_load_rewards"] == [1.0] and steady["load_flipped"] == []
    if flipped["noop_rewards"] == [0.0]:  # a no-op masked by a busy host makes it invalid, not valid
        assert flipped["status"] == "load_sensitive"
        assert steady["status"] == "valid", steady["reason"]
    assert f"under load ({procs} busy processes): 1/2 oracles held" in result.stdout
    assert "load_sensitive  cpu-budget: test_outputs.py::test_cpu_share" in result.stdout
    # the busy processes are gone
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _spinning(p)]


def _spinning(proc: Path) -> bool:
    try:
        return b"for _ in range(200000)" in (proc / "cmdline").read_bytes() and _alive(int(proc.name))
    except OSError:
        return False


def test_under_load_refuses_what_it_cannot_load(tmp_path: Path) -> None:
    for args, message in ((["--load-procs", "2"], "needs --under-load"),
                          (["--under-load", "--remote", "http://127.0.0.1:1"], "excludes --remote"),
                          (["--under-load", "--arch", "amd64,arm64"], "excludes --arch")):
        result = CliRunner().invoke(cli, ["tasks", "validate", str(tmp_path), *args])
        assert result.exit_code == 2 and message in result.output, result.output
