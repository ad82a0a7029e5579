"""GRPO groups placed whole on hosts, and their unfinished members refilled in place when a host
is lost: what the Ray pool (:mod:`sandfleet.cluster.pool`, host actors) and the service pool
(:mod:`sandfleet.cluster.services`, ``sandfleet serve`` hosts) share. A subclass says how a group runs on one host
(:meth:`GroupPool._run_on`) and how a task is made ready for hosts (:meth:`GroupPool._prepare`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from sandfleet.cluster.host import GroupJob
from sandfleet.cluster.placement import Node, NoNodeError, Placer, task_arches
from sandfleet.errors import ConfigError
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.result import RolloutResult, group_advantages
from sandfleet.rollout.runner import RetryPolicy, failure_reason
from sandfleet.rollout.suite import RunConfig, new_run_id
from sandfleet.rollout.trace import now
from sandfleet.rollout.verdict import settle
from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)

NODE_LOST = "node_lost"
CANCEL_WAIT_S = 60.0


@dataclass
class GroupRun:
    """One group's outcome: its rollouts' final attempts (sample order, advantages set),
    every attempt, its statistics, and where and how it ran."""

    group: str
    results: list[RolloutResult]
    attempts: list[RolloutResult]
    stats: dict[str, Any]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float | None]:
        return [r.reward for r in self.results]

    @property
    def node(self) -> str | None:
        return self.info.get("node")


class _Lost(Exception):
    """The host died under a group: the attempts it had recorded, and why."""

    def __init__(self, attempts: list[RolloutResult], cause: BaseException):
        super().__init__(str(cause))
        self.attempts = attempts
        self.cause = cause


class PoolOptions(TypedDict, total=False):
    """What every pool takes (``RolloutPool.create``, ``ServicePool.create``, the CLI's
    ``--ray``/``--remote``): a new pool option is one line here, plus what uses it. Left out,
    each has the default its comment gives; the rest are
    :class:`~sandfleet.rollout.suite.RunConfig`'s."""

    capacity: int | None  # rollouts at once per host (a Ray node: its CPUs; a service: its max_busy)
    backend: str  # "auto"
    network: bool  # False
    fork: bool  # False
    verify: str  # "shared"
    agent_user: str | None  # each task's
    retry: RetryPolicy | None  # RetryPolicy()
    placements: int  # 3: how often a group may be placed (the first included) when hosts die under it
    arch: str | None  # of tasks that name none; None: any
    image: str | None  # run every task in this image instead of its own
    run_id: str | None  # a new one
    branch: str  # "": straight rollouts; TURN:WIDTH[,...]: trees, each kept whole on one host (rollout/tree.py)
    branch_processes: str  # "error"


POOL_OPTIONS = PoolOptions.__optional_keys__


def check_pool_options(opts: PoolOptions) -> None:
    """Refuse, before any host is reached, an option no pool knows (an untyped caller's) or
    a placement count below 1."""
    if unknown := opts.keys() - POOL_OPTIONS:
        raise ConfigError(f"a pool takes no option {', '.join(sorted(unknown))} "
                          f"(it takes {', '.join(sorted(POOL_OPTIONS))})")
    if (placements := opts.get("placements", 3)) < 1:
        raise ConfigError(f"placements must be at least 1, not {placements}")
    if (capacity := opts.get("capacity")) is not None and capacity < 1:
        raise ConfigError(f"capacity must be at least 1, not {capacity}")


def pool_config(opts: PoolOptions, concurrency: int) -> RunConfig:
    """The :class:`RunConfig` a pool's groups run under."""
    return RunConfig(n=1, concurrency=max(1, concurrency), backend=opts.get("backend", "auto"),
                     network=opts.get("network", False), fork=opts.get("fork", False),
                     verify=opts.get("verify", "shared"), agent_user=opts.get("agent_user"),
                     retry=opts.get("retry") or RetryPolicy(), run_id=opts.get("run_id") or new_run_id(),
                     branch=opts.get("branch", ""), branch_processes=opts.get("branch_processes", "error"))


