"""What the integrations share: finding a task, running one rollout of it, and the
process's live rollouts and sandboxes (which ``abort`` ends).

Settings a trainer can't pass per call come from the environment:

- ``SANDFLEET_TASKS``: the folder task names are looked up in;
- ``SANDFLEET_BACKEND``: ``auto`` (default), ``bwrap``, ``process``, ``microvm`` or ``gvisor``;
- ``SANDFLEET_NETWORK``: ``1`` gives sandboxes network access (default off);
- ``SANDFLEET_AGENT_USER``: who the agent runs as (default: the task's declared user, else
  the non-root ``agent``);
- ``SANDFLEET_REMOTE``: the URL of a sandfleet service (``sandfleet serve``, token in
  ``$SANDFLEET_TOKEN``; docs/service.md) that makes every sandbox instead of this host;
- ``SANDFLEET_RAY``: refused until sandfleet's Ray cluster lands;
- ``SANDFLEET_RECORD_DIR``: a folder (the training run's output) where every rollout's record
  is appended to ``records.jsonl`` as it ends, so that ``sandfleet replay FOLDER`` runs a
  rollout seen in training again (docs/replay.md); ``SANDFLEET_RECORD``: ``commands``
  (default) or ``full`` (the model's messages too).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sandfleet.errors import ConfigError
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import RetryPolicy, RolloutRequest, run_rollout, run_with_retries, task_spec
from sandfleet.rollout.verdict import INFRA, verdict_of
from sandfleet.sandbox.spec import BACKENDS
from sandfleet.settings import current as current_settings
from sandfleet.settings import environment
from sandfleet.tasks import Task, load_task

log = logging.getLogger(__name__)

TASKS_ENV = "SANDFLEET_TASKS"
T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """How the integrations make sandboxes, read once from the environment."""

    backend: str = "auto"
    network: bool = False
    agent_user: str | None = None
    remote: str | None = None
    record_dir: str | None = None
    """Where each rollout's record is appended (``records.jsonl``); None: no record."""
    record: str = "commands"
    """What a record keeps: ``commands`` or ``full`` (docs/replay.md)."""

    def __post_init__(self) -> None:
        if self.backend != "auto" and self.backend not in BACKENDS:  # refused before any rollout
            raise ConfigError(f"unknown backend {self.backend!r} ($SANDFLEET_BACKEND); known: auto, "
                              f"{', '.join(BACKENDS)}")
        if self.record not in ("commands", "full"):
            raise ConfigError(f"unknown record mode {self.record!r} ($SANDFLEET_RECORD); known: commands, full")

    @property
    def record_mode(self) -> str:
        """The rollouts' record mode: ``none`` without a ``record_dir``."""
        return self.record if self.record_dir else "none"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        env = environment() if env is None else env
        if env.get("SANDFLEET_RAY"):
            raise ConfigError("SANDFLEET_RAY is set, but this sandfleet has no Ray cluster support yet")
        made = cls(
            backend=env.get("SANDFLEET_BACKEND") or "auto",
            network=env.get("SANDFLEET_NETWORK", "0").lower() in ("1", "true", "yes"),
            agent_user=env.get("SANDFLEET_AGENT_USER") or None,
            remote=env.get("SANDFLEET_REMOTE") or None,
            record_dir=env.get("SANDFLEET_RECORD_DIR") or None,
            record=env.get("SANDFLEET_RECORD") or "commands",
        )
        return cls(**{**made.__dict__, **{k: v for k, v in overrides.items() if v is not None}})


@asynccontextmanager
async def sandboxes_on(remote: str | None) -> AsyncIterator[None]:
    """Inside, every sandbox (of this task and those it starts) is made on the sandfleet
    service at ``remote`` (its token in ``$SANDFLEET_TOKEN``), or on this host when None."""
    if not remote:
        yield
        return
    from sandfleet.client import remote as on_service

    async with on_service(remote):
        yield


_tasks: dict[Path, Task] = {}
_tasks_lock = threading.Lock()


def resolve_task(ref: str | os.PathLike[str], tasks_root: str | None = None) -> Task:
    """A task from a folder path, or from a name under ``tasks_root`` (default
    ``$SANDFLEET_TASKS``); loaded once per process."""
    path = Path(ref).expanduser()
    root = tasks_root or current_settings().tasks
    if not path.is_dir() and root and not path.is_absolute():
        path = Path(root).expanduser() / path
    if not path.is_dir():
        where = f" or under {TASKS_ENV}={root}" if root else f" (set {TASKS_ENV} to look names up)"
        raise ConfigError(f"no task folder {str(ref)!r}{where}")
    path = path.resolve()
    with _tasks_lock:
        task = _tasks.get(path)
        if task is None:
            task = _tasks[path] = load_task(path)
    return task


async def task_image(task: Task) -> str:
    """The task's environment image, built once and cached (content-addressed)."""
    from sandfleet.tasks.images import ensure_task_image, remote_builder

    return await ensure_task_image(task, builder=remote_builder())


class Aborted(Exception):
    """The rollout was ended by ``abort`` (not by the caller's own cancellation)."""


