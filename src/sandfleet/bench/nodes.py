"""``sandfleet bench run --ray``: the capacity benchmark on every node, and how they compare.

Each node's host actor runs :func:`sandfleet.bench.run.run_bench` with the same
configuration (its own hardware thread count); the results file holds one ordinary results
dict per node (``nodes``: node id -> ``label``, ``results``) and ``comparison``: every
other node against the first (:func:`sandfleet.bench.compare.compare`, or why it refused).
Nodes of a ``local:N`` cluster share this machine, so they run one after another; those of
a real cluster all at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from sandfleet.bench.compare import IncomparableError, compare
from sandfleet.bench.run import BenchConfig, run_bench

SCHEMA = "sandfleet-cluster-bench-1"
log = logging.getLogger(__name__)


async def bench_here(cfg: BenchConfig) -> dict[str, Any]:
    """``sandfleet bench run`` on this node, with its own hardware threads: what each node's
    host actor runs (:meth:`~sandfleet.cluster.host.HostActor.call`)."""
    results: dict[str, Any] = {}
    cfg = dataclasses.replace(cfg, threads=len(os.sched_getaffinity(0)))
    await run_bench(cfg, results, progress=lambda m: log.info("bench: %s", m))
    return results


async def bench_on_ray(address: str, cfg: BenchConfig, *,
                       say: Callable[[str], None] | None = None) -> dict[str, Any]:
    from sandfleet.cluster.pool import RolloutPool

    tell = say or (lambda _m: None)
    pool = await RolloutPool.create(address, backend=cfg.backend)
    out: dict[str, Any] = {"schema": SCHEMA, "address": address, "nodes": {}, "comparison": {}}
    try:
        nodes = sorted(pool.nodes, key=lambda x: x.label)

        async def one(node: Any) -> None:
            tell(f"node {node.label}: bench run")
            results = await node.actor.call.remote(bench_here, cfg)
            out["nodes"][node.node_id] = {"label": node.label, "results": results}
            tell(f"node {node.label}: done")

        if pool.local is not None:  # simulated nodes share this machine's cores
            for node in nodes:
                await one(node)
        else:
            await asyncio.gather(*(one(x) for x in nodes))
    finally:
        await asyncio.shield(pool.close())
    first = nodes[0]
    a = out["nodes"][first.node_id]["results"]
    for node in nodes[1:]:
        b = out["nodes"][node.node_id]["results"]
        try:
            out["comparison"][node.label] = compare(a, b, (first.label, node.label))
        except IncomparableError as e:
            out["comparison"][node.label] = {"refused": str(e)}
    return out
