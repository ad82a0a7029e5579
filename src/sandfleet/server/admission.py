"""Admission: the two limits of a service, their defaults from the host, and a fair queue.

``max_sandboxes`` bounds live sandboxes (memory), ``max_busy`` bounds commands running at
once (CPU). A request over a limit waits in a :class:`Gate`: owners (tokens) take turns,
first come first served within one owner, so a trainer that floods the service never
starves another. A waiter that is still waiting at its deadline gets
:class:`AdmissionRejected` (HTTP 429 with ``Retry-After``).

The defaults (docs/service.md, "Admission"):

- ``max_busy`` = the host's hardware threads: the capacity benchmark measured 1.0 busy
  sandbox per thread at a 1.5x p95 slowdown (docs/bench.md); a ``bench run`` result given
  with ``--capacity-from`` replaces it with that host's own measured capacity.
- ``max_sandboxes`` = (MemAvailable x 0.9 - max_busy x BUSY_MIB) / IDLE_MIB, capped by the
  open-file limit (FDS_PER_SANDBOX each): every busy sandbox may use a default memory limit,
  and each idle one costs IDLE_MIB (measured ~1.5 MiB of MemAvailable per idle bwrap
  sandbox, with a margin for the writable layer and page cache it brings in).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandfleet.errors import ConfigError
from sandfleet.sandbox.hostlimits import FD_RESERVE, FDS_PER_IDLE

BUSY_MIB = 1024
"""Memory set aside per busy sandbox: the default memory limit (Limits.memory_mib)."""
IDLE_MIB = 16
"""Memory per idle sandbox."""
FDS_PER_SANDBOX = FDS_PER_IDLE
"""Open files the service holds per sandbox (sandbox/hostlimits.py says which)."""
RESERVED_FDS = FD_RESERVE


@dataclass(frozen=True)
class HostLimits:
    max_sandboxes: int
    max_busy: int
    basis: str
    """How the numbers were found (shown by /v1/info and the log)."""


def mem_available_mib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 4096.0


def measured_capacity(path: Path) -> int:
    """The capacity (busy sandboxes within the latency target: ``capacity.sandboxes``) in a
    ``sandfleet bench run`` result."""
    try:
        cap = json.loads(path.read_text())["capacity"]
        raw: Any = cap["sandboxes"] if isinstance(cap, dict) else cap
        n = int(raw)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--capacity-from {path}: no capacity figure in it ({type(e).__name__}: {e})") from None
    if n < 1:
        raise ConfigError(f"--capacity-from {path}: the measured capacity is {raw} sandboxes (past the latency "
                          "target already at the smallest load): give --max-busy")
    return n


def host_limits(max_sandboxes: int | None = None, max_busy: int | None = None,
                capacity_from: Path | None = None) -> HostLimits:
    """The service's limits: what was given, else the defaults the module docstring states."""
    basis = []
    if max_busy is None:
        if capacity_from is not None:
            max_busy = measured_capacity(capacity_from)
            basis.append(f"max_busy {max_busy} = measured capacity in {capacity_from}")
        else:
            max_busy = os.cpu_count() or 1
            basis.append(f"max_busy {max_busy} = hardware threads")
    if max_sandboxes is None:
        avail = mem_available_mib()
        by_mem = int((avail * 0.9 - max_busy * BUSY_MIB) / IDLE_MIB)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        by_fds = max(1, (soft - RESERVED_FDS) // FDS_PER_SANDBOX) if soft != resource.RLIM_INFINITY else by_mem
        max_sandboxes = max(max_busy, min(by_mem, by_fds))
        basis.append(f"max_sandboxes {max_sandboxes} = min((MemAvailable {avail:.0f} MiB x 0.9 - {max_busy} x "
                     f"{BUSY_MIB} MiB) / {IDLE_MIB} MiB, "
                     f"(open-file limit {soft} - {RESERVED_FDS}) / {FDS_PER_SANDBOX})")
    if max_busy < 1 or max_sandboxes < 1:
        raise ConfigError(f"--max-busy and --max-sandboxes must be at least 1 (got {max_busy}, {max_sandboxes})")
    return HostLimits(max_sandboxes=max_sandboxes, max_busy=max_busy, basis="; ".join(basis) or "given")


class AdmissionRejected(Exception):
    """Still over the limit at the deadline; ``retry_after`` in seconds."""

    def __init__(self, gate: str, retry_after: int):
        super().__init__(f"the service is at its {gate} limit; retry after {retry_after}s")
        self.gate = gate
        self.retry_after = retry_after


class Gate:
    """``capacity`` slots; waiters take turns by owner, FIFO within an owner, until a deadline."""

    def __init__(self, name: str, capacity: int):
        if capacity < 1:
            raise ConfigError(f"{name}: capacity must be at least 1, not {capacity}")
        self.name = name
        self.capacity = capacity
        self.in_use = 0
        self._queues: OrderedDict[str, deque[tuple[int, asyncio.Future[None]]]] = OrderedDict()
        self._hold = 1.0  # moving mean of how long a slot is held, seconds (for Retry-After)

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def try_acquire(self, k: int = 1) -> bool:
        if not self._queues and self.in_use + k <= self.capacity:
            self.in_use += k
            return True
        return False

    async def acquire(self, owner: str, deadline: float, k: int = 1) -> bool:
        """Take ``k`` slots; True when it had to queue. Raises AdmissionRejected at ``deadline``
        (a ``time.monotonic()`` value) and ConfigError for more slots than exist."""
        if k > self.capacity:
            raise ConfigError(f"{k} {self.name} at once is more than this service's limit of {self.capacity}")
        if self.try_acquire(k):
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (k, fut)
        self._queues.setdefault(owner, deque()).append(entry)
        try:
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + max(0.0, deadline - time.monotonic())):
                await fut
        except BaseException as e:
            if fut.done() and not fut.cancelled():  # granted just as the wait ended
                self.release(k)
            else:
                q = self._queues.get(owner)
                if q is not None and entry in q:
                    q.remove(entry)
                    if not q:
                        del self._queues[owner]
                self._wake()  # a smaller waiter behind may fit now
            if isinstance(e, TimeoutError):
                raise AdmissionRejected(self.name, self.retry_after()) from None
            raise
        return True

    def release(self, k: int = 1, held_s: float | None = None) -> None:
        self.in_use = max(0, self.in_use - k)
        if held_s is not None:
            self._hold = 0.9 * self._hold + 0.1 * held_s
        self._wake()

    def retry_after(self) -> int:
        """Seconds until a new request may be admitted, roughly: the queue ahead drained at
        ``capacity`` slots per mean hold time."""
        return max(1, math.ceil(self._hold * (self.waiting + 1) / self.capacity))

    def _wake(self) -> None:
        while self._queues:
            owner, q = next(iter(self._queues.items()))
            k, fut = q[0]
            if fut.done():
                q.popleft()
            elif self.in_use + k <= self.capacity:
                q.popleft()
                self.in_use += k
                fut.set_result(None)
                self._queues.move_to_end(owner)  # the next owner's turn
            else:
                return
            if not q:
                del self._queues[owner]
