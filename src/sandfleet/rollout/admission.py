"""Concurrency slots handed out a group at a time.

A GRPO trainer samples a group's n rollouts together, so a run admits them together:
:meth:`Slots.admit` waits until ``k`` slots are free and takes them all at once, first come
first served (a group that asked earlier is never overtaken by a smaller one). No group ever
starts with part of its members while the rest queue. Each member gives its slot back as it
ends (:meth:`Admission.release_one`), and whatever the group still holds goes back when it
leaves the ``async with``, whatever happened.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sandfleet.errors import ConfigError


class Slots:
    """``capacity`` concurrency slots; a waiter takes ``k`` of them at once, in FIFO order."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ConfigError(f"concurrency must be at least 1, not {capacity}")
        self.capacity = capacity
        self._free = capacity
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def free(self) -> int:
        return self._free

    async def acquire(self, k: int) -> None:
        """Take ``k`` slots at once, waiting behind earlier waiters until they are free."""
        if not 1 <= k <= self.capacity:
            raise ConfigError(f"cannot admit {k} rollouts at once with concurrency {self.capacity}: "
                              f"the concurrency must be at least the group size")
        if not self._waiters and self._free >= k:
            self._free -= k
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (k, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted just as we were cancelled
                self.release(k)
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._wake()  # a smaller waiter behind us may fit now
            raise

    def release(self, k: int = 1) -> None:
        if self._free + k > self.capacity:
            raise RuntimeError(f"released more slots than were taken ({self._free} + {k} > {self.capacity})")
        self._free += k
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self._free:
            k, waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self._free -= k
            waiter.set_result(None)

    @asynccontextmanager
    async def admit(self, k: int) -> AsyncIterator[Admission]:
        """Hold ``k`` slots for a group; members give theirs back one by one as they end."""
        await self.acquire(k)
        admission = Admission(self, k)
        try:
            yield admission
        finally:
            admission.release_all()


class Admission:
    """The slots one admitted group still holds."""

    def __init__(self, slots: Slots, held: int):
        self.slots = slots
        self.held = held

    def release_one(self) -> None:
        if self.held > 0:
            self.held -= 1
            self.slots.release(1)

    def release_all(self) -> None:
        if self.held > 0:
            held, self.held = self.held, 0
            self.slots.release(held)
