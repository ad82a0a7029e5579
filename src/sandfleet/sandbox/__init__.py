"""Sandboxes: the contract, backends (process, bwrap, microvm), and the warm pool.

    async with await create_sandbox(image="host") as sb:
        res = await sb.exec("echo hi", timeout=10)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import shutil
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from sandfleet.errors import ConfigError
from sandfleet.sandbox.spec import AnyConfig, Limits, SandboxSpec, backend_config, make_spec

if TYPE_CHECKING:
    from sandfleet.sandbox.base import Backend, Sandbox, Snapshot

log = logging.getLogger(__name__)

__all__ = ["Limits", "SandboxSpec", "backend_in_use", "create_sandbox", "fork", "get_backend", "make_backend",
           "make_spec", "resolve_backend", "use_backend"]

_OVERRIDE: ContextVar[Backend | None] = ContextVar("sandfleet_backend_override", default=None)


@contextlib.contextmanager
def use_backend(backend: Backend) -> Iterator[Backend]:
    """Inside the block (this context, and tasks started from it), every sandbox is created
    and forked by ``backend``: how ``--remote`` puts a whole run on a sandfleet service
    (``sandfleet.client.ServiceClient`` is a Backend) without its code knowing."""
    token = _OVERRIDE.set(backend)
    try:
        yield backend
    finally:
        _OVERRIDE.reset(token)


def backend_in_use() -> Backend | None:
    """The backend :func:`use_backend` put in force here, or None (each spec names its own)."""
    return _OVERRIDE.get()


def resolve_backend(name: str) -> str:
    """"auto" becomes bwrap where bubblewrap can run, else process."""
    if name != "auto":
        return name
    import os

    if shutil.which("bwrap") and os.geteuid() == 0:
        return "bwrap"
    return "process"


def make_backend(config: AnyConfig) -> Backend:
    """A new backend configured by ``config``; its module (``config.target``) is imported only now."""
    module, _, name = config.target.partition(":")
    backend: Backend = getattr(importlib.import_module(module), name)(config)
    return backend


@functools.cache
def _backend(name: str) -> Backend:
    backend = make_backend(backend_config(name))
    _reap_once()
    return backend


@functools.cache
def _reap_once() -> None:
    """The first sandbox a process makes first reaps what dead owners left on this host."""
    from sandfleet.sandbox.state import reap_leftovers

    try:
        reaped = reap_leftovers()
    except OSError as e:  # never block sandbox creation on a leftover we can't remove
        log.warning("could not reap leftover sandboxes: %s", e)
        return
    if reaped:
        log.info("reaped %d leftover sandboxes of dead owners: %s", len(reaped), ", ".join(reaped[:5]))


def get_backend(name: str = "auto") -> Backend:
    """The backend object for a name (configured with defaults), imported lazily; inside
    :func:`use_backend`, that backend whatever the name."""
    override = _OVERRIDE.get()
    if override is not None:
        return override
    return _backend(resolve_backend(name))


async def create_sandbox(spec: SandboxSpec | None = None, **kwargs: Any) -> Sandbox:
    """Create a sandbox from a spec, or from keyword fields of SandboxSpec and Limits."""
    if spec is None:
        spec = make_spec(**kwargs)
    elif kwargs:
        raise ConfigError("pass either a spec or keyword fields, not both")
    backend = get_backend(spec.backend)
    return await backend.create(spec)


async def fork(snapshot: Snapshot, n: int) -> list[Sandbox]:
    """Start ``n`` sandboxes from one snapshot."""
    if n < 1 or n > 100_000:
        raise ConfigError(f"fork count must be between 1 and 100000, not {n}")
    return await get_backend(snapshot.backend).fork(snapshot, n)
