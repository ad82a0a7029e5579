"""``--remote URL,URL,...``: GRPO groups spread over several ``sandfleet serve`` hosts, without Ray.

    pool = await ServicePool.create(["http://cpu-1:8765", "http://cpu-2:8765"], token)
    run = await pool.run_group(task, 8, policy)      # 8 rollouts on one host, whole
    await pool.close()

The same placement and node-loss handling as the Ray pool (:class:`~sandfleet.cluster.groups.GroupPool`,
:class:`~sandfleet.cluster.placement.Placer`): a group goes whole to the host with the most free
capacity of the task's arch, where a host's capacity is the smaller of ``capacity`` and its
``/v1/info`` ``max_busy``, and its free capacity what this client has not placed there yet;
groups that fit nowhere wait (first come first served), and no host is given more than its
capacity. A group runs here, in this process, as ``run_suite`` of one task with the host's
:class:`~sandfleet.client.ServiceClient` as the backend of every sandbox it makes
(:func:`sandfleet.sandbox.use_backend`): its task image is built on that host from the
uploaded task folder (:mod:`sandfleet.server.taskimages`).

**Host loss.** A watcher per host asks ``/healthz`` every ``probe_s``; a refused or reset
connection twice in a row (a timeout alone is not a death) loses the host: it takes no group
again, its groups are cancelled here (their sandboxes' closes fail fast against a dead
host), every member in flight gets an attempt failed with reason ``node_lost``, and the group
is placed whole on another host, within ``placements``. A group that ends with failures is
checked the same way before its results are believed (the host may have died faster than
the watcher saw). A host that answers ``draining`` (SIGTERM) takes no new group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Unpack
from urllib.parse import urlsplit

import httpx

from sandfleet.cluster.groups import GroupPool, PoolOptions, _Lost, check_pool_options, pool_config
from sandfleet.cluster.host import GroupJob
from sandfleet.cluster.placement import Node, Placer
from sandfleet.errors import ConfigError, ServiceError
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.suite import RunConfig
from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)

DEAD_AFTER = 2
"""Refused or reset health checks in a row that lose a host."""


class HostLostError(ServiceError):
    """A service host stopped answering (connection refused or reset)."""


def parse_urls(text: str | Sequence[str]) -> list[str]:
    """``URL,URL,...`` (or a list) as distinct service URLs; ConfigError otherwise."""
    urls = [u.strip().rstrip("/") for u in (text.split(",") if isinstance(text, str) else text)]
    urls = [u for u in urls if u]
    if not urls:
        raise ConfigError("--remote needs at least one service URL")
    for u in urls:
        if not u.startswith(("http://", "https://")) or not urlsplit(u).netloc:
            raise ConfigError(f"a service URL starts with http:// or https:// and names a host, not {u!r}")
    dup = sorted({u for u in urls if urls.count(u) > 1})
    if dup:
        raise ConfigError(f"--remote names {', '.join(dup)} more than once")
    return urls


def _label(url: str) -> str:
    return urlsplit(url).netloc or url


def _dead(e: BaseException) -> bool:
    """A failure that means the host is gone (refused, reset, cut), not just slow."""
    if isinstance(e, httpx.TimeoutException):
        return False
    return isinstance(e, httpx.TransportError | ConnectionError)


class ServicePool(GroupPool):
    """GRPO groups over several sandbox services; make one with :meth:`create`."""

    def __init__(self, clients: dict[str, Any], placer: Placer, config: RunConfig, opts: PoolOptions, *,
                 probe_s: float) -> None:
        super().__init__(placer, config, opts)
        self.clients = clients
        self.probe_s = probe_s
        self._groups: dict[str, set[asyncio.Task[Any]]] = {url: set() for url in clients}
        self._last_ok: dict[str, float] = dict.fromkeys(clients, time.time())
        self._why: dict[str, BaseException] = {}
        self._watchers: list[asyncio.Task[None]] = []

    @classmethod
    async def create(
        cls,
        urls: str | Sequence[str],
        token: str | None = None,
        *,
        probe_s: float = 0.5,
        connect_kw: dict[str, Any] | None = None,
        **opts: Unpack[PoolOptions],
    ) -> ServicePool:
        """Connect to every service (``URL,URL,...`` or a list; the token in
        ``$SANDFLEET_TOKEN`` unless given) and read its limits and arch. ``capacity``: rollouts
        at once per host (default and ceiling: the service's ``max_busy``). The rest are
        :class:`~sandfleet.cluster.pool.RolloutPool`'s; ``connect_kw`` go to
        :func:`sandfleet.client.connect`."""
        from sandfleet.client.remote import token_from_env
        from sandfleet.client.service import connect

        hosts = parse_urls(urls)
        check_pool_options(opts)
        capacity = opts.get("capacity")
        token = token or token_from_env()
        got = await asyncio.gather(*(connect(u, token, **(connect_kw or {})) for u in hosts), return_exceptions=True)
        clients = {u: c for u, c in zip(hosts, got, strict=True) if not isinstance(c, BaseException)}
        bad = [(u, c) for u, c in zip(hosts, got, strict=True) if isinstance(c, BaseException)]
        if bad:
            await asyncio.gather(*(c.aclose() for c in clients.values()), return_exceptions=True)
            raise bad[0][1]
        placer = Placer()
        total = 0
        for url, c in clients.items():
            info = c.info
            cap = int(info.get("max_busy") or 1)
            if capacity is not None:
                cap = min(cap, capacity)
            total += cap
            placer.add(Node(url, str(info.get("arch") or "unknown"), cap, c, draining=bool(info.get("draining")),
                            label=_label(url)))
        pool = cls(clients, placer, pool_config(opts, total), opts, probe_s=probe_s)
        pool._watchers = [asyncio.create_task(pool._watch(n)) for n in placer.nodes.values()]
        return pool

    # -- groups

    async def _prepare(self, task: Task) -> tuple[str, None]:
        from sandfleet.tasks.bundle import content_hash

        return await asyncio.to_thread(content_hash, task.path), None  # each host's image: ensure_task_image

    async def _run_on(self, node: Node, job: GroupJob, payload: Any) -> dict[str, Any]:
        from sandfleet.rollout.suite import run_suite
        from sandfleet.sandbox import use_backend

        attempts: list[RolloutResult] = []
        t0 = time.perf_counter()
        fixed = job.image
        kw: dict[str, Any] = {}
        if fixed is not None:
            async def image_for(t: Task) -> str:
                return fixed

            kw["image_for"] = image_for

        def on_result(r: RolloutResult) -> None:
            r.info["node"] = node.node_id
            attempts.append(r)

        async def body() -> Any:
            with use_backend(node.actor):
                return await run_suite([job.task], job.policy, job.config, on_result=on_result, samples=job.samples,
                                       **kw)

        started = time.time()
        task = asyncio.create_task(body())
        running = self._groups[node.node_id]
        running.add(task)
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait({task})
            raise
        finally:
            running.discard(task)
        if task.cancelled():  # only the watcher cancels it: the host is lost
            raise _Lost(self._kept(node, attempts, started), self._why.get(node.node_id) or HostLostError(
                f"{node.label} was lost", code="unreachable"))
        error = task.exception()
        report = None if error is not None else task.result()
        failed = report is None or any(r.status != "completed" for r in report.results)
        if failed and not node.lost:
            await self._check(node)
        if node.lost:
            raise _Lost(self._kept(node, attempts, started), self._why.get(node.node_id) or HostLostError(
                f"{node.label} was lost", code="unreachable"))
        if error is not None:
            raise error
        assert report is not None
        for r in report.results:
            r.info["node"] = node.node_id
        return {"attempts": attempts, "results": report.results, "stats": report.groups.get(job.task.name, {}),
                "node_s": time.perf_counter() - t0, "received": 0.0}

    def _kept(self, node: Node, attempts: list[RolloutResult], started: float) -> list[RolloutResult]:
        """The attempts a lost host really finished: completed ones, and failures from before
        it was last seen alive (later ones are the loss itself, which node_lost stands for)."""
        seen = self._last_ok.get(node.node_id, started)
        return [r for r in attempts if r.status == "completed" or (r.status == "failed" and r.end < seen)]

    # -- hosts

    async def _probe(self, node: Node) -> str:
        """``ok``, ``draining``, or ``slow`` (no answer in time); raises what a dead host raises."""
        try:
            resp = await node.actor.http.get("/healthz", timeout=httpx.Timeout(5.0, connect=2.0))
        except httpx.TimeoutException:
            return "slow"
        if resp.status_code != 200:
            return "slow"
        body = resp.json()
        return "draining" if body.get("draining") else "ok"

    async def _check(self, node: Node) -> bool:
        """Probe the host now (twice, a moment apart, when refused); lose it if it is dead."""
        for i in range(DEAD_AFTER):
            try:
                state = await self._probe(node)
            except Exception as e:
                if not _dead(e):
                    return True
                if i + 1 == DEAD_AFTER:
                    self._lose(node, e)
                    return False
                await asyncio.sleep(0.2)
                continue
            self._seen(node, state)
            return True
        return True

    def _seen(self, node: Node, state: str) -> None:
        if state == "ok":
            self._last_ok[node.node_id] = time.time()
            if node.draining and not node.lost:
                self.placer.drain(node.node_id, on=False)
        elif state == "draining" and not node.draining:
            log.warning("service %s is draining: no new group goes there", node.label)
            self.placer.drain(node.node_id)

    async def _watch(self, node: Node) -> None:
        fails = 0
        while not self._closed and not node.lost:
            try:
                self._seen(node, await self._probe(node))
                fails = 0
            except Exception as e:
                if not _dead(e):
                    log.warning("health check of %s failed: %s: %s", node.label, type(e).__name__, e)
                else:
                    fails += 1
                    if fails >= DEAD_AFTER:
                        self._lose(node, e)
                        return
            await asyncio.sleep(self.probe_s)

    def _lose(self, node: Node, cause: BaseException) -> None:
        if node.lost:
            return
        self._why[node.node_id] = HostLostError(f"{node.label} stopped answering: {type(cause).__name__}: {cause}",
                                                code="unreachable")
        log.warning("service %s lost (%s); its groups are placed again", node.label, cause)
        self.placer.lose(node.node_id)
        for t in self._groups.get(node.node_id, ()):
            t.cancel()

    def drain(self, url: str, on: bool = True) -> None:
        """Place no new group on the host (``on=False``: again)."""
        self.placer.drain(url.rstrip("/"), on=on)

    async def leftovers(self) -> dict[str, list[str]]:
        """This token's live sandboxes on each host that is not lost (empty when nothing leaked)."""
        live = [x for x in self.nodes if not x.lost]
        got = await asyncio.gather(*(x.actor.find() for x in live))
        return {x.node_id: [str(s["id"]) for s in g] for x, g in zip(live, got, strict=True)}

    async def close(self) -> None:
        """Cancel the groups still running (their sandboxes closed), stop watching, disconnect."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._cancel_groups()
        finally:
            for w in self._watchers:
                w.cancel()
            await asyncio.gather(*self._watchers, return_exceptions=True)
            await asyncio.gather(*(c.aclose() for c in self.clients.values()), return_exceptions=True)

    async def __aenter__(self) -> ServicePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