class GroupPool:
    """Groups on hosts: placement (:class:`~sandfleet.cluster.placement.Placer`), node loss,
    re-placement, attempt numbering. Subclasses run a group on one host."""

    def __init__(self, placer: Placer, config: RunConfig, opts: PoolOptions) -> None:
        check_pool_options(opts)
        self.placer = placer
        self.config = config
        self.placements = opts.get("placements", 3)
        self.arch = opts.get("arch")
        self.image = opts.get("image")
        self.runs: list[GroupRun] = []
        self._closed = False
        self._seq = 0
        self._active: set[asyncio.Task[Any]] = set()

    async def _prepare(self, task: Task) -> tuple[str, Any]:
        """The task folder's content hash, and what :meth:`_run_on` needs to ship it."""
        raise NotImplementedError

    async def _run_on(self, node: Node, job: GroupJob, payload: Any) -> dict[str, Any]:
        """Run the job on the node: ``{"attempts", "results", "stats", "node_s", "received"}``
        (every attempt; the final ones with advantages; the group's statistics; seconds on
        the node; seconds the job took to get there). Raises :class:`_Lost` when the node
        dies under it, with the attempts recorded so far."""
        raise NotImplementedError

    async def run_group(
        self,
        task: Task,
        n: int,
        policy: Policy,
        *,
        group: str | None = None,
        on_result: Callable[[RolloutResult], None] | None = None,
        image: str | None = None,
    ) -> GroupRun:
        """Run ``n`` rollouts of ``task`` as one group on one node; their results once the
        group ends (every attempt also goes to ``on_result`` then, in order). When its node
        dies, the members it had not finished are refilled in place: placed again together
        (same task, group, samples and sampling settings; the finished members are kept, not
        run again), up to ``placements`` times, after which the ones left are masked
        (``node_lost``, an infra fault) and the group is incomplete. It never raises for a
        failed rollout (their ``reason`` says why), only for cancellation. ``group`` names it
        (default: the task's name); ``image`` runs it in that image instead of the task's own
        (default: the pool's ``image``)."""
        if self._closed:
            raise ConfigError("the pool is closed")
        if not 1 <= n <= 100_000:
            raise ConfigError(f"n must be between 1 and 100000, not {n}")
        me = asyncio.current_task()
        if me is not None:
            self._active.add(me)
        try:
            return await self._run_group(task, n, policy, group, on_result, image)
        finally:
            if me is not None:
                self._active.discard(me)

    async def _run_group(self, task: Task, n: int, policy: Policy, group: str | None,
                         on_result: Callable[[RolloutResult], None] | None, image: str | None) -> GroupRun:
        name = group or task.name
        digest, payload = await self._prepare(task)
        arches = task_arches(task.metadata, self.arch)
        leaves = self.config.plan.leaves if self.config.plan else 1  # a tree holds a slot per leaf
        cfg = RunConfig(**{**self.config.__dict__, "n": n, "concurrency": n * leaves})
        attempts: list[RolloutResult] = []
        used: dict[int, int] = {}  # sample -> attempts recorded so far
        kept: dict[tuple[int, str], RolloutResult] = {}  # (sample, leaf) -> its final result, from a lost placement
        info: dict[str, Any] = {"placements": []}
        t_first = time.perf_counter()
        final: list[RolloutResult] | None = None
        for k in range(1, self.placements + 1):
            todo = [i for i in range(n) if not any(key[0] == i for key in kept)]  # a refill runs only the unfinished
            try:
                node = await self.placer.place(len(todo) * leaves, arches)
            except NoNodeError as e:
                final = self._merge(kept, self._failed(task, policy, name, todo, used, attempts, "no_node", str(e)))
                break
            self._seq += 1
            job = GroupJob(key=f"{name}@{self._seq}", task=task, digest=digest, n=n, policy=policy,
                           config=cfg, image=image or self.image, samples=tuple(todo) if kept else None)
            where: dict[str, Any] = {"node": node.node_id, "label": node.label, "admitted": time.time()}
            if kept:
                where["samples"] = todo
            info["placements"].append(where)
            info.setdefault("admitted", where["admitted"])
            t0 = time.perf_counter()
            try:
                end = await self._run_on(node, job, payload)
            except _Lost as lost:
                where.update(lost=True, lost_at=time.time(), error=str(lost.cause)[:300],
                             seconds=time.perf_counter() - t0)
                log.warning("node %s lost with group %s (placement %d of %d): %s", node.label, name, k,
                            self.placements, str(lost.cause)[:200])
                self._renumber(lost.attempts, name, used, final=None)
                attempts += lost.attempts
                for r in lost.attempts:  # members the node finished keep their result: no rerun
                    if r.final and r.masked:
                        r.final = False  # an infra fault as the node went: refilled on the next placement
                    elif r.final and r.sample in todo:
                        kept[_member(r)] = r
                last = k == self.placements
                if leaves > 1:  # a tree is kept whole or run again whole: its leaves of this placement go
                    for key in [key for key in kept if key[0] in todo and key[1]]:
                        kept.pop(key).final = False
                lost_now = [self._lost(task, policy, name, i, used, node, where, lost.cause, last)
                            for i in todo if not any(key[0] == i for key in kept)]
                attempts += lost_now
                if last:
                    final = self._merge(kept, lost_now)
                continue
            except Exception as e:  # an error of ours on the node (not a rollout failure)
                where.update(error=f"{type(e).__name__}: {e}"[:300])
                final = self._merge(kept, self._failed(task, policy, name, todo, used, attempts, failure_reason(e),
                                                       str(e), e))
                break
            finally:
                self.placer.release(node, len(todo) * leaves)
            where.update(seconds=time.perf_counter() - t0, node_s=end["node_s"], received_s=end["received"])
            got = sorted(end["attempts"], key=lambda r: (r.end, r.sample))
            self._renumber(got, name, used, final=None)
            attempts += got
            final = self._merge(kept, [r for r in got if r.final])
            info.update(node=node.node_id, label=node.label, node_s=end["node_s"])
            break
        assert final is not None
        stats = group_advantages(final)  # over the whole group, members kept from a lost placement included
        info["driver_s"] = time.perf_counter() - t_first
        info["end"] = max((r.end for r in final), default=None)
        info["attempts"] = len(attempts)
        info["refilled"] = sorted({r.sample for r in attempts if not r.final and r.masked})
        run = GroupRun(name, final, attempts, stats, info)
        self.runs.append(run)
        if on_result is not None:
            for r in attempts:
                on_result(r)
        return run

    @staticmethod
    def _merge(kept: dict[tuple[int, str], RolloutResult], new: list[RolloutResult]) -> list[RolloutResult]:
        """The group's final results in sample order (a tree's leaves in node order): those kept
        from lost placements and the new ones."""
        out = dict(kept)
        for r in new:
            out[_member(r)] = r
        return [out[i] for i in sorted(out)]

    def _renumber(self, got: list[RolloutResult], name: str, used: dict[int, int], final: bool | None) -> None:
        """Number a placement's attempts after those before it; ids ``name#i`` / ``name#i~k``."""
        base = dict(used)
        for r in got:
            r.attempt += base.get(r.sample, 0)
            used[r.sample] = max(used.get(r.sample, 0), r.attempt)
            r.group = name
            r.rollout_id = f"{name}#{r.sample}" + (f"~{r.attempt}" if r.attempt > 1 else "")
            if r.tree:  # a tree's leaf: ``name#i[~k]/node``, its tree renumbered with it
                r.tree["tree_id"] = r.rollout_id
                r.rollout_id += f"/{r.tree['node_id']}"
            r.run_id = self.config.run_id
            if final is not None:
                r.final = final

    def _lost(self, task: Task, policy: Policy, name: str, i: int, used: dict[int, int], node: Node,
              where: dict[str, Any], cause: BaseException, last: bool) -> RolloutResult:
        attempt = used.get(i, 0) + 1
        used[i] = attempt
        start, end = float(where["admitted"]), now()
        return RolloutResult(
            rollout_id=f"{name}#{i}" + (f"~{attempt}" if attempt > 1 else ""), task=task.name, group=name,
            sample=i, agent=policy.name, backend=self.config.backend, start=start, end=end, status="failed",
            spans=[{"name": "other_sandbox", "what": "lost with its node", "start": start, "end": end}],
            run_id=self.config.run_id, attempt=attempt, final=last, reason=NODE_LOST,
            error=f"node {node.label} ({node.node_id}) was lost: {str(cause)[:300]}",
            info={"node": node.node_id},
        )  # fmt: skip

    def _failed(self, task: Task, policy: Policy, name: str, samples: list[int], used: dict[int, int],
                attempts: list[RolloutResult], reason: str, error: str,
                failed_with: BaseException | None = None) -> list[RolloutResult]:
        """Failed results of ``samples``, settled with the error they failed with (its type
        carries its cause: rollout/verdict.py)."""
        out = []
        for i in samples:
            attempt = used.get(i, 0) + 1
            t = now()
            r = RolloutResult(
                rollout_id=f"{name}#{i}" + (f"~{attempt}" if attempt > 1 else ""), task=task.name, group=name,
                sample=i, agent=policy.name, backend=self.config.backend, start=t, end=t, status="failed",
                spans=[], run_id=self.config.run_id, attempt=attempt, reason=reason, error=error,
            )  # fmt: skip
            settle(r, failed_with)
            attempts.append(r)
            out.append(r)
        return out

    @property
    def nodes(self) -> list[Node]:
        return list(self.placer.nodes.values())

    async def _cancel_groups(self) -> None:
        """Cancel the groups still running (each closes its sandboxes) and wait for them."""
        me = asyncio.current_task()
        running = [t for t in self._active if t is not me]
        for t in running:
            t.cancel()
        if running:
            await asyncio.wait(running, timeout=CANCEL_WAIT_S)


def _member(r: RolloutResult) -> tuple[int, str]:
    """What a final result stands for in its group: its sample, and its node in a tree."""
    return r.sample, str((r.tree or {}).get("node_id") or "")
