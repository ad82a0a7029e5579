"""Helpers for the rollout tests (no tests here): small Harbor task folders and a runner."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sandfleet.rollout import Policy, RunConfig, RunReport, run_suite
from sandfleet.tasks import Task, load_task

CHECK_HELLO = """#!/bin/bash
mkdir -p /logs/verifier
echo "checking /app/out.txt"
if [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def needs_bwrap() -> pytest.MarkDecorator:
    why = None
    if not shutil.which("bwrap"):
        why = "bubblewrap not installed (apt-get install bubblewrap)"
    elif os.geteuid() != 0:
        why = "the bwrap backend needs root"
    return pytest.mark.skipif(why is not None, reason=why or "")


def make_task(root: Path, name: str = "hello", *, solve: str = "echo hello > /app/out.txt",
              test_sh: str = CHECK_HELLO, agent_timeout: float = 60, verifier_timeout: float = 30,
              dockerfile: str = "FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
              extra_tests: dict[str, str] | None = None, prepare: str | None = None,
              verifier_extra: str = "") -> Task:
    """A Harbor task folder under ``root``; the default one wants ``hello`` in /app/out.txt.
    ``prepare`` is the text of its ``environment/prepare.sh`` (none by default)."""
    folder = root / name
    (folder / "environment").mkdir(parents=True)
    (folder / "solution").mkdir()
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text(
        f'version = "1.0"\n[agent]\ntimeout_sec = {agent_timeout}\n'
        f"[verifier]\ntimeout_sec = {verifier_timeout}\n{verifier_extra}"
        "[environment]\ncpus = 1\nmemory_mb = 512\nstorage_mb = 256\n"
    )
    (folder / "instruction.md").write_text("Write the word hello into /app/out.txt.\n")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    (folder / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    (folder / "tests" / "test.sh").write_text(test_sh)
    for rel, text in (extra_tests or {}).items():
        (folder / "tests" / rel).write_text(text)
    if prepare is not None:
        (folder / "environment" / "prepare.sh").write_text(prepare)
    return load_task(folder)


async def run(tasks: list[Task], policy: Policy, out: Path | None = None, **config: object) -> RunReport:
    """Run a suite on the bwrap backend."""
    config.setdefault("backend", "bwrap")
    return await run_suite(tasks, policy, RunConfig(**config), out_dir=out)  # type: ignore[arg-type]
