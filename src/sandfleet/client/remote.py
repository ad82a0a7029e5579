"""``--remote URL``: put a command's sandboxes on a sandfleet service, unchanged otherwise.

The token comes from ``$SANDFLEET_TOKEN``. Inside :func:`remote`, every sandbox the code
creates or forks (through :func:`sandfleet.sandbox.create_sandbox` and friends) is made
on the service: :func:`sandfleet.sandbox.use_backend` puts the client in place of the
local backend for that context.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sandfleet.client.service import ServiceClient, connect
from sandfleet.errors import ConfigError
from sandfleet.settings import current as current_settings

T = TypeVar("T")
TOKEN_ENV = "SANDFLEET_TOKEN"
HELP = "Run the sandboxes on a sandfleet service at URL (its token in $SANDFLEET_TOKEN; docs/service.md)."


def token_from_env() -> str:
    token = (current_settings().token or "").strip()
    if not token:
        raise ConfigError(f"--remote needs the service's token in ${TOKEN_ENV}")
    return token


@asynccontextmanager
async def remote(url: str, token: str | None = None, **kw: Any) -> AsyncIterator[ServiceClient]:
    """Connect to the service and make it the backend of every sandbox made in the block."""
    from sandfleet.sandbox import use_backend

    if "," in url:
        raise ConfigError(f"--remote {url}: several services spread only `sandfleet run` and `sandfleet tasks "
                          "validate` (docs/cluster.md, Without Ray); give this command one URL")
    async with await connect(url, token or token_from_env(), **kw) as client:
        with use_backend(client):
            yield client


async def on_remote(url: str | None, make: Callable[[], Awaitable[T]]) -> T:
    """``await make()``, on the service at ``url`` when one is given."""
    if url is None:
        return await make()
    async with remote(url):
        return await make()
