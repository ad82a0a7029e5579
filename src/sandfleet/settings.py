"""sandfleet's settings from the environment: one object, read at the edge.

Every environment variable sandfleet reads is a field of :class:`Settings` (its docstring
says what it does; docs/settings.md lists them). The commands layer (``sandfleet ...``,
:mod:`sandfleet.cli`) makes it once, ``Settings.from_env()``, applies its flags
(``--no-limits``) and installs it for the command (:func:`installed`); the layers below read
it through :func:`current`, never ``os.environ`` (tests/test_settings.py checks it). Where
nothing installed one (sandfleet used as a library, a trainer's process, a test),
:func:`current` reads the environment as it is now.

Child processes get the environment explicitly, :func:`child_env`: this process's
environment with the installed settings written back (so ``--no-limits`` reaches a detached
sandbox's holder, a cluster's node processes), plus what the caller adds. Values are kept as
the environment spells them where the module that uses one checks it (its error names the
variable); flags are parsed here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

_TRUE = ("1", "yes", "true")


def _var(name: str, *, flag: bool = False, off: bool = False) -> Any:
    """A field read from ``$name`` (``flag``: true for 1/yes/true; ``off``: true for 0/off/no/false)."""
    return field(default=False if flag or off else None, metadata={"env": name, "flag": flag, "off": off})


@dataclass(frozen=True)
class Settings:
    """Every environment variable sandfleet reads (docs/settings.md)."""

    # -- sandboxes on this host
    state: str | None = _var("SANDFLEET_STATE")
    """Where live sandboxes' markers and state directories go (default: /run/sandfleet as root,
    /dev/shm/sandfleet where /run is not a tmpfs; else $XDG_RUNTIME_DIR/sandfleet; else
    sandfleet-<uid>/sandfleet in the temp directory). A tmpfs keeps starts fast."""
    runtime_dir: str | None = _var("XDG_RUNTIME_DIR")
    """The user's runtime directory: the state directory's default parent."""
    uid_slots: str | None = _var("SANDFLEET_UID_SLOTS")
    """Where the uid slots' lock files live (default /run/sandfleet-uid-slots)."""
    disk: str | None = _var("SANDFLEET_DISK")
    """``tmpfs``: every writable layer is a tmpfs (charged to memory) even where loop devices and
    mkfs.ext4 would give it a disk of its own."""
    cgroup_parent: str | None = _var("SANDFLEET_CGROUP_PARENT")
    """The cgroup (relative to the root) sandboxes' cgroups are made under (default ``sandfleet``)."""
    cpu_fraction: str | None = _var("SANDFLEET_CPU_FRACTION")
    """The share of each core a sandbox's CPU quota is scaled by (0 < f <= 1; default 1)."""
    cgroups_off: bool = _var("SANDFLEET_CGROUPS", off=True)
    """``SANDFLEET_CGROUPS=0`` (off/no/false): use no cgroups at all (no limits)."""
    no_limits: bool = _var("SANDFLEET_NO_LIMITS", flag=True)
    """Run sandboxes without limits where cgroups can't be written, instead of refusing
    (``--no-limits``)."""
    net_uid: str | None = _var("SANDFLEET_NET_UID")
    """The host uid that runs the network helper (default: the owner of each sandbox's uid slot)."""
    pasta: str | None = _var("SANDFLEET_PASTA")
    """pasta, by absolute path (default: the first in the system directories)."""
    nft: str | None = _var("SANDFLEET_NFT")
    """nft, by absolute path (default: the first in the system directories)."""
    setpriv: str | None = _var("SANDFLEET_SETPRIV")
    """setpriv, by absolute path (default: the first in the system directories)."""
    no_init: bool = _var("SANDFLEET_NO_INIT", flag=True)
    """``1``: as PID 1 (a container's entry point), do not act as its init (reap orphans)."""
    call_timeout: str | None = _var("SANDFLEET_CALL_TIMEOUT")
    """Seconds a call to the guest agent may wait for its answer before the sandbox is marked dead
    (default 60)."""
    # -- microvm
    qemu: str | None = _var("SANDFLEET_QEMU")
    """The QEMU binary for the microvm backend (default: qemu-system-x86_64 on $PATH)."""
    guest_kernel: str | None = _var("SANDFLEET_GUEST_KERNEL")
    """The guest kernel for the microvm backend (default: the newest ``*-cloud-amd64`` in /boot)."""
    microvm_accel: str | None = _var("SANDFLEET_MICROVM_ACCEL")
    """``kvm`` or ``tcg``: the microvm backend's accelerator, forced instead of probed."""
    # -- images and the guest agent
    arch: str | None = _var("SANDFLEET_ARCH")
    """The architecture images are built and run for (``--arch``; default this host's)."""
    cache: str | None = _var("SANDFLEET_CACHE")
    """sandfleet's cache (images, the guest agent's builds; default $XDG_CACHE_HOME/sandfleet)."""
    xdg_cache_home: str | None = _var("XDG_CACHE_HOME")
    """The user's cache directory (default ~/.cache)."""
    cc: str | None = _var("CC")
    """The C compiler the guest agent, the seal library and the seccomp filter are built with."""
    ssl_cert_file: str | None = _var("SSL_CERT_FILE")
    """A CA bundle the host trusts, given to image builds' RUN steps (after pip's ``cert``)."""
    requests_ca_bundle: str | None = _var("REQUESTS_CA_BUNDLE")
    """A CA bundle the host trusts, given to image builds' RUN steps (after $SSL_CERT_FILE)."""
    # -- the verifier
    seal_uid_off: bool = _var("SANDFLEET_SEAL_UID", off=True)
    """``0``: no uid split. By default, where the sandbox's kernel has no Landlock (gVisor), the tests
    run as root and the seal makes each program of the code under test the tests' user, which keeps
    the reward folders, the tests and their processes from it; what the root tests make in a
    temporary folder and hand it (a ``tempfile`` folder or file, its cwd, a path its arguments or
    environment name) is handed to that user first, as on bwrap where both are one user (28 of the
    28 bundled tasks valid on gVisor so). Off: such rows carry the no-Landlock risk
    (docs/security.md, "Without Landlock")."""
    seal_split: bool = _var("SANDFLEET_SEAL_SPLIT", flag=True)
    """``1``: the uid split beside Landlock too (bwrap, where the kernel has Landlock): the tests run as
    root and each program of the code under test, already in its Landlock domain, also becomes the
    tests' user. The tests' own files (a log they write in the workdir, a ``mktemp`` file) can then
    not be opened for writing by the code under test (round X, docs/security.md). Off by default:
    the tests run as root where they ran as their user."""
    native_helpers_off: bool = _var("SANDFLEET_NATIVE_HELPERS", off=True)
    """``0``: the verifier prepares the tests' folders with its shell script (``PREPARE`` in
    rollout/verifier.py) and an upload runs ``tar`` in the sandbox, rather than the guest agent's
    ``prepare`` and ``untar``, which do the same in one process each and leave to the script and
    to tar what they do not handle (docs/security.md, "The verifier's preparation")."""
    # -- the service, the cluster, trainers
    token: str | None = _var("SANDFLEET_TOKEN")
    """The bearer token for a sandfleet service (``--remote``, the client)."""
    tasks: str | None = _var("SANDFLEET_TASKS")
    """The folder of task folders a trainer's adapter resolves task names in."""
    ray_address: str | None = _var("RAY_ADDRESS")
    """The Ray cluster ``--ray`` joins when no address is given."""
    ray_tmpdir: str | None = _var("RAY_TMPDIR")
    """Ray's temp directory (default $TMPDIR, else /tmp)."""
    tmpdir: str | None = _var("TMPDIR")
    """The temp directory."""
    log_level: str | None = _var("SANDFLEET_LOG_LEVEL")
    """The log level of ``sandfleet`` commands (DEBUG, INFO, WARNING ...), beside ``-v``."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings ``env`` (default: this process's environment) gives."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f.metadata["env"])
            if f.metadata["flag"]:
                values[f.name] = (raw or "").strip().lower() in _TRUE
            elif f.metadata["off"]:
                values[f.name] = (raw or "").strip().lower() in ("0", "off", "no", "false")
            else:
                values[f.name] = raw
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """The variables that give these settings (those set), for a child's environment."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata["flag"] and value:
                out[f.metadata["env"]] = "1"
            elif f.metadata["off"] and value:
                out[f.metadata["env"]] = "0"
            elif isinstance(value, str):
                out[f.metadata["env"]] = value
        return out


