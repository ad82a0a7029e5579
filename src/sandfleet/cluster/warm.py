"""A node's warm pool: sandboxes of the specs its groups ask for, made ahead of time.

:class:`WarmBackend` stands in for the node's backend (through
:func:`sandfleet.sandbox.use_backend`, the public seam ``--remote`` uses too). The first
sandbox of a spec is made on demand and starts a warm pool
of that spec (``size`` kept ready, refilled in the background); later ones are taken from it. Pools of the ``keep`` most
recently used specs are kept; older ones are closed. A sandbox handed out is fresh and is
closed by its user, never recycled. Forks (``--fork`` groups) go to the backend as they are.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import OrderedDict

from sandfleet.sandbox.base import Backend, Sandbox, Snapshot
from sandfleet.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)


class _Warm:
    """Ready sandboxes of one spec, refilled in the background up to ``size``."""

    def __init__(self, backend: Backend, spec: SandboxSpec, size: int):
        self.backend, self.spec, self.size = backend, spec, size
        self.ready: list[Sandbox] = []
        self.dead: list[Sandbox] = []
        self.errors = 0
        self.refill: asyncio.Task[None] | None = None

    def want(self) -> None:
        if self.refill is None or self.refill.done():
            # a clean context: the refill must reach the real backend, not the WarmBackend
            self.refill = asyncio.get_running_loop().create_task(
                self._fill(), name="sandfleet-pool-warm", context=contextvars.Context())

    async def _fill(self) -> None:
        while len(self.ready) < self.size:
            try:
                self.ready.append(await self.backend.create(self.spec))
            except Exception as e:  # keep serving from the backend; counted and logged
                self.errors += 1
                log.warning("warm pool could not create a sandbox: %s", e)
                return

    def take(self) -> Sandbox | None:
        while self.ready:
            sb = self.ready.pop(0)
            if sb.alive:
                return sb
            self.dead.append(sb)
        return None

    async def close(self) -> None:
        if self.refill is not None:
            self.refill.cancel()
            await asyncio.gather(self.refill, return_exceptions=True)
        for sb in [*self.ready, *self.dead]:
            await sb.close()
        self.ready, self.dead = [], []


class WarmBackend:
    """Serves ``create`` from per-spec warm pools; everything else from ``backend``."""

    def __init__(self, backend: Backend, size: int, keep: int = 4):
        self.backend = backend
        self.name = backend.name
        self.size = size
        self.keep = keep
        self.pools: OrderedDict[str, _Warm] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @classmethod
    async def start(cls, backend_name: str, size: int) -> WarmBackend:
        from sandfleet.sandbox import get_backend

        return cls(get_backend(backend_name), size)

    @property
    def ready(self) -> int:
        return sum(len(p.ready) for p in self.pools.values())

    async def create(self, spec: SandboxSpec) -> Sandbox:
        key = spec.model_dump_json()
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = _Warm(self.backend, spec, self.size)
            while len(self.pools) > self.keep:
                _, old = self.pools.popitem(last=False)
                await old.close()
        self.pools.move_to_end(key)
        sb = pool.take()
        pool.want()
        if sb is not None:
            self.hits += 1
            return sb
        self.misses += 1
        return await self.backend.create(spec)

    async def fork(self, snapshot: Snapshot, n: int) -> list[Sandbox]:
        return await self.backend.fork(snapshot, n)

    async def close(self) -> None:
        while self.pools:
            _, pool = self.pools.popitem()
            await pool.close()
