"""No legitimate test is broken by the reward-integrity defences (issue 25's done-when): every
bundled task's oracle scores 1 and its no-op 0 on bwrap, with the tests in the agent's sandbox
(shared) and in a fresh one given the workdir (separate), with the seccomp filter, the uid
slots and the verifier's pid namespace, guard and git overrides all on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import backend_skip

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not shutil.which("bwrap") or os.geteuid() != 0,
                                reason="needs bubblewrap and root (the bwrap backend)")


def validate(tasks: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``sandfleet tasks validate TASKS ARGS -r 1 --json``: the process and its verdicts."""
    r = subprocess.run([sys.executable, "-m", "sandfleet", "tasks", "validate", str(tasks), *args, "-r", "1", "--json",
                        "--report", str(tmp_path / "validation.json")],
                       capture_output=True, text=True, timeout=1500)  # fmt: skip
    return r, json.loads(r.stdout)


def assert_all_valid(r: subprocess.CompletedProcess[str], verdicts: dict[str, Any]) -> None:
    bad = {name: v["reason"][-400:] for name, v in verdicts.items() if v["status"] != "valid"}
    assert not bad and r.returncode == 0, bad or r.stderr[-2000:]


def copies(tmp_path: Path, names: list[str]) -> Path:
    """A folder of copies of the bundled tasks named."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in names:
        shutil.copytree(ROOT / "examples" / "tasks" / name, tasks / name)
    return tasks


@pytest.mark.slow
@pytest.mark.parametrize("verify", ["shared", "separate"])
def test_bundled_tasks_validate_on_bwrap(tmp_path: Path, verify: str) -> None:
    r, verdicts = validate(ROOT / "examples" / "tasks", tmp_path, "--backend", "bwrap", "--verify", verify)
    assert len(verdicts) >= 20, r.stderr[-2000:]
    assert_all_valid(r, verdicts)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.skipif(not shutil.which("qemu-system-x86_64"), reason="QEMU not installed (the microvm backend)")
def test_bundled_git_tasks_validate_on_microvm(tmp_path: Path) -> None:
    """Issue 42: on microvm every command is root over files the image gave the task's user, and
    git refused the repositories as of "dubious ownership": the oracle of every git task scored 0.

    In the slow pass's serial part: under TCG, beside the other worker's sandboxes, git-bisect-regression's tests
    ran past their own 60 s (pytest's session 19 s of it) in all three of the oracle's rollouts once (stop 78's
    whole suite; 280 s for the test there, 92 s alone)."""
    tasks = copies(tmp_path, [folder.name for folder in sorted((ROOT / "examples" / "tasks").glob("git-*"))])
    r, verdicts = validate(tasks, tmp_path, "--backend", "microvm")
    assert len(verdicts) >= 3, r.stderr[-2000:]
    assert_all_valid(r, verdicts)


@pytest.mark.slow
def test_bundled_git_tasks_validate_with_a_root_agent(tmp_path: Path) -> None:
    """Docker's behaviour (``--agent-user root``) over a workdir the image gave the task's user: git's
    ownership check refused the repositories to root ("dubious ownership"), and the oracle of every git task
    scored 0 on bwrap and gVisor (before 2026-12-07; microvm since issue 42). A root agent's sandbox now has
    safe.directory=* (sandbox/base.py, any_owner_git)."""
    tasks = copies(tmp_path, [folder.name for folder in sorted((ROOT / "examples" / "tasks").glob("git-*"))])
    r, verdicts = validate(tasks, tmp_path, "--backend", "bwrap", "--agent-user", "root")
    assert len(verdicts) >= 3, r.stderr[-2000:]
    assert all(v["user"] == "root" for v in verdicts.values()), verdicts
    assert_all_valid(r, verdicts)


GVISOR_TASKS = (
    # the repositories' owners (the canonical uid range under runsc's own mapping)
    "git-bisect-regression", "git-recover-lost-commit", "git-resolve-merge-conflict",
    # CPU time: runsc's clock moves in 10 ms ticks (date-handling-bugs' oracle scored 0 in a CI run)
    "date-handling-bugs", "perf-quadratic-to-linear", "lru-cache-implementation",
    # file times and make, modes and owners, a package installed by pip, gcc and ld under ptrace,
    # an image built with a RUN step
    "makefile-build-and-test", "find-permissions-cleanup", "python-package-entrypoint", "fix-c-link-error",
    "archive-verify-checksums",
)


@pytest.mark.slow
@pytest.mark.skipif(bool(backend_skip("gvisor")), reason=str(backend_skip("gvisor")))
def test_bundled_tasks_validate_on_gvisor(tmp_path: Path) -> None:
    """The bundled tasks' images (task layers stored in the canonical uid range over a
    debootstrap base owned by host root) run on gvisor: the oracle passes and the no-op fails, as
    on bwrap. The tasks whose mechanism differs there (GVISOR_TASKS: 11 of 30, about 45 s on 2
    cores; all 30 took 110-140 s of the slow pass, issue 43); `sandfleet tasks validate
    examples/tasks --backend gvisor` runs them all. Here, not in test_gvisor.py, whose tests run
    alone: this one asserts nothing about time or owners."""
    r, verdicts = validate(copies(tmp_path, list(GVISOR_TASKS)), tmp_path, "--backend", "gvisor")
    assert sorted(verdicts) == sorted(GVISOR_TASKS), r.stderr[-2000:]
    assert_all_valid(r, verdicts)
