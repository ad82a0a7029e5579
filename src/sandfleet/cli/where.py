"""Where a suite runs besides here: ``--ray ADDRESS`` (a Ray cluster) and ``--remote URL,URL,...``
(several services)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

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

    return await _run_on(RolloutPool.create, address, tasks, policy, config, out_dir=out_dir,
                         on_result=on_result, out_mode=out_mode, image=image)


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

    return await _run_on(ServicePool.create, urls, tasks, policy, config, out_dir=out_dir,
                         on_result=on_result, out_mode=out_mode, image=image)


async def _run_on(create: Callable[..., Awaitable[Any]], where: str, tasks: Sequence[Task], policy: Policy,
                  config: RunConfig, *, out_dir: Path | None, on_result: Callable[[RolloutResult], None] | None,
                  out_mode: str, image: str | None) -> ClusterRunReport:
    """The suite on the pool ``create(where, ...)`` makes (Ray's or the services'), closed after."""
    from sandfleet.cluster.suite import run_suite_on_pool

    pool = await create(
        where, capacity=config.concurrency, backend=config.backend, network=config.network, fork=config.fork,
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
