"""Where a group runs: the node with the most free capacity that matches the task's arch
(of nodes as free, the one given the fewest groups so far).

A GRPO group goes to one node whole (its n rollouts are sampled together and compared with
each other, so they share a host's speed). The placer reserves the group's n slots on the
node it picks and frees them when the group ends there; a group that fits nowhere yet
waits, first come first served (backpressure), and is never put where it would exceed a
node's capacity. A node that drains takes no new group and finishes what it has; a lost
node takes nothing again. A group that could never fit (no node of its arch, or larger
than every node) is refused at once rather than waiting forever.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sandfleet.errors import ConfigError


class NoNodeError(ConfigError):
    """No node could ever take this group (its arch, its size, or every node lost)."""


@dataclass
class Node:
    """The driver's view of one node."""

    node_id: str
    arch: str
    capacity: int
    actor: Any = None
    reserved: int = 0
    draining: bool = False
    lost: bool = False
    groups: int = 0
    """Groups running there now."""
    placed: int = 0
    """Groups ever placed there."""
    shipped: set[str] = field(default_factory=set)
    """Task folders (content hashes) it has."""
    label: str = ""

    @property
    def free(self) -> int:
        return self.capacity - self.reserved

    @property
    def open(self) -> bool:
        return not (self.draining or self.lost)


def task_arches(metadata: dict[str, Any], default: str | None) -> set[str] | None:
    """The architectures a task runs on: its metadata's ``arch`` (a name or a list), else
    ``default``; None for any."""
    value = metadata.get("arch") or metadata.get("architectures") or default
    if value is None:
        return None
    if isinstance(value, str):
        return {x.strip() for x in value.split(",") if x.strip()}
    return {str(x) for x in value}


class Placer:
    """Free capacity per node, and the queue of groups waiting for it."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self._waiters: deque[tuple[int, set[str] | None, asyncio.Future[Node]]] = deque()

    def add(self, node: Node) -> None:
        self.nodes[node.node_id] = node
        self._wake()

    def fits_ever(self, n: int, arches: set[str] | None) -> None:
        """Raise NoNodeError when no open node could ever take ``n`` of ``arches``."""
        live = [x for x in self.nodes.values() if not x.lost]
        match = [x for x in live if arches is None or x.arch in arches]
        if not live:
            raise NoNodeError("no node is left (every node of the pool was lost)")
        if not match:
            have = sorted({x.arch for x in live})
            raise NoNodeError(f"no node runs {'/'.join(sorted(arches or []))} (the cluster's nodes: {', '.join(have)})")
        if all(x.capacity < n for x in match):
            raise NoNodeError(f"a group of {n} fits on no node (largest capacity: "
                              f"{max(x.capacity for x in match)}); a group runs whole on one node")

    def _pick(self, n: int, arches: set[str] | None) -> Node | None:
        best: Node | None = None
        for x in self.nodes.values():
            if not x.open or x.free < n or (arches is not None and x.arch not in arches):
                continue
            if best is None or (x.free, -x.placed) > (best.free, -best.placed):
                best = x  # a tie goes to the node that was given fewer groups: balance
        return best

    async def place(self, n: int, arches: set[str] | None = None) -> Node:
        """Reserve ``n`` slots on the best node, waiting (in order) until one has them."""
        self.fits_ever(n, arches)
        if not self._waiters:
            node = self._pick(n, arches)
            if node is not None:
                return self._reserve(node, n)
        fut: asyncio.Future[Node] = asyncio.get_running_loop().create_future()
        entry = (n, arches, fut)
        self._waiters.append(entry)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result(), n)
            elif entry in self._waiters:
                self._waiters.remove(entry)
                self._wake()
            raise

    def _reserve(self, node: Node, n: int) -> Node:
        node.reserved += n
        node.groups += 1
        node.placed += 1
        return node

    def release(self, node: Node, n: int) -> None:
        node.reserved -= n
        node.groups -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, arches, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            try:
                self.fits_ever(n, arches)
            except NoNodeError as e:  # the nodes that could take it are gone
                self._waiters.popleft()
                fut.set_exception(e)
                continue
            node = self._pick(n, arches)
            if node is None:
                return  # first come first served: later groups wait behind this one
            self._waiters.popleft()
            fut.set_result(self._reserve(node, n))

    def drain(self, node_id: str, on: bool = True) -> Node:
        node = self.node(node_id)
        node.draining = on
        self._wake()
        return node

    def lose(self, node_id: str) -> Node:
        node = self.node(node_id)
        node.lost = True
        self._wake()
        return node

    def node(self, node_id: str) -> Node:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise ConfigError(f"no node {node_id} in this pool (nodes: {', '.join(self.nodes)})") from None

    @property
    def waiting(self) -> int:
        return len(self._waiters)
