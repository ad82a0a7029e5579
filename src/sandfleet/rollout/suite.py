"""Running a suite: n rollouts per task (GRPO groups) under a concurrency limit.

Each task's image is built once (a failed build fails that task's rollouts with the
Dockerfile line, and the run goes on). Every rollout gets a fresh sandbox -- created from
the image, or, with ``fork=True``, forked from one prepared state per group. Every attempt
is appended to ``trace.jsonl`` as it ends; a group's rollouts, with their advantages, go to
``rollouts.jsonl`` when the group is complete; ``summary.json`` is written at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sandfleet.errors import ConfigError
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.result import RolloutResult, group_advantages
from sandfleet.rollout.runner import (
    RetryPolicy,
    RolloutRequest,
    failure_reason,
    run_with_retries,
    task_spec,
)
from sandfleet.rollout.trace import SPAN_NAMES, SpanRecorder
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Snapshot
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.tasks.model import Task

ImageFor = Callable[[Task], Awaitable[str]]


async def default_image_for(task: Task) -> str:
    """The task's environment image (built and cached by ``sandfleet.images.build``)."""
    from sandfleet.images.build import ensure_task_image

    return await ensure_task_image(task)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]


@dataclass
class RunConfig:
    """How a suite runs."""

    n: int = 1
    """Rollouts per task (the GRPO group size)."""
    concurrency: int = 8
    """Rollouts in flight at once."""
    backend: str = "auto"
    """Sandbox backend: auto (bwrap where it can run), bwrap, process, microvm."""
    network: bool = False
    """Give sandboxes network access (off by default, whatever the task asks)."""
    fork: bool = False
    """Fork each group's sandboxes from one prepared state instead of creating each."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    run_id: str = field(default_factory=new_run_id)

    def __post_init__(self) -> None:
        if not 1 <= self.n <= 100_000:
            raise ConfigError(f"n must be between 1 and 100000, not {self.n}")
        if not 1 <= self.concurrency <= 100_000:
            raise ConfigError(f"concurrency must be between 1 and 100000, not {self.concurrency}")


@dataclass
class RunReport:
    """The outcome of a run: the final attempt of every rollout, and every attempt."""

    config: RunConfig
    results: list[RolloutResult]
    attempts: list[RolloutResult]
    groups: dict[str, dict[str, Any]]
    wall_s: float

    def summary(self) -> dict[str, Any]:
        """The figures of ``summary.json``."""
        done = [r for r in self.results if r.status == "completed"]
        spans: dict[str, float] = dict.fromkeys(SPAN_NAMES, 0.0)
        for r in self.results:
            for name, seconds in r.span_seconds().items():
                spans[name] += seconds
        n = len(self.results)
        total = sum(r.duration for r in self.results)
        rewards = [r.reward for r in done if r.reward is not None]
        return {
            "run_id": self.config.run_id, "n_rollouts": n, "n_completed": len(done),
            "n_failed": sum(r.status == "failed" for r in self.results),
            "n_cancelled": sum(r.status == "cancelled" for r in self.results),
            "n_attempts": len(self.attempts),
            "pass_rate": sum(r.passed for r in self.results) / n if n else 0.0,
            "mean_reward": sum(rewards) / len(rewards) if rewards else None,
            "spans_mean_s": {k: v / n for k, v in spans.items()} if n else spans,
            "mean_rollout_s": total / n if n else None,
            "overhead_fraction": spans["overhead"] / total if total else None,
            "wall_s": self.wall_s,
            "rollouts_per_min": 60.0 * n / self.wall_s if self.wall_s else None,
            "concurrency": self.config.concurrency, "group_size": self.config.n,
            "backend": self.config.backend,
            "failures": dict(Counter(r.reason or "?" for r in self.results if not r.passed
                                     and r.status != "completed")),
            "groups": self.groups,
        }  # fmt: skip


class _Writer:
    def __init__(self, out: Path | None):
        self.trace: IO[str] | None = None
        self.rollouts: IO[str] | None = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.trace = open(out / "trace.jsonl", "w", encoding="utf-8")  # noqa: SIM115
            self.rollouts = open(out / "rollouts.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    def attempt(self, r: RolloutResult) -> None:
        if self.trace is not None:
            self.trace.write(json.dumps(r.to_trace()) + "\n")
            self.trace.flush()

    def group(self, results: Sequence[RolloutResult]) -> None:
        if self.rollouts is not None:
            self.rollouts.writelines(json.dumps(r.to_record()) + "\n" for r in results)
            self.rollouts.flush()

    def close(self) -> None:
        for f in (self.trace, self.rollouts):
            if f is not None:
                f.close()


def image_failure(
    task: Task, policy: Policy, cfg: RunConfig, sample: int, error: BaseException
) -> RolloutResult:
    """The result of a rollout whose task image could not be built: no sandbox, no time."""
    rec = SpanRecorder()
    end = rec.finish()
    return RolloutResult(
        rollout_id=f"{task.name}#{sample}", task=task.name, group=task.name, sample=sample,
        agent=policy.name, backend=cfg.backend, start=rec.start, end=end, status="failed",
        spans=rec.spans, run_id=cfg.run_id, reason=failure_reason(error), error=str(error),
    )  # fmt: skip


async def run_suite(
    tasks: Sequence[Task],
    policy: Policy,
    config: RunConfig | None = None,
    *,
    out_dir: Path | None = None,
    image_for: ImageFor = default_image_for,
    on_result: Callable[[RolloutResult], None] | None = None,
    slots: asyncio.Semaphore | None = None,
) -> RunReport:
    """Run ``config.n`` rollouts of every task; returns when all are done (or cancelled).

    ``slots`` shares one concurrency limit between runs (default: ``config.concurrency``)."""
    cfg = config or RunConfig()
    writer = _Writer(out_dir)
    attempts: list[RolloutResult] = []
    finals: list[RolloutResult] = []
    groups: dict[str, dict[str, Any]] = {}
    slots = slots or asyncio.Semaphore(cfg.concurrency)
    builds = asyncio.Semaphore(2)

    def record(r: RolloutResult) -> None:
        attempts.append(r)
        writer.attempt(r)
        if on_result is not None:
            on_result(r)

    async def one(req: RolloutRequest) -> RolloutResult:
        async with slots:
            return await run_with_retries(req, cfg.retry, record)

    async def group(task: Task) -> None:
        results: list[RolloutResult] = []
        snapshot: Snapshot | None = None
        try:
            try:
                async with builds:
                    image = await image_for(task)
                spec = task_spec(task, image, cfg.backend, network=cfg.network)
                if cfg.fork:
                    async with slots:
                        snapshot = await _prepare(spec)
            except Exception as e:
                results = [image_failure(task, policy, cfg, i, e) for i in range(cfg.n)]
                for r in results:
                    record(r)
            else:
                reqs = [
                    RolloutRequest(
                        task=task,
                        policy=policy,
                        spec=spec,
                        sample=i,
                        run_id=cfg.run_id,
                        snapshot=snapshot,
                    )
                    for i in range(cfg.n)
                ]
                results = list(await asyncio.gather(*(one(r) for r in reqs)))
        finally:
            if snapshot is not None:
                await asyncio.to_thread(snapshot.delete)
        groups[task.name] = group_advantages(results)
        finals.extend(results)
        writer.group(results)

    t0 = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as tg:
            for task in tasks:
                tg.create_task(group(task), name=f"group-{task.name}")
    finally:
        writer.close()
    order = {t.name: i for i, t in enumerate(tasks)}
    finals.sort(key=lambda r: (order.get(r.task, 0), r.sample))
    report = RunReport(cfg, finals, attempts, groups, time.perf_counter() - t0)
    if out_dir is not None:
        (out_dir / "summary.json").write_text(json.dumps(report.summary(), indent=2) + "\n")
    return report


async def _prepare(spec: SandboxSpec) -> Snapshot:
    """One sandbox of the spec, snapshotted and closed: the state a group forks from."""
    sandbox = await create_sandbox(spec)
    try:
        return await sandbox.snapshot()
    finally:
        with contextlib.suppress(Exception):
            await sandbox.close()
