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
from collections.abc import AsyncIterator, Sequence
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


BENCH_ADVICE = ("the capacity benchmark (`sandfleet bench run`, docs/bench.md) measures how many busy "
                "sandboxes this host holds at a latency target: the documented way to choose more")


def host_capacity(cpus: Sequence[float], host_cpus: int | None = None) -> int:
    """How many sandboxes the host's CPUs hold at the tasks' declared ``cpus`` without
    oversubscribing: ``floor(host CPUs / the largest cpus)``, at least 1 (a task without a
    declared figure counts 1)."""
    from sandfleet.sandbox.contention import host_cpus as _host_cpus

    ncpu = host_cpus or _host_cpus()
    widest = max((c for c in cpus if c and c > 0), default=1.0)
    return max(1, int(ncpu // widest + 1e-9))


def choose_concurrency(value: str | int | None, cpus: Sequence[float], *, group: int = 1,
                       host_cpus: int | None = None) -> tuple[int, list[str]]:
    """The concurrency ``--concurrency value`` means (``auto``/None: :func:`host_capacity`, at
    least ``group`` so that a group can be admitted), and what to say about it: the auto
    figure and why, or a warning where it oversubscribes the host's CPUs."""
    from sandfleet.sandbox.contention import host_cpus as _host_cpus

    ncpu = host_cpus or _host_cpus()
    cap = host_capacity(cpus, ncpu)
    widest = max((c for c in cpus if c and c > 0), default=1.0)
    held = f"{ncpu} CPUs hold {cap} sandbox{'es' if cap != 1 else ''} at cpus = {widest:g}"
    if value is None or str(value).strip().lower() == "auto":
        if group > cap:
            return group, [f"concurrency auto: {group} (the group size; the host's {held}, so a group of "
                           f"{group} oversubscribes it: failing timing tests may be masked as host_contention)"]
        return cap, [f"concurrency auto: {cap} (the host's {held})"]
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"--concurrency must be a number or 'auto', not {value!r}") from None
    if n > cap:
        return n, [f"warning: --concurrency {n} oversubscribes this host (its {held}); sandboxes will wait "
                   f"for CPUs, and failing tests under that contention are masked (host_contention). "
                   f"{BENCH_ADVICE}"]
    return n, []
