"""The host actor: one per node, owning that node's sandboxes.

It runs on its node (pinned there by node affinity, never restarted elsewhere) and owns
what is the node's own: the admission limit (``capacity`` busy rollouts, a group admitted
whole: :class:`~sandfleet.rollout.admission.Slots`), the image cache (task images are built
there, in the node's ``SANDFLEET_CACHE``), the task folders shipped to it by content hash
(:mod:`sandfleet.tasks.bundle`), a warm pool of sandboxes where asked
(:mod:`sandfleet.cluster.warm`), and its sandbox markers (``SANDFLEET_STATE``).

Every sandbox is created on one long-lived thread running the actor's own event loop,
started with the actor and stopped with it: the bwrap holder (and the microvm's QEMU) is
started with ``PR_SET_PDEATHSIG``, which fires when the *thread* that forked it exits, so a
sandbox created from a short-lived thread would be killed when that thread ends. Ray's
calls only hand work to that loop and wait for it.

A group runs as :func:`~sandfleet.rollout.suite.run_suite` of one task on this node; each
attempt is streamed back to the driver as it ends, then the group's final results (with
their advantages) and how long it took here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sandfleet.errors import ConfigError
from sandfleet.rollout.admission import Slots
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.suite import RunConfig
from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class GroupJob:
    """One group, as the driver sends it to a node."""

    key: str
    """Unique per placement (the driver's group id and placement number)."""
    task: Task
    """The task as loaded on the driver (its host paths are the driver's)."""
    digest: str
    """Content hash of the task folder (:func:`sandfleet.tasks.bundle.pack`)."""
    n: int
    policy: Policy
    config: RunConfig
    image: str | None = None
    """Run in this image instead of the task's own (built on the node)."""
    samples: tuple[int, ...] | None = None
    """Run only these members (a refill of those a lost node did not finish); None: all n."""
    sent: float = field(default_factory=time.time)


@dataclass
class NodeStatus:
    """What a host actor reports."""

    node_id: str
    hostname: str
    arch: str
    capacity: int
    free: int
    groups: int
    draining: bool
    backend: str
    state_dir: str
    cache_dir: str
    pid: int
    warm: int = 0


class HostActor:
    """The node's sandfleet: made with ``ray.remote(HostActor).options(...)`` by the pool."""

    def __init__(self, capacity: int | None = None, backend: str = "auto", warm: int = 0) -> None:
        import ray

        from sandfleet.sandbox import resolve_backend

        self.node_id = ray.get_runtime_context().get_node_id()
        self.capacity = capacity or os.cpu_count() or 1
        if self.capacity < 1:
            raise ConfigError(f"node capacity must be at least 1, not {self.capacity}")
        self.backend = resolve_backend(backend)
        self.draining = False
        self.warm_size = warm
        self._running: dict[str, concurrent.futures.Future[Any]] = {}
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sandfleet-host-loop", daemon=True)
        self._thread.start()
        self.slots: Slots = self._call_sync(self._make_slots())
        self.warm: Any = None
        if warm:
            from sandfleet.cluster.warm import WarmBackend

            self.warm = self._call_sync(WarmBackend.start(self.backend, warm))

    async def _make_slots(self) -> Slots:
        return Slots(self.capacity)

    def _call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the actor's own loop thread; cancelling the caller cancels it."""
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            fut.cancel()
            raise

    def status(self) -> NodeStatus:
        from sandfleet.agent.build import cache_dir
        from sandfleet.imagestore import arch
        from sandfleet.sandbox.state import state_root

        return NodeStatus(
            node_id=self.node_id, hostname=socket.gethostname(), arch=arch(), capacity=self.capacity,
            free=self.slots.free, groups=len(self._running), draining=self.draining, backend=self.backend,
            state_dir=str(state_root()), cache_dir=str(cache_dir()), pid=os.getpid(),
            warm=self.warm.ready if self.warm is not None else 0,
        )  # fmt: skip

    def drain(self, on: bool = True) -> NodeStatus:
        """Stop (or resume) taking groups; those running go on."""
        self.draining = on
        return self.status()

    def has_task(self, digest: str) -> bool:
        return (self._tasks_root() / digest).is_dir()

    def _tasks_root(self) -> Path:
        from sandfleet.agent.build import cache_dir

        return cache_dir() / "cluster" / "tasks"

    async def run_group(self, job: GroupJob, data: bytes | None = None) -> AsyncIterator[tuple[str, Any]]:
        """Run one group here; yields ``("attempt", RolloutResult)`` as each attempt ends,
        then ``("end", {...})``: the final results, the group's statistics, seconds here."""
        if self.draining:
            raise ConfigError(f"node {self.node_id} is draining: it takes no new group")
        if job.key in self._running:
            raise ConfigError(f"group {job.key} is running here already")
        here = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(item: tuple[str, Any]) -> None:
            here.call_soon_threadsafe(queue.put_nowait, item)

        fut = asyncio.run_coroutine_threadsafe(self._group(job, data, emit), self._loop)
        self._running[job.key] = fut
        fut.add_done_callback(lambda _f: emit(("done", None)))
        try:
            while True:
                kind, item = await queue.get()
                if kind == "done":
                    break
                yield kind, item
            yield "end", fut.result()
        finally:
            if not fut.done():
                fut.cancel()  # the driver went away or cancelled: the group's sandboxes are closed
            self._running.pop(job.key, None)

    async def _group(self, job: GroupJob, data: bytes | None,
                     emit: Callable[[tuple[str, Any]], None]) -> dict[str, Any]:
        t0 = time.perf_counter()
        start = time.time()
        me = asyncio.current_task()
        assert me is not None
        self._tasks[job.key] = me
        try:
            return await self._run(job, data, emit, t0, start)
        finally:
            self._tasks.pop(job.key, None)

    async def _run(self, job: GroupJob, data: bytes | None, emit: Callable[[tuple[str, Any]], None],
                   t0: float, start: float) -> dict[str, Any]:
        from sandfleet.rollout.suite import default_image_for, run_suite
        from sandfleet.tasks.bundle import relocate, unpack

        folder = self._tasks_root() / job.digest
        if not folder.is_dir():
            if data is None:
                raise FileNotFoundError(f"task {job.digest} is not on node {self.node_id}")
            folder = await asyncio.to_thread(unpack, job.digest, data, self._tasks_root())
        task = relocate(job.task, folder)
        fixed = job.image

        async def image_for(t: Task) -> str:
            return fixed if fixed is not None else await default_image_for(t)

        def on_result(r: Any) -> None:
            r.info["node"] = self.node_id
            emit(("attempt", r))

        if self.warm is not None:
            from sandfleet.sandbox import use_backend

            with use_backend(self.warm):
                report = await run_suite([task], job.policy, job.config, image_for=image_for,
                                         on_result=on_result, slots=self.slots, samples=job.samples)
        else:
            report = await run_suite([task], job.policy, job.config, image_for=image_for, on_result=on_result,
                                     slots=self.slots, samples=job.samples)
        for r in report.results:
            r.info["node"] = self.node_id
        return {"results": report.results, "stats": report.groups.get(task.name, {}), "node_s":
                time.perf_counter() - t0, "start": start, "received": start - job.sent,
                "snapshot_errors": report.snapshot_errors}

    async def cancel(self, key: str | None = None) -> int:
        """Cancel one running group (or all) and wait until their sandboxes are closed."""
        return await self._on_loop(self._cancel(key))

    async def _cancel(self, key: str | None) -> int:
        tasks = [t for k, t in list(self._tasks.items()) if key is None or k == key]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each closes its sandboxes before it ends
        return len(tasks)

    async def call(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """``await fn(*args)`` on this node's loop thread (``fn`` a module-level coroutine
        function, which Ray sends by reference): how a higher layer runs its own work on every
        node (``sandfleet bench run --ray``: :func:`sandfleet.bench.nodes.bench_here`)."""
        return await self._on_loop(fn(*args))

    def leftovers(self) -> dict[str, list[str]]:
        """The sandbox markers and snapshots this node's state directory holds."""
        from sandfleet.sandbox.state import SNAPSHOTS, list_sandboxes, state_root

        snaps = state_root() / SNAPSHOTS
        return {"sandboxes": [str(m["id"]) for m in list_sandboxes()],
                "snapshots": sorted(p.name for p in snaps.iterdir()) if snaps.is_dir() else []}

    async def shutdown(self) -> dict[str, list[str]]:
        """Cancel everything, close the warm pool, stop the loop thread; what is left."""
        await self.cancel()
        if self.warm is not None:
            await self._on_loop(self.warm.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        return self.leftovers()
