"""A warm pool: K sandboxes of one spec kept ready, refilled in the background, and an
admission limit on busy sandboxes so a host is never asked for more than it holds.

    async with WarmPool(spec, size=8, max_busy=64) as pool:
        async with pool.sandbox() as sb:   # fresh sandbox, closed on exit
            await sb.exec("make test")

Every sandbox handed out is fresh and is closed after use, never recycled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from sandfleet.errors import ConfigError, PoolError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)


def default_max_busy() -> int:
    """One busy sandbox per hardware thread, by default."""
    return os.cpu_count() or 1


class WarmPool:
    def __init__(self, spec: SandboxSpec | None = None, *, size: int = 4, max_busy: int | None = None):
        if size < 0 or size > 100_000:
            raise ConfigError(f"pool size must be between 0 and 100000, not {size}")
        max_busy = default_max_busy() if max_busy is None else max_busy
        if max_busy < 1:
            raise ConfigError(f"max_busy must be at least 1, not {max_busy}")
        self.spec = spec or SandboxSpec()
        self.size = size
        self.max_busy = max_busy
        self._ready: asyncio.Queue[Sandbox] = asyncio.Queue()
        self._busy = asyncio.Semaphore(max_busy)
        self._refill_wanted = asyncio.Event()
        self._refiller: asyncio.Task[None] | None = None
        self._closed = False
        self.errors = 0
        self.busy = 0

    async def start(self) -> WarmPool:
        if self._refiller is None:
            self._refiller = asyncio.create_task(self._refill_loop(), name="sandfleet-pool-refill")
            self._refill_wanted.set()
        return self

    async def _refill_loop(self) -> None:
        while not self._closed:
            await self._refill_wanted.wait()
            self._refill_wanted.clear()
            while not self._closed and self._ready.qsize() < self.size:
                try:
                    sb = await create_sandbox(self.spec)
                except Exception as e:  # keep serving; the error is counted and logged
                    self.errors += 1
                    log.warning("warm pool could not create a sandbox: %s", e)
                    await asyncio.sleep(min(5.0, 0.1 * 2 ** min(self.errors, 6)))
                    continue
                if self._closed:
                    await sb.close()
                    return
                self._ready.put_nowait(sb)

    async def acquire(self) -> Sandbox:
        """A ready sandbox (created now if none is warm). Blocks while max_busy are out."""
        if self._closed:
            raise PoolError("the pool is closed")
        await self._busy.acquire()
        try:
            sb: Sandbox | None = None
            while sb is None:
                try:
                    candidate = self._ready.get_nowait()
                except asyncio.QueueEmpty:
                    candidate = await create_sandbox(self.spec)
                if candidate.alive:
                    sb = candidate
                else:  # died while waiting (TTL): drop it
                    await candidate.close()
            self._refill_wanted.set()
            self.busy += 1
            return sb
        except BaseException:
            self._busy.release()
            raise

    async def release(self, sb: Sandbox) -> None:
        """Close a sandbox taken with acquire() and free its busy slot."""
        try:
            await sb.close()
        finally:
            self.busy -= 1
            self._busy.release()

    @contextlib.asynccontextmanager
    async def sandbox(self) -> AsyncIterator[Sandbox]:
        sb = await self.acquire()
        try:
            yield sb
        finally:
            await asyncio.shield(self.release(sb))

    @property
    def ready(self) -> int:
        return self._ready.qsize()

    async def wait_ready(self, n: int | None = None, timeout: float = 60.0) -> None:
        """Wait until ``n`` (default: size) sandboxes are warm."""
        want = self.size if n is None else n
        async with asyncio.timeout(timeout):
            while self._ready.qsize() < want:
                await asyncio.sleep(0.005)

    async def close(self) -> None:
        self._closed = True
        if self._refiller is not None:
            self._refiller.cancel()
            with contextlib.suppress(BaseException):
                await self._refiller
        while not self._ready.empty():
            await self._ready.get_nowait().close()

    async def __aenter__(self) -> WarmPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