VARIABLES: dict[str, str] = {f.metadata["env"]: f.name for f in fields(Settings)}
"""Each variable's field."""

_lock = threading.Lock()
_installed: list[Settings] = []


_ENV_NAMES = tuple(f.metadata["env"] for f in fields(Settings))
_ENV_KEYS = tuple(os.fsencode(name) for name in _ENV_NAMES)
_from_env: tuple[tuple[Any, ...], Settings] | None = None
"""The environment's variables of the last :meth:`Settings.from_env` of :func:`current`, raw, and
its settings: the same variables give the same (frozen) settings."""


def _environ_now() -> tuple[Any, ...]:
    """This process's variables of the settings as they are now: from CPython's own table of
    ``os.environ`` where it has one (bytes, no decoding: 32 lookups in about 2 us), else read."""
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict) and os.name == "posix":
        return tuple(map(data.get, _ENV_KEYS))
    return tuple(map(os.environ.get, _ENV_NAMES))


def current() -> Settings:
    """The settings in force: those the command installed, else the environment's now. Read from
    the environment, they are worked out again only when one of their variables changed: a library
    caller (no command installs settings) asked seven times for each sandbox made, 0.1 ms each
    (issue 46)."""
    global _from_env
    with _lock:
        if _installed:
            return _installed[-1]
    raw = _environ_now()
    known = _from_env
    if known is not None and known[0] == raw:
        return known[1]
    settings = Settings.from_env()
    if _environ_now() == raw:  # (not remembered where another thread changed one while it was read)
        _from_env = (raw, settings)
    return settings


@contextlib.contextmanager
def installed(settings: Settings) -> Iterator[Settings]:
    """Inside the block, :func:`current` is ``settings`` (every thread of the process)."""
    with _lock:
        depth = len(_installed)
        _installed.append(settings)
    try:
        yield settings
    finally:
        with _lock:
            del _installed[depth:]


def install(settings: Settings) -> None:
    """Make ``settings`` current for the rest of the process, or of the innermost
    :func:`installed` block (``--arch`` changing the target mid-command)."""
    with _lock:
        if _installed:
            _installed[-1] = settings
        else:
            _installed.append(settings)


def env_var(name: str) -> str | None:
    """A variable the caller names (an API key's variable, a proxy), not a setting of sandfleet's."""
    return os.environ.get(name)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: this one's, the current settings written back,
    then ``extra``."""
    return {**os.environ, **current().to_env(), **(extra or {})}


def environment() -> dict[str, str]:
    """A copy of this process's environment, for an edge that reads variables of its own
    from a mapping (a trainer adapter's settings: integrations/_common.py)."""
    return dict(os.environ)