@dataclass
class Live:
    """The process's rollouts and sandboxes that ``abort`` ends (any event loop)."""

    jobs: set[asyncio.Task[Any]] = field(default_factory=set)
    sandboxes: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_sandbox(self, sandbox: Any) -> None:
        with self.lock:
            self.sandboxes[id(sandbox)] = (asyncio.get_running_loop(), sandbox)

    def drop_sandbox(self, sandbox: Any) -> None:
        with self.lock:
            self.sandboxes.pop(id(sandbox), None)

    async def track(self, work: Awaitable[T]) -> T:
        """Run ``work`` as a task ``abort`` can cancel; raise :class:`Aborted` if it did."""
        job = asyncio.ensure_future(work)
        with self.lock:
            self.jobs.add(job)
        try:
            return await job
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # our caller was cancelled: propagate
            raise Aborted("the rollout was aborted") from None
        finally:
            with self.lock:
                self.jobs.discard(job)

    async def abort(self) -> int:
        """Cancel every live rollout (each closes its sandbox) and close every registered
        sandbox; returns how many were ended. Those of another event loop are ended there."""
        with self.lock:
            jobs, boxes = list(self.jobs), list(self.sandboxes.values())
        here = asyncio.get_running_loop()
        waits: list[Awaitable[Any]] = []
        for job in jobs:
            if job.get_loop() is here:
                job.cancel()
                waits.append(job)
            else:
                job.get_loop().call_soon_threadsafe(job.cancel)
        for loop, box in boxes:
            if loop is here:
                waits.append(box.close())
            elif not loop.is_closed():
                waits.append(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(box.close(), loop)))
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.error("abort: closing failed: %s: %s", type(outcome).__name__, outcome)
        return len(jobs) + len(boxes)


LIVE = Live()


async def run_task(task: Task, policy: Policy, settings: Settings, *, rollout_id: str | None = None,
                   group: str | None = None, sample: int = 0) -> RolloutResult:
    """One rollout of ``task`` by ``policy`` in a fresh sandbox: sandfleet's runner (spans,
    verifier, reward), tracked so that ``abort`` can end it. With ``settings.remote`` the
    sandboxes are the service's; it must have the task's image (it is looked up by name:
    build it there, or share the image cache). With ``settings.record_dir`` its record is
    appended there (:func:`keep_record`)."""
    async with sandboxes_on(settings.remote):
        image = await task_image(task)
        spec = task_spec(task, image, settings.backend, network=settings.network, agent_user=settings.agent_user)
        if rollout_id is None and settings.record_dir:
            rollout_id = recorded_id(task, sample)
        req = RolloutRequest(task=task, policy=policy, spec=spec, sample=sample, group=group, rollout_id=rollout_id,
                             record=settings.record_mode)
        result = await LIVE.track(run_rollout(req))
        keep_record(result, settings)
        return result


async def run_tree_task(task: Task, policy: Policy, plan: Any, settings: Settings, *, sample: int = 0,
                        processes: str = "error") -> list[RolloutResult]:
    """One branched rollout (``--branch``, :mod:`sandfleet.rollout.tree`) of ``task`` by ``policy``
    (one that takes turns): its leaves, each recorded as :func:`run_task` records a rollout. A
    tree that fails before its first split is run again whole (2 attempts)."""
    from sandfleet.rollout.runner import RetryPolicy
    from sandfleet.rollout.tree import run_tree_with_retries

    async with sandboxes_on(settings.remote):
        image = await task_image(task)
        spec = task_spec(task, image, settings.backend, network=settings.network, agent_user=settings.agent_user)
        rid = recorded_id(task, sample) if settings.record_dir else None
        req = RolloutRequest(task=task, policy=policy, spec=spec, sample=sample, group=task.name, rollout_id=rid,
                             record=settings.record_mode)

        def keep(r: RolloutResult) -> None:
            if r.final:
                keep_record(r, settings)

        return await LIVE.track(run_tree_with_retries(req, plan, RetryPolicy(), processes=processes, on_result=keep))


def recorded_id(task: Task, n: int) -> str:
    """A rollout id no other rollout of this training run has: its record is found by it."""
    import uuid

    return f"{task.name}#{n}-{uuid.uuid4().hex[:8]}"


_RECORDS_LOCK = threading.Lock()


