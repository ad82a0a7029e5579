"""Evaluations per minute: full verifier runs of a bundled task at full load.

The task's reference solution runs once in a sandbox of its image, which is then
snapshotted. Each of N workers then loops: fork one sandbox from that solved state, run the
verifier exactly as a rollout does (stop the agent's processes, clear, upload the tests, run
them, read the reward), close. An evaluation counts when its reward is 1; anything else is
a failure. The rate is evaluations completed / wall time, in minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import sandfleet
from sandfleet.bench.load import Progress
from sandfleet.errors import SandfleetError
from sandfleet.sandbox import create_sandbox, fork
from sandfleet.sandbox.base import Sandbox, Snapshot
from sandfleet.stats import percentile

DEFAULT_TASK = "implement-roman-numerals"


def examples_dir() -> Path:
    """The tasks shipped inside the package (``sandfleet/bench/tasks``, package data): found
    the same from a source checkout and from an installed wheel."""
    return Path(sandfleet.__file__).resolve().parent / "bench" / "tasks"


def find_task(name_or_path: str) -> Any:
    from sandfleet.tasks import load_tasks

    p = Path(name_or_path)
    root, name = (p.parent, p.name) if p.is_dir() else (examples_dir(), name_or_path)
    tasks, _ = load_tasks(root)
    for t in tasks:
        if t.name == name or Path(str(getattr(t, "path", ""))).name == name:
            return t
    raise SandfleetError(f"no task {name!r} under {root}")


async def prepare_solved(task: Any, backend: str) -> Snapshot:
    """A snapshot of the task's sandbox after its reference solution ran."""
    from sandfleet.rollout.policy import AgentContext, OraclePolicy
    from sandfleet.rollout.runner import task_spec
    from sandfleet.rollout.trace import SpanRecorder, now
    from sandfleet.tasks.images import ensure_task_image, remote_builder

    spec = task_spec(task, await ensure_task_image(task, builder=remote_builder()), backend)
    sb = await create_sandbox(spec)
    try:
        ctx = AgentContext(task=task, sandbox=sb, recorder=SpanRecorder(), deadline=now() + task.agent_timeout_s)
        await OraclePolicy().act(ctx)
        return await sb.snapshot()
    finally:
        with contextlib.suppress(Exception):
            await sb.close()


async def run_evals(task_ref: str, backend: str, workers: int, duration_s: float, *,
                    say: Progress | None = None) -> dict[str, Any]:
    """Verifier runs per minute with ``workers`` concurrent evaluations for ``duration_s``."""
    from sandfleet.rollout.trace import SpanRecorder
    from sandfleet.rollout.verifier import run_verifier

    task = find_task(task_ref)
    snap = await prepare_solved(task, backend)
    done: list[float] = []
    errors: list[str] = []
    t0 = time.perf_counter()
    deadline = t0 + duration_s

    async def one() -> None:
        sb: Sandbox | None = None
        t = time.perf_counter()
        try:
            sb = (await fork(snap, 1))[0]
            out = await run_verifier(task, sb, SpanRecorder())
            if out.reward == 1:
                done.append(time.perf_counter() - t)
            else:
                errors.append(f"reward {out.reward}: {out.output[-200:]}")
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            if sb is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(sb.close())

    async def loop() -> None:
        while time.perf_counter() < deadline:
            await one()
            if say is not None and len(done) % 10 == 0 and done:
                say(f"evals: {len(done)} done, {len(errors)} failed")

    try:
        await asyncio.gather(*(loop() for _ in range(workers)))
    finally:
        snap.delete()
    wall = time.perf_counter() - t0
    return {"task": task.name, "workers": workers, "completed": len(done), "failures": len(errors),
            "failure_examples": errors[:3], "wall_s": round(wall, 2),
            "evals_per_min": round(len(done) / wall * 60, 2),
            "eval_median_s": round(percentile(done, 50), 3) if done else None}
