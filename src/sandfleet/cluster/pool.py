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
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Unpack

from sandfleet.cluster._ray import import_ray, is_node_loss
from sandfleet.cluster.groups import CANCEL_WAIT_S, GroupPool, PoolOptions, _Lost, check_pool_options, pool_config
from sandfleet.cluster.groups import NODE_LOST as NODE_LOST  # noqa: F401 (its home before groups.py)
from sandfleet.cluster.groups import GroupRun as GroupRun  # noqa: F401
from sandfleet.cluster.host import GroupJob, HostActor, NodeStatus
from sandfleet.cluster.local import LocalCluster, parse_local
from sandfleet.cluster.placement import Node, Placer
from sandfleet.errors import ConfigError
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.suite import RunConfig
from sandfleet.settings import current as current_settings
from sandfleet.tasks.bundle import Bundle, pack
from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)


class RolloutPool(GroupPool):
    """GRPO groups on a Ray cluster; make one with :meth:`create`."""

    def __init__(self, ray: Any, placer: Placer, config: RunConfig, opts: PoolOptions, *, owns_ray: bool,
                 local: LocalCluster | None) -> None:
        super().__init__(placer, config, opts)
        self.ray = ray
        self.owns_ray = owns_ray
        self.local = local
        self._bundles: dict[Path, Bundle] = {}

    @classmethod
    async def create(
        cls,
        address: str | None = None,
        *,
        warm: int = 0,
        nodes: Sequence[str] | None = None,
        namespace: str = "sandfleet",
        **opts: Unpack[PoolOptions],
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
        these node ids. The rest are :class:`~sandfleet.cluster.groups.PoolOptions`."""
        check_pool_options(opts)
        capacity, backend = opts.get("capacity"), opts.get("backend", "auto")
        config = pool_config(opts, capacity or 1)
        local: LocalCluster | None = None
        count = parse_local(address) if address else None
        if count is not None:
            if ray_connected():
                raise ConfigError("this process is connected to a Ray cluster already: a local:N cluster can't "
                                  "be started beside it (close the pool that made it, or ray.shutdown())")
            local = LocalCluster(count)
            address = await asyncio.to_thread(local.start)
        elif address == "auto":
            address = (current_settings().ray_address or "").strip()
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
            pool = cls(ray, Placer(), config, opts, owns_ray=owns, local=local)
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

    async def _prepare(self, task: Task) -> tuple[str, Bundle]:
        bundle = await asyncio.to_thread(self._bundle, task)
        return bundle.digest, bundle

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

    # -- nodes -------------------------------------------------------------------------------

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
        await self._cancel_groups()  # groups still running: cancelled on their nodes, sandboxes closed
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
