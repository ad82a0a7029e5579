"""The one place Ray is imported: the supported version range, and loopback-only set-up.

Ray is an optional dependency (the ``ray`` extra). A trainer on Ray pins its own version,
so sandfleet accepts a range (:data:`SUPPORTED`) rather than one release, and refuses one
outside it with a message naming both. Ray's own errors are translated into sandfleet's
tree here too (:func:`is_node_loss`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from sandfleet.errors import ConfigError, HostUnsupportedError

SUPPORTED = ((2, 40), (3, 0))
"""Ray versions sandfleet.cluster works with: at least the first, below the second (tested
with 2.60.0). The ``ray`` extra asks for the same range."""
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray reads this once, when imported: at 0, ``get_node_ip_address()`` is 127.0.0.1 instead
of the primary interface's address (Ray rewrites 127.0.0.1 in every address otherwise)."""


def _version(text: str) -> tuple[int, int]:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def supported_range() -> str:
    (a, b), (c, d) = SUPPORTED
    return f">={a}.{b},<{c}.{d}"


def import_ray() -> Any:
    """The ``ray`` module, checked against :data:`SUPPORTED`; a HostUnsupportedError saying
    how to install it when it is missing or out of range."""
    try:
        import ray
    except ImportError:
        raise HostUnsupportedError(f"sandfleet.cluster needs Ray ({supported_range()}): "
                                   "pip install 'sandfleet[ray]'") from None
    low, high = SUPPORTED
    if not low <= _version(ray.__version__) < high:
        raise HostUnsupportedError(f"Ray {ray.__version__} is installed; sandfleet.cluster supports "
                                   f"ray{supported_range()}")
    return ray


def loopback_only() -> None:
    """Make this process's Ray bind and connect to 127.0.0.1 only (for ``--ray local:N``).

    Must run before Ray is first imported: Ray reads the setting at import. A process that
    imported Ray already with the default (clusters across hosts) is refused, since a local
    cluster would then listen on the primary interface."""
    if "ray" in sys.modules:
        from ray._private import ray_constants

        if ray_constants.ENABLE_RAY_CLUSTER:
            raise ConfigError("a loopback-only local Ray cluster must be started before Ray is imported "
                              f"(or with {LOOPBACK_ENV}=0 in the environment)")
        return
    # Ray is configured through its environment only; it reads this at import.
    os.environ[LOOPBACK_ENV] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def is_node_loss(error: BaseException) -> bool:
    """Whether a Ray error means the host actor (so its node) is gone."""
    ray = import_ray()
    exc = ray.exceptions
    kinds = tuple(k for k in (getattr(exc, "RayActorError", None), getattr(exc, "ActorDiedError", None),
                              getattr(exc, "ActorUnavailableError", None), getattr(exc, "NodeDiedError", None),
                              getattr(exc, "WorkerCrashedError", None), getattr(exc, "OwnerDiedError", None))
                  if k is not None)
    return isinstance(error, kinds)
