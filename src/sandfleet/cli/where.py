"""Where a command's rollouts run, written once for ``sandfleet run`` and ``sandfleet tasks validate``.

- here (the default), or on one sandfleet service with ``--remote URL``: every sandbox the work
  makes is made on the service (:func:`sandfleet.client.remote.on_remote`);
- spread over several services, ``--remote URL,URL,...``
  (:class:`~sandfleet.cluster.services.ServicePool`), or over a Ray cluster, ``--ray ADDRESS``
  (:class:`~sandfleet.cluster.pool.RolloutPool`): whole groups go to one host each
  (docs/cluster.md). The pool is closed when the work ends, also when it fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import click

if TYPE_CHECKING:
    from sandfleet.cluster.groups import PoolOptions
    from sandfleet.cluster.pool import RolloutPool
    from sandfleet.cluster.services import ServicePool

    Pool = RolloutPool | ServicePool

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

REMOTE_HELP = "Run the sandboxes on the sandfleet service at URL (token in $SANDFLEET_TOKEN); several URLs spread"
RAY_ADDRESSES = "host:port, auto ($RAY_ADDRESS), or local:N"


def remote_option(spread: str) -> Callable[[F], F]:
    """``--remote URL[,URL...]``; ``spread``: what several URLs spread, and how, e.g. "the groups over them"."""
    return click.option("--remote", metavar="URL[,URL...]", default=None, help=f"{REMOTE_HELP} {spread}.")


def ray_option(help: str) -> Callable[[F], F]:
    """``--ray ADDRESS`` (a parameter named ``ray_address``)."""
    return click.option("--ray", "ray_address", metavar="ADDRESS", default=None, help=help)


@dataclass(frozen=True)
class Where:
    """The hosts a command's sandboxes run on, from ``--remote`` and ``--ray``."""

    remote: str | None = None
    ray: str | None = None

    @property
    def several(self) -> bool:
        """Whether ``--remote`` names several services (``URL,URL,...``)."""
        return self.remote is not None and "," in self.remote

    @property
    def spread(self) -> bool:
        """Whether the work goes to a pool of hosts (Ray's nodes or several services), not here or one service."""
        return self.ray is not None or self.several

    @property
    def hosts(self) -> str:
        """What the pool's hosts are, for a report: "Ray node(s)" or "service(s)"."""
        return "Ray node(s)" if self.ray is not None else "service(s)"


def refuse(flag: str, others: dict[str, bool], *, why: str = "") -> None:
    """A usage error naming every flag of ``others`` that ``flag`` excludes, when any of them is given
    (``others``: flag -> given)."""
    if any(others.values()):
        names = list(others)
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        raise click.UsageError(f"{flag} {why}excludes {listed}")


async def dispatch(
    where: Where,
    *,
    here: Callable[[], Awaitable[T]],
    on_pool: Callable[[Pool], Awaitable[T]],
    **pool_options: Unpack[PoolOptions],
) -> T:
    """``here()`` on this host, or on the one service of ``--remote URL``; else ``on_pool(pool)``
    over the pool of ``--ray`` or of several ``--remote`` URLs, made with ``pool_options``
    (capacity per host, backend, network, retry ...) and closed after."""
    pool: Pool
    if where.ray is not None:
        from sandfleet.cluster.pool import RolloutPool

        pool = await RolloutPool.create(where.ray, **pool_options)
    elif where.several:
        from sandfleet.cluster.services import ServicePool

        assert where.remote is not None
        pool = await ServicePool.create(where.remote, **pool_options)
    else:
        from sandfleet.client.remote import on_remote

        return await on_remote(where.remote, here)
    try:
        return await on_pool(pool)
    finally:
        await asyncio.shield(pool.close())
