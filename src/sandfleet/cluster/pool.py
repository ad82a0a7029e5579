"""``RolloutPool``: GRPO groups over the nodes of a Ray cluster.

    pool = await RolloutPool.create(address="auto", capacity=64)
    run = await pool.run_group(task, 8, policy)      # 8 rollouts on one node, whole
    run.rewards, run.results[0].advantage
    await pool.close()

One :class:`~sandfleet.cluster.host.HostActor` per node owns that node's sandboxes; the
pool places each group whole on the node with the most free capacity of the task's arch
(:mod:`sandfleet.cluster.placement`), ships the task folder there once by content hash,
and streams the group's attempts back. When a node dies, the group running there fails
with reason ``node_lost`` (an attempt per member in flight) and is placed whole again on
another node, up to ``placements`` times; what other groups recorded is untouched.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.cluster._ray import import_ray, is_node_loss
from sandfleet.cluster.host import GroupJob, HostActor, NodeStatus
from sandfleet.cluster.local import LocalCluster, parse_local
from sandfleet.cluster.placement import Node, NoNodeError, Placer, task_arches
from sandfleet.errors import ConfigError
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.result import RolloutResult, group_advantages
from sandfleet.rollout.runner import RetryPolicy, failure_reason
from sandfleet.rollout.suite import RunConfig, new_run_id
from sandfleet.rollout.trace import now
from sandfleet.tasks.bundle import Bundle, pack
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
    def __init__(self, attempts: list[RolloutResult], cause: BaseException):
        super().__init__(str(cause))
        self.attempts = attempts
        self.cause = cause


class RolloutPool:
    """GRPO groups on a Ray cluster; make one with :meth:`create`."""

    def __init__(self, ray: Any, placer: Placer, config: RunConfig, *, placements: int, arch: str | None,
                 image: str | None, owns_ray: bool, local: LocalCluster | None) -> None:
        self.ray = ray
        self.placer = placer
        self.config = config
        self.placements = placements
        self.arch = arch
        self.image = image
        self.owns_ray = owns_ray
        self.local = local
        self.runs: list[GroupRun] = []
        self._bundles: dict[Path, Bundle] = {}
        self._closed = False
        self._seq = 0
        self._active: set[asyncio.Task[Any]] = set()

    @classmethod
    async def create(
        cls,
        address: str | None = None,
        *,
        capacity: int | None = None,
        backend: str = "auto",
        network: bool = False,
        fork: bool = False,
        verify: str = "shared",
        agent_user: str | None = None,
        retry: RetryPolicy | None = None,
        placements: int = 3,
        arch: str | None = None,
        image: str | None = None,
        warm: int = 0,
        nodes: Sequence[str] | None = None,
        run_id: str | None = None,
        namespace: str = "sandfleet",
    ) -> RolloutPool:
        """Connect to a cluster and start a host actor on each of its nodes.

        ``address``: a Ray address (``host:port``, ``ray://...``), ``auto`` (``$RAY_ADDRESS``),
        ``local:N`` (start N loopback-only nodes here, stopped by :meth:`close`), or None to
        use the Ray this process is connected to already (a trainer's). ``capacity``: busy
        rollouts per node (default: its CPU count); a group needs that many free on one
        node. ``placements``: how often a group may be placed (the first included) when
        nodes die under it. ``arch``: the architecture of tasks that name none (default:
        any). ``image``: run every task in this image instead of building its own on the
        node. ``warm``: sandboxes kept ready per recent spec on each node. ``nodes``: only
        these node ids. The rest are :class:`~sandfleet.rollout.suite.RunConfig`'s."""
        if placements < 1:
            raise ConfigError(f"placements must be at least 1, not {placements}")
        config = RunConfig(n=1, concurrency=max(1, capacity or 1), backend=backend, network=network, fork=fork,
                           verify=verify, agent_user=agent_user, retry=retry or RetryPolicy(),
                           run_id=run_id or new_run_id())
        local: LocalCluster | None = None
        count = parse_local(address) if address else None
        if count is not None:
            if ray_connected():
                raise ConfigError("this process is connected to a Ray cluster already: a local:N cluster can't "
                                  "be started beside it (close the pool that made it, or ray.shutdown())")
            local = LocalCluster(count)
            address = await asyncio.to_thread(local.start)
        elif address == "auto":
            address = os.environ.get("RAY_ADDRESS", "").strip()
            if not address:
                raise ConfigError("--ray auto needs the cluster's address in $RAY_ADDRESS")
        try:
            ray = import_ray()
            owns = not ray.is_initialized()
            if owns:
                if address is None:
                    raise ConfigError("no Ray address given and this process is not connected to Ray: pass "
                                      "address= (host:port, auto, or local:N)")
                # in this thread (Ray installs its signal handlers here); about a second
                ray.init(address=address, namespace=namespace, log_to_driver=local is None, configure_logging=False)
            pool = cls(ray, Placer(), config, placements=placements, arch=arch, image=image, owns_ray=owns,
                       local=local)
            await pool._start_actors(capacity, backend, warm, nodes)
        except BaseException:
            if local is not None:
                if ray_connected():
                    sys.modules["ray"].shutdown()
                await asyncio.to_thread(local.stop)
            raise
        return pool

    async def _start_actors(self, capacity: int | None, backend: str, warm: int,
                            only: Sequence[str] | None) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [x["NodeID"] for x in self.ray.nodes() if x.get("Alive")]
        if only:
            missing = set(only) - set(alive)
            if missing:
                raise ConfigError(f"no live node {', '.join(sorted(missing))} in the cluster")
            alive = [x for x in alive if x in only]
        if not alive:
            raise ConfigError("the Ray cluster has no live node")
        remote = self.ray.remote(HostActor)
        actors = {
            nid: remote.options(
                num_cpus=0, max_restarts=0, max_task_retries=0, max_concurrency=10_000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nid, soft=False),
            ).remote(capacity, backend, warm)
            for nid in alive
        }  # fmt: skip
        statuses = await asyncio.gather(*(a.status.remote() for a in actors.values()))
        labels = {x.node_id: x.label for x in self.local.nodes} if self.local else {}
        for st in statuses:
            self.placer.add(Node(st.node_id, st.arch, st.capacity, actors[st.node_id],
                                 label=labels.get(st.node_id, st.node_id[:8])))
        self.config.concurrency = sum(st.capacity for st in statuses)  # the cluster's, in summaries

    # -- groups ------------------------------------------------------------------------------

    def _bundle(self, task: Task) -> Bundle:
        b = self._bundles.get(task.path)
        if b is None:
            b = self._bundles[task.path] = pack(task)
        return b

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
        group ends (every attempt also goes to ``on_result`` then, in order). A group whose
        node dies is placed whole again, up to ``placements`` times; it never raises for a
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
        bundle = await asyncio.to_thread(self._bundle, task)
        arches = task_arches(task.metadata, self.arch)
        cfg = RunConfig(**{**self.config.__dict__, "n": n, "concurrency": n})
        attempts: list[RolloutResult] = []
        used: dict[int, int] = {}  # sample -> attempts recorded so far
        info: dict[str, Any] = {"placements": []}
        t_first = time.perf_counter()
        final: list[RolloutResult] | None = None
        stats: dict[str, Any] = {}
        for k in range(1, self.placements + 1):
            try:
                node = await self.placer.place(n, arches)
            except NoNodeError as e:
                final = self._failed(task, policy, name, n, used, attempts, "no_node", str(e))
                break
            self._seq += 1
            job = GroupJob(key=f"{name}@{self._seq}", task=task, digest=bundle.digest, n=n, policy=policy,
                           config=cfg, image=image or self.image)
            where: dict[str, Any] = {"node": node.node_id, "label": node.label, "admitted": time.time()}
            info["placements"].append(where)
            info.setdefault("admitted", where["admitted"])
            t0 = time.perf_counter()
            try:
                end = await self._run_on(node, job, bundle)
            except _Lost as lost:
                where.update(lost=True, lost_at=time.time(), error=str(lost.cause)[:300],
                             seconds=time.perf_counter() - t0)
                log.warning("node %s lost with group %s (placement %d of %d): %s", node.label, name, k,
                            self.placements, str(lost.cause)[:200])
                self._renumber(lost.attempts, name, used, final=False)
                attempts += lost.attempts
                done = {r.sample for r in lost.attempts if r.final}
                last = k == self.placements
                for i in range(n):
                    if i not in done or last:
                        attempts.append(self._lost(task, policy, name, i, used, node, where, lost.cause, last))
                if last:
                    final = [max((r for r in attempts if r.sample == i), key=lambda r: r.attempt)
                             for i in range(n)]
                continue
            except Exception as e:  # an error of ours on the node (not a rollout failure)
                where.update(error=f"{type(e).__name__}: {e}"[:300])
                final = self._failed(task, policy, name, n, used, attempts, failure_reason(e), str(e))
                break
            finally:
                self.placer.release(node, n)
            where.update(seconds=time.perf_counter() - t0, node_s=end["node_s"], received_s=end["received"])
            got = sorted(end["attempts"], key=lambda r: (r.end, r.sample))
            self._renumber(got, name, used, final=None)
            finals = {r.sample: r for r in got if r.final}
            for r in end["results"]:  # the same attempts, with advantages
                mine = finals.get(r.sample)
                if mine is not None:
                    mine.advantage = r.advantage
            attempts += got
            final = [finals[i] for i in sorted(finals)]
            stats = end["stats"]
            info.update(node=node.node_id, label=node.label, node_s=end["node_s"])
            break
        assert final is not None
        if not stats:
            stats = group_advantages(final)
        info["driver_s"] = time.perf_counter() - t_first
        info["end"] = max((r.end for r in final), default=None)
        info["attempts"] = len(attempts)
        run = GroupRun(name, final, attempts, stats, info)
        self.runs.append(run)
        if on_result is not None:
            for r in attempts:
                on_result(r)
        return run

    async def _run_on(self, node: Node, job: GroupJob, bundle: Bundle) -> dict[str, Any]:
        """Run the job on the node; the end record, with the attempts streamed meanwhile.
        Raises _Lost when the node dies under it."""
        data = None if bundle.digest in node.shipped else bundle.data
        attempts: list[RolloutResult] = []
        for _try in range(2):
            gen = node.actor.run_group.options(num_returns="streaming").remote(job, data)
            try:
                async for ref in gen:
                    kind, item = await ref
                    if kind == "attempt":
                        attempts.append(item)
                    elif kind == "end":
                        node.shipped.add(bundle.digest)
                        return {**item, "attempts": attempts}
                raise RuntimeError(f"node {node.label} ended group {job.key} without its results")
            except asyncio.CancelledError:
                await asyncio.shield(self._cancel_on(node, job.key))
                raise
            except Exception as e:
                if is_node_loss(e):
                    self.placer.lose(node.node_id)
                    raise _Lost(attempts, e) from None
                cause = getattr(e, "cause", None) or e
                if isinstance(cause, FileNotFoundError) and data is None and not attempts:
                    node.shipped.discard(bundle.digest)  # the node lost its copy: ship it again
                    data = bundle.data
                    continue
                raise cause from None
        raise RuntimeError("unreachable")

    async def _cancel_on(self, node: Node, key: str) -> None:
        if node.lost:
            return
        try:
            async with asyncio.timeout(CANCEL_WAIT_S):
                await node.actor.cancel.remote(key)
        except Exception as e:
            log.error("cancelling group %s on node %s failed: %s", key, node.label, e)

    def _renumber(self, got: list[RolloutResult], name: str, used: dict[int, int], final: bool | None) -> None:
        """Number a placement's attempts after those before it; ids ``name#i`` / ``name#i~k``."""
        base = dict(used)
        for r in got:
            r.attempt += base.get(r.sample, 0)
            used[r.sample] = max(used.get(r.sample, 0), r.attempt)
            r.group = name
            r.rollout_id = f"{name}#{r.sample}" + (f"~{r.attempt}" if r.attempt > 1 else "")
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

    def _failed(self, task: Task, policy: Policy, name: str, n: int, used: dict[int, int],
                attempts: list[RolloutResult], reason: str, error: str) -> list[RolloutResult]:
        out = []
        for i in range(n):
            attempt = used.get(i, 0) + 1
            t = now()
            r = RolloutResult(
                rollout_id=f"{name}#{i}" + (f"~{attempt}" if attempt > 1 else ""), task=task.name, group=name,
                sample=i, agent=policy.name, backend=self.config.backend, start=t, end=t, status="failed",
                spans=[], run_id=self.config.run_id, attempt=attempt, reason=reason, error=error,
            )  # fmt: skip
            attempts.append(r)
            out.append(r)
        return out

    # -- nodes -------------------------------------------------------------------------------

    @property
    def nodes(self) -> list[Node]:
        return list(self.placer.nodes.values())

    async def status(self) -> list[NodeStatus]:
        """What every live node's host actor reports (capacity, free, arch, ...)."""
        live = [x for x in self.nodes if not x.lost]
        return list(await asyncio.gather(*(x.actor.status.remote() for x in live)))

    async def drain(self, node_id: str, *, wait: bool = True) -> None:
        """Take no new group on the node; with ``wait``, return once its groups have ended."""
        node = self.placer.drain(node_id)
        await node.actor.drain.remote(True)
        while wait and node.groups and not node.lost:
            await asyncio.sleep(0.05)

    async def undrain(self, node_id: str) -> None:
        """Let a drained node take groups again."""
        node = self.placer.node(node_id)
        await node.actor.drain.remote(False)
        self.placer.drain(node_id, on=False)

    async def leftovers(self) -> dict[str, dict[str, list[str]]]:
        """Sandbox markers and snapshots left on each live node (empty when nothing leaked)."""
        live = [x for x in self.nodes if not x.lost]
        got = await asyncio.gather(*(x.actor.leftovers.remote() for x in live))
        return {x.node_id: g for x, g in zip(live, got, strict=True)}

    def remove_local_node(self, node_id: str) -> None:
        """Kill a simulated node of a ``local:N`` pool, as a host that dies (tests, demos)."""
        if self.local is None:
            raise ConfigError("only a local:N pool's nodes can be removed")
        self.local.remove(node_id)

    async def close(self) -> list[str]:
        """Cancel what runs, stop the host actors (their sandboxes closed), disconnect, and
        stop a local cluster; returns what a local cluster's reaper removed."""
        if self._closed:
            return []
        self._closed = True
        reaped: list[str] = []
        t0 = time.perf_counter()
        me = asyncio.current_task()
        running = [t for t in self._active if t is not me]
        for t in running:  # groups still running: cancelled on their nodes, sandboxes closed
            t.cancel()
        if running:
            await asyncio.wait(running, timeout=CANCEL_WAIT_S)
        try:
            live = [x for x in self.nodes if not x.lost]
            results = await asyncio.gather(*(x.actor.shutdown.remote() for x in live), return_exceptions=True)
            for x, res in zip(live, results, strict=True):
                if isinstance(res, BaseException):
                    log.error("stopping the host actor of node %s failed: %s", x.label, res)
                elif res["sandboxes"] or res["snapshots"]:
                    log.error("node %s kept %s", x.label, res)
            for x in live:
                self.ray.kill(x.actor, no_restart=True)
            log.info("host actors stopped in %.1f s", time.perf_counter() - t0)
        finally:
            if self.owns_ray:
                self.ray.shutdown()
            if self.local is not None:
                t1 = time.perf_counter()
                reaped = await asyncio.to_thread(self.local.stop)
                log.info("local cluster stopped in %.1f s", time.perf_counter() - t1)
        return reaped

    async def __aenter__(self) -> RolloutPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())
