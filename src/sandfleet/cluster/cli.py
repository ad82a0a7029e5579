"""``--ray ADDRESS``: what ``sandfleet run`` (and friends) do with a Ray cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

from sandfleet.cluster.suite import ClusterRunReport
from sandfleet.rollout.policy import Policy
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.suite import RunConfig
from sandfleet.tasks.model import Task

HELP = ("Run on a Ray cluster: host:port or ray://..., 'auto' ($RAY_ADDRESS), or local:N (N nodes on this "
        "machine, loopback only, each with its own state and cache, stopped afterwards). --concurrency is "
        "then each node's limit.")


async def run_on_ray(
    address: str,
    tasks: Sequence[Task],
    policy: Policy,
    config: RunConfig,
    *,
    out_dir: Path | None,
    on_result: Callable[[RolloutResult], None] | None = None,
    out_mode: str = "new",
    image: str | None = None,
) -> ClusterRunReport:
    """A suite on the cluster at ``address``, every node admitting ``config.concurrency``."""
    from sandfleet.cluster.pool import RolloutPool
    from sandfleet.cluster.suite import run_suite_on_pool

    pool = await RolloutPool.create(
        address, capacity=config.concurrency, backend=config.backend, network=config.network, fork=config.fork,
        verify=config.verify, agent_user=config.agent_user, retry=config.retry, image=image, run_id=config.run_id,
    )  # fmt: skip
    try:
        return await run_suite_on_pool(tasks, policy, pool, config.n, out_dir=out_dir, on_result=on_result,
                                       out_mode=out_mode)
    finally:
        await asyncio.shield(pool.close())


async def run_on_services(
    urls: str,
    tasks: Sequence[Task],
    policy: Policy,
    config: RunConfig,
    *,
    out_dir: Path | None,
    on_result: Callable[[RolloutResult], None] | None = None,
    out_mode: str = "new",
    image: str | None = None,
) -> ClusterRunReport:
    """A suite over the sandbox services ``URL,URL,...`` (``--remote``), every host admitting
    ``config.concurrency`` at most (and at most its own ``max_busy``)."""
    from sandfleet.cluster.services import ServicePool
    from sandfleet.cluster.suite import run_suite_on_pool

    pool = await ServicePool.create(
        urls, capacity=config.concurrency, backend=config.backend, network=config.network, fork=config.fork,
        verify=config.verify, agent_user=config.agent_user, retry=config.retry, image=image, run_id=config.run_id,
    )  # fmt: skip
    try:
        return await run_suite_on_pool(tasks, policy, pool, config.n, out_dir=out_dir, on_result=on_result,
                                       out_mode=out_mode)
    finally:
        await asyncio.shield(pool.close())


def several(remote: str | None) -> bool:
    """Whether ``--remote`` names several services (``URL,URL,...``)."""
    return remote is not None and "," in remote
