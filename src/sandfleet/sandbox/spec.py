"""Sandbox specifications: limits, and the backend config union that is also the registry.

CLI flags, task files and the HTTP API all validate through these models.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sandfleet.errors import ConfigError
from sandfleet.settings import current as current_settings


class Limits(BaseModel):
    """Per-sandbox resource limits. ``None`` means unlimited where allowed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float | None = Field(1.0, gt=0, le=4096)
    """CPU time as a number of CPUs (cgroup CPU quota); None = no quota."""
    memory_mib: int | None = Field(1024, ge=16, le=16 * 1024 * 1024)
    """Memory limit in MiB (cgroup); the OOM killer acts inside the sandbox only."""
    pids: int | None = Field(1024, ge=8, le=4 * 1024 * 1024)
    """Most processes and threads at once (cgroup pids); stops fork bombs."""
    disk_mib: int = Field(1024, ge=1, le=16 * 1024 * 1024)
    """Size of the private writable layer in MiB; writes beyond fail with ENOSPC."""
    ttl_s: float | None = Field(3600.0, gt=0, le=30 * 86400)
    """Wall-clock lifetime in seconds; the sandbox is killed and reaped after it."""
    network: bool = False
    """Network access. Off by default: the sandbox sees only its own loopback. On: user-mode
    networking in the sandbox's own network namespace, which reaches nothing on this host
    (docs/security.md, "Networking")."""
    forward: tuple[int, ...] = ()
    """Host-loopback TCP ports reachable inside as ``127.0.0.1:<port>`` (a model server);
    needs ``network=True``. Nothing of the host's loopback is reachable otherwise."""

    allow: tuple[str, ...] | None = None
    """Allowlist networking (with ``network=True``): egress only to these host names
    (``*.example.com`` for its subdomains) and IPv4 addresses/CIDRs; DNS answers only for the
    listed names, from a resolver sandfleet runs for the sandbox; host and link-local
    addresses stay blocked (sandbox/allowlist.py). None: no allowlist."""
    deny: tuple[str, ...] | None = None
    """A denylist instead (E2B's ``denyOut``, with ``allow`` as its ``allowOut``): IPv4
    addresses/CIDRs rejected unless ``allow`` lists them; everything else is reachable and
    every name resolves (only listed names' answers get past ``deny``). Needs ``allow``."""
    hosts: tuple[tuple[str, str], ...] = ()
    """Static answers (name, IPv4 address) of an allowlisted sandbox's resolver, before the
    host's resolver: a name still has to be listed in ``allow`` to be answered."""

    @field_validator("allow")
    @classmethod
    def _allow(cls, v: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        if v is None:
            return None
        from sandfleet.sandbox.allowlist import parse_allow

        parse_allow(v)  # ValueError naming a bad entry
        if not info.data.get("network"):
            raise ValueError("an allowlist needs network=True")
        return tuple(dict.fromkeys(v))

    @field_validator("deny")
    @classmethod
    def _deny(cls, v: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        if v is None:
            return None
        from sandfleet.sandbox.allowlist import parse_deny

        parse_deny(v)
        if info.data.get("allow") is None:
            raise ValueError("a denylist needs allow=(...) (what passes it; () for nothing)")
        return tuple(dict.fromkeys(v))

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: tuple[tuple[str, str], ...], info: ValidationInfo) -> tuple[tuple[str, str], ...]:
        import ipaddress

        for name, addr in v:
            if ipaddress.ip_address(addr).version != 4:
                raise ValueError(f"hosts: {name} -> {addr} is not an IPv4 address")
        if v and info.data.get("allow") is None:
            raise ValueError("hosts (static DNS answers) need an allowlist (allow=...)")
        return v

    @field_validator("forward")
    @classmethod
    def _ports(cls, v: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        for p in v:
            if not 0 < p < 65536:
                raise ValueError(f"forwarded port {p} is not a TCP port (1..65535)")
        if v and not info.data.get("network"):
            raise ValueError("forwarding a port needs network=True")
        return tuple(sorted(set(v)))


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    target: ClassVar[str] = ""
    """"module:Class" of the backend, imported only when used (:func:`sandfleet.sandbox.make_backend`)."""


class ProcessConfig(_Config):
    """Plain subprocesses in a private directory. Isolates nothing: development only."""

    kind: Literal["process"] = "process"
    target: ClassVar[str] = "sandfleet.sandbox.process:ProcessBackend"


# The uid model (docs/security.md): inside every sandbox, user namespace S maps uid i onto
# P-uid i, and P maps P-uid i onto host uid ``uid_base + i``. The guest agent runs as
# GUEST_AGENT_UID, which S leaves unmapped, so no command can run as it.
ROOT_UID = 0
AGENT_UID = 1000
VERIFIER_UID = 1001
USERS = {"root": ROOT_UID, "agent": AGENT_UID, "verifier": VERIFIER_UID}

GUEST_AGENT_PATHS = {"bwrap": "/.sandfleet/sandfleet-agent", "gvisor": "/.sandfleet/sandfleet-agent",
                     "microvm": "/run/sandfleet/agent"}
"""The path each backend starts the guest agent by (bwrap and gvisor bind it read-only at
/.sandfleet, microvm's init copies it to /run): a command whose argv[0] is that path and whose
argv[1] names a helper (``prepare``, ``untar``, ``stat``) runs the helper (docs/protocol.md)."""
SANDBOX_UIDS = 65536
"""uids 0..65535 exist inside a sandbox."""
GUEST_AGENT_UID = SANDBOX_UIDS
"""P-uid of the guest agent: not mapped in S."""
DEFAULT_UID_BASE = 1_800_000_000
UID_STRIDE = SANDBOX_UIDS + 2
"""Host uids per slot (sandbox/uids.py): 65,536 sandbox uids, the guest agent, the slot's owner."""
DEFAULT_SLOTS = 10_000


class BwrapConfig(_Config):
    """Linux namespaces (bubblewrap), cgroup limits, read-only image root + private writable layer."""

    kind: Literal["bwrap"] = "bwrap"
    bwrap: str = "bwrap"
    """The bubblewrap binary (resolved to an absolute path once, at backend start)."""
    uid_base: int = Field(DEFAULT_UID_BASE, ge=65536, le=2**32 - 1 - UID_STRIDE)
    """First host uid of the sandboxes' ranges. Each live sandbox takes a slot of
    ``65,538`` host uids (sandbox/uids.py): in slot ``k``, sandbox uid i is host uid
    ``uid_base + k * 65538 + i``; slot 0 (``uid_base + i``) is also how stored layers are
    owned on disk. No login user should own a uid in ``uid_base .. uid_base + slots * 65538``."""
    slots: int = Field(DEFAULT_SLOTS, ge=1, le=65535)
    """How many sandboxes of this ``uid_base`` may live at once on this host (each has host
    uids of its own)."""
    disk: Literal["ext4", "tmpfs"] = "ext4"
    """The writable layer: "ext4" (a filesystem of its own on a loop device: writing past
    ``disk_mib`` is ENOSPC and never charged to memory) or "tmpfs" (about 1 ms faster to
    create and close, but charged to the memory limit: filling it can OOM-kill the sandbox).
    Falls back to tmpfs, with a warning, where the host has no loop devices or mkfs.ext4."""
    namespaces: Literal["launcher", "bwrap"] = "launcher"
    """Who enters a sandbox's pid, mount, network, IPC, UTS and cgroup namespaces and builds
    its ``/dev``, ``/proc`` and root: "launcher" (sandfleet's own, in the process that made
    its mounts: one exec of a dynamically linked program fewer, about 1 ms a start) or "bwrap"
    (bubblewrap, as before 2026-12; also what a kernel without pidfds, before 5.3, gets)."""
    target: ClassVar[str] = "sandfleet.sandbox.bwrap:BwrapBackend"

    @model_validator(mode="after")
    def _range_fits(self) -> BwrapConfig:
        end = self.uid_base + self.slots * UID_STRIDE
        if end > 2**32 - 1:
            raise ValueError(f"uid_base {self.uid_base} + slots {self.slots} x {UID_STRIDE} uids ends at {end}, "
                             f"past the last host uid {2**32 - 2}: lower uid_base or slots")
        return self

    def host_uid(self, uid: int) -> int:
        """The host uid that sandbox uid ``uid`` is on disk (the canonical range, slot 0)."""
        return self.uid_base + uid


class MicrovmConfig(_Config):
    """A KVM (or TCG) QEMU microvm per sandbox, restored from a memory snapshot."""

    kind: Literal["microvm"] = "microvm"
    options: dict[str, Any] = Field(default_factory=dict)
    """Backend-specific options (see docs/microvm.md)."""
    target: ClassVar[str] = "sandfleet.sandbox.microvm:MicrovmBackend"


class GvisorConfig(_Config):
    """gVisor (runsc): a kernel in user space per sandbox, over the same image layers (docs/security.md)."""

    kind: Literal["gvisor"] = "gvisor"
    runsc: str = "runsc"
    """The runsc binary (resolved to an absolute path once, at backend start)."""
    platform: Literal["auto", "ptrace", "kvm"] = "auto"
    """runsc's platform: "auto" is KVM where runsc runs on it here (probed once), else ptrace."""
    disk: Literal["ext4", "tmpfs"] = "ext4"
    """The writable layer, as :attr:`BwrapConfig.disk`: "ext4" (ENOSPC past ``disk_mib``, never
    charged to memory) or "tmpfs" (charged to the memory limit, with gVisor's own memory: an
    agent that fills it gets the sandbox OOM-killed, not a full disk)."""
    target: ClassVar[str] = "sandfleet.sandbox.gvisor:GvisorBackend"


AnyConfig = ProcessConfig | BwrapConfig | MicrovmConfig | GvisorConfig
BackendConfig = Annotated[AnyConfig, Field(discriminator="kind")]
BACKENDS: tuple[str, ...] = tuple(str(c.model_fields["kind"].default) for c in get_args(AnyConfig))
"""Every backend's name, from the configs (sandbox/registry.py adds what each one is)."""
_adapter: TypeAdapter[Any] = TypeAdapter(BackendConfig)


def backend_config(value: str | dict[str, Any] | BaseModel) -> AnyConfig:
    """Validate a backend name or config dict into its config model."""
    if isinstance(value, AnyConfig):
        return value
    data = {"kind": value} if isinstance(value, str) else value
    try:
        cfg: AnyConfig = _adapter.validate_python(data)
        return cfg
    except ValidationError as e:
        kind = data.get("kind") if isinstance(data, dict) else data
        if kind not in BACKENDS:
            raise ConfigError(f"unknown backend {kind!r}; known: {', '.join(BACKENDS)}") from None
        raise ConfigError(f"invalid {kind} backend config: {e}") from None


class SandboxSpec(BaseModel):
    """Everything needed to create a sandbox."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = "host"
    """Image name or content hash (``sandfleet image ls``); "host" = this host's / read-only."""
    backend: str = "auto"
    """"auto" (bwrap where available, else process), or a backend name."""
    limits: Limits = Field(default_factory=Limits)
    workdir: str = "/work"
    """Working directory of commands; created writable for the sandbox user."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for every command."""
    writable_dirs: tuple[str, ...] = ("/logs", "/tests", "/solution", "/oracle")
    """Directories created empty and owned by the sandbox user: where the task contract puts
    tests, reference solutions and rewards (emptied again before a verifier runs)."""
    root_dirs: tuple[str, ...] = ()
    """Writable dirs (each one also in ``writable_dirs``) made owned by the sandbox's root,
    mode 0755, instead of the sandbox user's, when the sandbox starts (also where the image
    already has them): the task folders a non-root agent must not write. Backends whose
    registry row says ``root_dirs`` do it; on the others they stay the user's."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Free-form labels (shown by ``sandfleet sandbox ls``)."""
    user: str = "agent"
    """Who commands and file operations run as by default: a name (``root``, ``agent``,
    ``verifier``, or one in the image's /etc/passwd) or a number. The task's declared user;
    the non-root ``agent`` when it declares none."""
    seccomp_allow: tuple[str, ...] = ()
    """Rules of the default seccomp filter to opt out of (names in
    :data:`sandfleet.sandbox.seccomp.RULES`, e.g. ``namespaces``, ``mount``, ``io_uring``), or
    ``unconfined`` for no filter. The filter applies on bwrap, gvisor and microvm; the process
    backend (development only) runs commands unfiltered (docs/security.md, "Syscall filter")."""

    @field_validator("seccomp_allow", mode="before")
    @classmethod
    def _seccomp_rules(cls, v: Any) -> tuple[str, ...]:
        from sandfleet.sandbox.seccomp import check_allow

        if isinstance(v, str):
            v = [p for p in v.split(",") if p.strip()]
        if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
            raise ValueError(f"seccomp_allow is a list of rule names or a comma-separated string, "
                             f"not {type(v).__name__} {v!r}"[:200])
        return check_allow(v)

    @field_validator("workdir")
    @classmethod
    def _abs_workdir(cls, v: str) -> str:
        return _sandbox_dir("workdir", v, root_ok=True)

    @field_validator("writable_dirs")
    @classmethod
    def _abs_writable(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_sandbox_dir("writable_dirs", d) for d in v)

    @field_validator("root_dirs")
    @classmethod
    def _abs_root(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for d in v:
            _sandbox_dir("root_dirs", d)
            if posixpath.normpath(d) != d or d.startswith("//"):
                raise ValueError(f"root_dirs must be normalized paths (no '.', '//' or trailing '/'): {d!r}")
        return v

    @model_validator(mode="after")
    def _root_dirs_writable(self) -> SandboxSpec:
        stray = [d for d in self.root_dirs if d not in self.writable_dirs]
        if stray:
            raise ValueError(f"root_dirs {stray[0]!r} is not in writable_dirs: only a writable dir "
                             f"the sandbox creates can be made root's ({', '.join(self.writable_dirs) or 'none'})")
        return self

    @field_validator("image")
    @classmethod
    def _image_name(cls, v: str) -> str:
        if not v.strip() or "\x00" in v or "/" in v:
            raise ValueError(f"image must be an image name or content hash (sandfleet image ls), not {v!r}")
        return v

    @field_validator("user")
    @classmethod
    def _user_name(cls, v: str) -> str:
        return check_user(v)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v != "auto" and v not in BACKENDS:
            raise ValueError(f"unknown backend {v!r}; known: auto, {', '.join(BACKENDS)}")
        return v


def _sandbox_dir(what: str, v: str, *, root_ok: bool = False) -> str:
    """An absolute path inside the sandbox, without '..' or NUL (and not '/' unless ``root_ok``)."""
    if not v.startswith("/") or "\x00" in v or "/../" in v + "/" or not (root_ok or v.strip("/")):
        raise ValueError(f"{what} must be an absolute path without '..'{'' if root_ok else ' (not /)'}: {v!r}")
    return v


def is_root(user: str) -> bool:
    """Whether ``user`` (a name or a number in the sandbox) is its root."""
    return str(USERS.get(user, user)) == "0"


def check_user(v: str | int) -> str:
    """A user name or number as the guest agent takes it; raises ValueError naming the problem."""
    v = str(v).strip()
    if v.isdigit():
        if int(v) >= SANDBOX_UIDS:
            raise ValueError(f"user {v} is outside the sandbox's uids 0..{SANDBOX_UIDS - 1}")
        return str(int(v))
    if not v or len(v) > 32 or not all(c.isalnum() or c in "._-" for c in v) or v[0] == "-":
        raise ValueError(f"invalid user name {v!r}")
    return v


def make_spec(**kwargs: Any) -> SandboxSpec:
    """Build a SandboxSpec, turning validation errors into ConfigError with the field named."""
    limits = {k: kwargs.pop(k) for k in list(kwargs) if k in Limits.model_fields}
    try:
        if limits:
            kwargs["limits"] = Limits(**limits)
        return SandboxSpec(**kwargs)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"invalid sandbox spec: {loc + ': ' if loc else ''}{err['msg']}") from None


def helper_path(backend: str) -> str | None:
    """The argv[0] that runs the guest agent's helpers in a sandbox of ``backend``, or None: the
    process backend or an unknown remote one has none, and ``SANDFLEET_NATIVE_HELPERS=0`` keeps the
    scripts and tar."""
    return None if current_settings().native_helpers_off else GUEST_AGENT_PATHS.get(backend)