def keep_record(result: RolloutResult, settings: Settings) -> None:
    """Append the rollout's record to ``settings.record_dir``/records.jsonl (one write of one
    line, as ``sandfleet run`` writes it: a kill loses only the rollouts in flight)."""
    if not settings.record_dir or result.record is None:
        return
    import json

    line = (json.dumps(result.record) + "\n").encode()
    folder = Path(settings.record_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _RECORDS_LOCK:
            fd = os.open(folder / "records.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
    except OSError as e:  # a record never fails a rollout
        log.warning("no record of %s written to %s: %s", result.rollout_id, folder, e)


def span_seconds(result: RolloutResult) -> dict[str, float]:
    """Seconds per span name (the names of docs/trace-schema.md, all present)."""
    out = {name: 0.0 for name in ("sandbox_start", "model", "agent_command", "verifier", "other_sandbox", "overhead")}
    out.update(result.span_seconds())
    return out


def agent_metrics(result: RolloutResult) -> dict[str, Any]:
    """What a trainer logs per rollout: tool time, turns, commands, tokens, seconds per span."""
    spans = span_seconds(result)
    return {
        "total_tool_time": spans["agent_command"],
        "turns": result.turns,
        "commands": result.commands,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "model_time": spans["model"],
        "sandbox_time": spans["sandbox_start"] + spans["other_sandbox"],
        "verifier_time": spans["verifier"],
        "wall_time": result.duration,
        "spans_s": spans,
    }


def infra_fault_of(error: BaseException, phase: str = "agent") -> dict[str, Any] | None:
    """The evidence (``cause``, ``phase``, ``reason``, ``sandbox_end``, ``log_tail``) when
    ``error``, raised in ``phase``, is an infra fault by the verdict rule
    (:mod:`sandfleet.rollout.verdict`); None when it is the policy's (or in doubt)."""
    from sandfleet.rollout.runner import failure_reason
    from sandfleet.rollout.verdict import cause_of, log_tail, sandbox_end, verdict_of_cause

    reason, text = failure_reason(error), str(error) or type(error).__name__
    cause = cause_of("failed", reason, error, phase)
    if verdict_of_cause(cause) != INFRA:
        return None
    return {"cause": cause, "phase": phase, "reason": reason, "sandbox_end": sandbox_end(error),
            "log_tail": log_tail(error, text)}


def reward_of(result: RolloutResult) -> float | None:
    """A rollout's reward for training, by its verdict: the verifier's (scored), 0.0 (a policy
    fault), None (an infra fault: masked, a trainer's "can't score this completion")."""
    if verdict_of(result) == INFRA:
        return None
    return float(result.reward or 0.0)


@dataclass
class Runner:
    """How rollouts are made: settings from the environment, the sandboxes' CPU quota, and
    where finished rollouts go."""

    settings: Settings = field(default_factory=Settings.from_env)
    cpus: float | None = None
    """Each sandbox's CPU quota (None: the task's own ``cpus``)."""
    on_result: Callable[[RolloutResult], None] | None = None
    """Gets every attempt (a refilled infra fault's first attempt too)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Infra faults are run again in a fresh sandbox (same task and script) this many attempts."""
    run_id: str = "trl"
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    async def rollout(self, task: Task, policy: Policy, *, group: str | None = None, sample: int = 0,
                      info: dict[str, Any] | None = None, retry: RetryPolicy | None = None) -> RolloutResult:
        """One rollout of ``task`` by ``policy`` in a fresh sandbox (closed when it ends); an
        infra fault is run again per ``retry`` (default :attr:`retry`), the final attempt returned."""
        async with sandboxes_on(self.settings.remote):
            req = await self._request(task, policy, sample, group or task.name)
            return await LIVE.track(run_with_retries(req, retry or self.retry, self._recorder(info)))

    async def tree(self, task: Task, policy: Policy, plan: Any, *, sample: int = 0, processes: str = "error",
                   info: dict[str, Any] | None = None) -> list[RolloutResult]:
        """One branched rollout (``--branch``, :mod:`sandfleet.rollout.tree`) of ``task`` by
        ``policy`` (one that takes turns): its leaves, each a rollout of its own (records and
        ``on_result`` as :meth:`rollout`'s). A tree that fails before its first split is run
        again whole per :attr:`retry`; a child that fails to start is refilled in place."""
        from sandfleet.rollout.tree import run_tree_with_retries

        async with sandboxes_on(self.settings.remote):
            req = await self._request(task, policy, sample, task.name)
            return await LIVE.track(run_tree_with_retries(req, plan, self.retry, processes=processes,
                                                          on_result=self._recorder(info)))  # fmt: skip

    async def _request(self, task: Task, policy: Policy, sample: int, group: str) -> RolloutRequest:
        """The request for one rollout of ``task`` (its image built or found, the next id)."""
        image = await task_image(task)
        spec = task_spec(task, image, self.settings.backend, network=self.settings.network,
                         agent_user=self.settings.agent_user)  # fmt: skip
        if self.cpus is not None:
            spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"cpus": self.cpus})})
        n = next(self._ids)
        rid = recorded_id(task, n) if self.settings.record_dir else f"{task.name}#{n}"
        return RolloutRequest(task=task, policy=policy, spec=spec, sample=sample, group=group,
                              run_id=self.run_id, rollout_id=rid, record=self.settings.record_mode)  # fmt: skip

    def _recorder(self, info: dict[str, Any] | None) -> Callable[[RolloutResult], None]:
        """Each attempt's result: ``info`` added, the final one's record kept (docs/replay.md),
        then :attr:`on_result`."""

        def record(r: RolloutResult) -> None:
            r.info.update(info or {})
            if r.final:
                keep_record(r, self.settings)
            if self.on_result is not None:
                self.on_result(r)

        return record
