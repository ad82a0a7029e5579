"""The backends, one row each: the one list every other place derives from.

A row names the backend's config model (:mod:`sandfleet.sandbox.spec`: one per backend, its
``kind`` is the name and its ``target`` the class, imported lazily), says whether its
sandboxes isolate (users exist, a root, a user namespace or VM: everything but ``process``),
whether its commands run as the user they ask for, and how ``doctor`` finds out whether this
host can run it. What derives from here: the CLI's ``--backend`` choices, ``doctor``'s
backend table, the tests' backend matrix, and "isolated" in the verifier and the prepare step.

Adding a backend: a config model in spec.py (``kind: Literal[...]``, ``target``), a row here,
the backend module (docs/architecture.md, "Where to add a backend").
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

from sandfleet.errors import ConfigError
from sandfleet.sandbox.spec import AnyConfig, BwrapConfig, GvisorConfig, MicrovmConfig, ProcessConfig


def _process() -> dict[str, Any]:
    return {"available": True, "reason": "always available; isolates nothing (development only)"}


def _bwrap() -> dict[str, Any]:
    from sandfleet.sandbox import cgroups
    from sandfleet.sandbox.bwrap import bwrap_version

    bw = bwrap_version()
    if not bw:
        return {"available": False, "reason": "bubblewrap missing: apt-get install bubblewrap"}
    if os.geteuid() != 0:
        return {"available": False, "reason": "needs root for its overlay root and cgroups"}
    from sandfleet.sandbox._spawn import PIDFD

    lay = cgroups.detect()
    # who enters a sandbox's namespaces (BwrapConfig.namespaces; bwrap without pidfds)
    entry = "namespaces by sandfleet's launcher" if PIDFD else "namespaces by bubblewrap (no pidfds)"
    return {"available": True, "reason": f"{bw}; {entry}; cgroups {lay.version}"
            + ("" if lay.usable else " (not writable: limits off)")}


def _microvm() -> dict[str, Any]:
    try:
        from sandfleet.sandbox.microvm import probe as mprobe

        micro: dict[str, Any] = mprobe.availability()
        return micro
    except (ImportError, AttributeError):
        qemu = shutil.which("qemu-system-x86_64") or shutil.which("qemu-system-aarch64")
        return {"available": False, "reason": "microvm backend not installed in this build" if qemu
                else "QEMU missing: apt-get install qemu-system-x86 linux-image-cloud-amd64"}


def _gvisor() -> dict[str, Any]:
    """runsc's version and the platform the gvisor backend picks here (KVM probed once, cached)."""
    from sandfleet.sandbox.gvisor import INSTALL, choose_platform, runsc_version

    version = runsc_version()
    if not version:
        return {"available": False, "reason": f"gVisor missing: {INSTALL}"}
    if os.geteuid() != 0:
        return {"available": False, "reason": f"runsc {version}; needs root (runsc, its overlay root and cgroups)"}
    plat, why = choose_platform(GvisorConfig())
    return {"available": True, "platform": plat, "reason": f"runsc {version}; platform {plat}: {why}; no network yet"}


@dataclass(frozen=True)
class BackendInfo:
    """One backend of the registry."""

    config: type[AnyConfig]
    """Its config model: ``kind`` is its name, ``target`` its class (imported when first used)."""
    isolated: bool
    """Its sandboxes have users of their own (root, the agent, the verifier) and a root of their
    own; False for ``process``, which runs commands as the caller on the host."""
    runs_as_user: bool
    """Its commands run as the user they ask for (the guest agent changes uid); on microvm every
    command is root of the VM."""
    probe: Callable[[], dict[str, Any]]
    """Whether this host can run it: ``{"available": bool, "reason": str, ...}`` (``doctor``)."""
    root_dirs: bool = False
    """Its sandboxes start with ``SandboxSpec.root_dirs`` owned by their root, mode 0755 (the
    launcher makes them so with the writable dirs): the verifier gives the task folders to
    root without a command of its own. False: they are the sandbox user's, as the other
    writable dirs."""

    @property
    def name(self) -> str:
        """Its name: ``--backend``, ``SandboxSpec.backend``, its config's ``kind``."""
        return str(self.config.model_fields["kind"].default)


REGISTRY: tuple[BackendInfo, ...] = (
    BackendInfo(BwrapConfig, isolated=True, runs_as_user=True, probe=_bwrap, root_dirs=True),
    BackendInfo(ProcessConfig, isolated=False, runs_as_user=False, probe=_process),
    BackendInfo(MicrovmConfig, isolated=True, runs_as_user=False, probe=_microvm),
    BackendInfo(GvisorConfig, isolated=True, runs_as_user=True, probe=_gvisor, root_dirs=True),
)
"""Every backend, in the order the CLI lists them."""

if {b.config for b in REGISTRY} != set(get_args(AnyConfig)):  # pragma: no cover (a row or a config missing)
    raise ConfigError("sandbox/registry.py and spec.AnyConfig name different backends")

BY_NAME: dict[str, BackendInfo] = {b.name: b for b in REGISTRY}
NAMES: tuple[str, ...] = tuple(b.name for b in REGISTRY)
"""Every backend's name."""
ISOLATED: frozenset[str] = frozenset(b.name for b in REGISTRY if b.isolated)
"""The backends whose sandboxes have users of their own (not ``process``)."""
RUNS_AS_USER: frozenset[str] = frozenset(b.name for b in REGISTRY if b.runs_as_user)
ROOT_DIRS: frozenset[str] = frozenset(b.name for b in REGISTRY if b.root_dirs)
"""The backends that start a sandbox with its ``SandboxSpec.root_dirs`` root's, mode 0755."""


def honours_root_dirs(name: str) -> bool:
    """Whether a sandbox of backend ``name`` starts with ``SandboxSpec.root_dirs`` owned by
    its root, mode 0755 (False for an unknown name, e.g. a remote one the service did not name)."""
    return name in ROOT_DIRS


def is_isolated(name: str) -> bool:
    """Whether a sandbox of backend ``name`` has users of its own (False for an unknown name,
    e.g. a remote sandbox whose backend the service did not say)."""
    return name in ISOLATED


def choices(*, auto: bool = True) -> list[str]:
    """The CLI's ``--backend`` choices: ``auto`` (unless ``auto=False``), then every backend."""
    return ["auto", *NAMES] if auto else list(NAMES)


def availability() -> dict[str, dict[str, Any]]:
    """Each backend's probe on this host, by name (``doctor``)."""
    return {b.name: b.probe() for b in REGISTRY}
