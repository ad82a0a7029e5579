"""Helpers several test modules share (not tests; like browser.py and test_rollout_support.py)."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


def running(tag: str) -> list[int]:
    """Host pids of processes whose command line holds ``tag`` (sandbox processes of the
    bwrap and process backends, and a service's, are host processes)."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if tag.encode() in (p / "cmdline").read_bytes():
                    found.append(int(p.name))
            except OSError:
                pass
    return found


async def until(cond: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait until ``cond()`` is true; AssertionError after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.05)


def dockerfile_task(root: Path, dockerfile: str, files: dict[str, str] | None = None, name: str = "task") -> Path:
    """A Harbor task folder ``root/name`` whose environment is ``dockerfile`` (plus ``files``
    beside it) and whose test always rewards 1."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("do it\n")
    (task / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 60.0\n[verifier]\ntimeout_sec = 60.0\n')
    (task / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    for rel, text in (files or {}).items():
        p = task / "environment" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return task


def fixture_task(tmp_path: Path, name: str) -> Path:
    """A copy of the fixture task ``name`` (tests/fixtures/tasks) under ``tmp_path``, to edit."""
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))
