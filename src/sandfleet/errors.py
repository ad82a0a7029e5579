"""The exception tree of sandfleet.

Every error sandfleet raises derives from :class:`SandfleetError`; third-party errors
(subprocess, OS, httpx, QEMU) are translated at one boundary each, and errors raised
inside a sandbox's guest agent come back to the host with their type::

    SandfleetError
    ├── ConfigError (ValueError)            bad input: unknown backend/image, absurd limits
    ├── HostUnsupportedError                 the host lacks what a backend needs (bwrap, KVM, cgroups)
    ├── ImageError                           an image can't be found or built
    │   └── ImageBuildError                  a build step failed (names the Dockerfile line)
    ├── SandboxError                         anything about one sandbox
    │   ├── SandboxClosedError               used after close()
    │   ├── SandboxDiedError                 the sandbox or its guest agent died
    │   │   ├── SandboxExpiredError          its TTL on a service passed (the service closed it)
    │   │   └── SandboxLostError             the service that held it restarted
    │   ├── SandboxTimeoutError (TimeoutError)  an operation outlived its deadline
    │   │   └── SandboxUnresponsiveError     the guest agent did not answer in time (sandbox is dead)
    │   ├── SandboxPathError (ValueError)    a path escapes the sandbox or is invalid
    │   ├── BranchError                      a branch would lose running processes (names them)
    │   ├── GuestError                       an error raised inside the guest, re-raised by type:
    │   │   ├── GuestFileNotFoundError (FileNotFoundError)
    │   │   ├── GuestPermissionError (PermissionError)
    │   │   ├── GuestIsADirectoryError (IsADirectoryError)
    │   │   └── GuestExecError               the command could not be started
    │   └── ProtocolError                    malformed frame / version mismatch
    ├── PoolError                            the warm pool is closed or over capacity
    ├── ServiceError                         the sandbox service refused a request (``status``, ``code``,
    │                                        ``retry_after``)
    │   ├── AuthError                        missing or wrong bearer token (401)
    │   └── ServiceBusyError                 over an admission limit or quota (429, ``retry_after``)
    ├── TaskError                            a task folder is malformed (names file and field)
    └── RolloutError                         a rollout failed (model server down, ...)
        └── ModelError                       the model server failed or answered garbage

Each class carries what a rollout that ends with it is (rollout/verdict.py): ``reason``, the
short code its result records (the class's own name unless it, or a class above it that says
so with ``reason_inherits``, declares one), and ``cause``, its row of the verdict table (None:
by its reason code). A :class:`SandboxDiedError` carries how its sandbox ended,
:class:`SandboxEnd`, as the owner of the sandbox saw it (exit status or signal, the memory
cgroup's OOM kills): no verdict reads an error's name or message.

Between the service and its client an error travels as an HTTP status and a ``code``; the
one table between codes and exceptions is :data:`WIRE`: the server answers with
:func:`to_wire`, the client raises :func:`from_wire`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar


class SandfleetError(Exception):
    """Base of every sandfleet error."""

    reason: str = "SandfleetError"
    """The short code a failed rollout's result records for it (its class's: ``type(e).reason``;
    a :class:`RolloutError` gives its own per error)."""
    reason_inherits: ClassVar[bool] = False
    """Subclasses record this class's ``reason`` (True), or their own name (False)."""
    cause: str | None = None
    """Its cause in the verdict table (rollout/verdict.py ``RULES``); None: by ``reason``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "reason" not in cls.__dict__ and not cls.reason_inherits:
            cls.reason = cls.__qualname__.rpartition(".")[2]


def reason_code(e: SandfleetError) -> str:
    """The reason code a failed rollout records for ``e``: a :class:`RolloutError`'s own, else
    its class's (an instance may carry a ``reason`` of another kind: an ImageBuildError's is the
    coverage group of a refused base)."""
    return e.reason if isinstance(e, RolloutError) else type(e).reason


class ConfigError(SandfleetError, ValueError):
    """Invalid input: an unknown backend or image, a negative or absurd limit."""


class HostUnsupportedError(SandfleetError):
    """The host lacks something a backend needs; the message says what and how to get it."""

    cause = "sandbox_start"


class ImageError(SandfleetError):
    """An image can't be found, read or built."""

    reason = "image_build"
    reason_inherits = True
    cause = "image_build"


class ImageBuildError(ImageError):
    """A build step failed. ``line`` is the Dockerfile line number when known."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None):
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        super().__init__(where + message)
        self.file = file
        self.line = line


class SandboxError(SandfleetError):
    """Something went wrong with one sandbox."""


class BranchError(SandboxError):
    """``branch()`` refused: processes run in the source that this backend can't carry into
    its children (``processes`` lists ``(pid, comm, cmdline)``), or the chain of stacked
    layers is at its limit. Pass ``processes="drop"`` to branch without them."""

    def __init__(self, message: str, processes: list[tuple[int, str, str]] | None = None):
        super().__init__(message)
        self.processes = processes or []


class SandboxClosedError(SandboxError):
    """The sandbox was already closed."""


@dataclass(frozen=True)
class SandboxEnd:
    """How a sandbox's process ended, as its owner saw it (sandbox/_spawn.py): the evidence of
    a :class:`SandboxDiedError`, and what tells the agent's own memory from a kill from outside."""

    exit_status: int | None = None
    """Its exit status; None when killed by a signal or not seen."""
    signal: str | None = None
    """The signal that killed it (``SIGKILL``, or ``signal N``); None when it exited or was not seen."""
    running: bool = False
    """Its process was still running when the stream ended."""
    oom_kills: int = 0
    """OOM kills in its memory cgroup (``memory.events`` ``oom_kill``)."""
    own_limit_reached: bool | None = None
    """Its own memory limit was hit (``memory.events`` ``oom`` > 0, or cgroup v1); False: the
    kills came from an OOM killer outside its cgroup; None: no OOM kill."""
    state_dir_gone: bool = False
    """Its state directory was gone (reaped by another process)."""
    pids_limit_hits: int = 0
    """Forks its pids cgroup refused at the sandbox's own limit (``pids.events`` ``max``): its
    processes ran out of pids (a fork bomb), which gVisor's Sentry does not survive."""
    log_tail: str = ""
    """The end of its agent.log."""

    @property
    def oom_own(self) -> bool:
        """OOM kills its own memory limit caused (the agent's memory: a policy fault)."""
        return bool(self.oom_kills) and self.own_limit_reached is not False

    def describe(self, *, log: bool = True) -> str:
        """The words an error says it in (``log``: with the log's tail)."""
        if self.signal:
            parts = [f"its process was killed by {self.signal}"]
        elif self.exit_status is not None:
            parts = [f"its process exited with status {self.exit_status}"]
        else:
            parts = ["its process is still running"]
        if self.oom_kills:
            parts.append(f"{self.oom_kills} OOM kill(s) in its memory cgroup")
            if self.own_limit_reached is False:
                parts.append(OOM_OUTSIDE)
        if self.pids_limit_hits:
            parts.append(f"{self.pids_limit_hits} fork(s) refused at its own pids limit")
        if self.state_dir_gone:
            parts.append("its state directory is gone (reaped by another process?)")
        if log and self.log_tail:
            parts.append(f"its log ends: {self.log_tail}")
        return "; ".join(parts)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, body: object) -> SandboxEnd | None:
        """The end a wire body carries (unknown keys and ill-typed values left out)."""
        if not isinstance(body, dict):
            return None
        kinds = {"exit_status": int, "signal": str, "running": bool, "oom_kills": int,
                 "own_limit_reached": bool, "state_dir_gone": bool, "pids_limit_hits": int, "log_tail": str}
        kept = {f.name: body[f.name] for f in fields(cls) if isinstance(body.get(f.name), kinds[f.name])}
        return cls(**kept)


OOM_OUTSIDE = "its own memory limit was never reached (killed by an OOM killer outside its cgroup)"
"""Said of a sandbox whose processes were OOM-killed while its own memory limit was never hit
(cgroup v2 ``memory.events`` ``oom`` 0): the host's or a parent cgroup's OOM killer, not the
sandbox's own memory (rollout/verdict.py: an infra fault)."""


class SandboxDiedError(SandboxError):
    """The sandbox (or its guest agent) died; it can't be used any more. ``end`` is how its
    process ended, where its owner saw it (None: a service's TTL, a lost host, a stream cut)."""

    reason = "sandbox_died"
    reason_inherits = True

    def __init__(self, message: str, *, end: SandboxEnd | None = None, head: str | None = None):
        super().__init__(message)
        self.end = end
        self.head = head if head is not None else message
        """The message without the log's tail."""

    @property
    def cause(self) -> str:  # type: ignore[override]
        """``sandbox_oom`` for OOM kills its own memory limit caused, ``sandbox_pids`` for a
        process that exited by itself after the sandbox's processes hit its pids limit (gVisor's
        Sentry under a fork bomb; a kill by a signal came from outside), else ``sandbox_died``."""
        if self.end is not None and self.end.oom_own:
            return "sandbox_oom"
        if self.end is not None and self.end.pids_limit_hits and self.end.signal is None:
            return "sandbox_pids"
        return "sandbox_died"


class SandboxExpiredError(SandboxDiedError):
    """A service closed the sandbox when its TTL passed."""


class SandboxLostError(SandboxDiedError):
    """The service that held the sandbox restarted (or was killed): the sandbox is gone."""


class SandboxTimeoutError(SandboxError, TimeoutError):
    """An operation on a sandbox outlived its deadline."""

    reason = "sandbox_timeout"
    reason_inherits = True
    cause = "sandbox_timeout"


class SandboxUnresponsiveError(SandboxTimeoutError):
    """The guest agent did not answer a call within its deadline (stopped, wedged or lying).

    The sandbox is marked dead when this is raised: every other call in flight fails too,
    and nothing more is sent to it. ``reason`` is ``"agent_unresponsive"``."""

    reason = "agent_unresponsive"
    cause = "agent_unresponsive"


class SandboxPathError(SandboxError, ValueError):
    """A path is invalid or escapes the sandbox."""


class GuestError(SandboxError):
    """An error raised inside the guest agent. ``guest_type`` is the guest's name for it."""

    guest_type: str = "GuestError"

    def __init__(self, message: str, *, guest_type: str | None = None, errno: int | None = None):
        super().__init__(message)
        if guest_type:
            self.guest_type = guest_type
        self.errno = errno


class GuestFileNotFoundError(GuestError, FileNotFoundError):
    guest_type = "FileNotFoundError"


class GuestPermissionError(GuestError, PermissionError):
    guest_type = "PermissionError"


class GuestIsADirectoryError(GuestError, IsADirectoryError):
    guest_type = "IsADirectoryError"


class GuestExecError(GuestError):
    """The command could not be started (no such program, bad cwd)."""

    guest_type = "ExecError"


class ProtocolError(SandboxError):
    """A malformed frame or a protocol version the host does not speak."""


class PoolError(SandfleetError):
    """The warm pool is closed or can't admit more sandboxes."""

    cause = "service_unreachable"


class ServiceError(SandfleetError):
    """The sandbox service (``sandfleet serve``) refused or failed a request, or can't be
    reached. ``code`` is the service's error code, ``status`` the HTTP status (0 when there
    was no answer; raised inside the service, 0 means the status :data:`WIRE` gives the
    code), ``retry_after`` the service's advice in seconds, when it gave one."""

    cause = "service_unreachable"

    def __init__(self, message: str, *, status: int = 0, code: str = "service_error",
                 retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after = retry_after


class AuthError(ServiceError):
    """The bearer token is missing or not one the service knows (HTTP 401)."""


class ServiceBusyError(ServiceError):
    """Over an admission limit past the request's deadline, or over the token's quota (HTTP
    429). ``retry_after`` is the service's advice, in seconds."""

    def __init__(self, message: str, *, status: int = 429, code: str = "busy", retry_after: float | None = None):
        super().__init__(message, status=status, code=code, retry_after=retry_after)


class TaskError(SandfleetError):
    """A task folder is malformed; the message names the file and the field."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        prefix = ""
        if file:
            prefix = f"{file}: " if not field else f"{file}: field {field!r}: "
        super().__init__(prefix + message)
        self.file = file
        self.field = field


class RolloutError(SandfleetError):
    """A rollout failed; ``reason`` is a short machine-readable cause (its row of the verdict
    table is the reason code's: rollout/verdict.py ``REASON_CAUSES``)."""

    reason = "error"
    reason_inherits = True

    def __init__(self, message: str, *, reason: str = "error"):
        super().__init__(message)
        self.reason = reason


class ModelError(RolloutError):
    """The model server was down, too slow, or answered something that isn't a chat completion."""


GUEST_ERRORS: dict[str, type[GuestError]] = {
    cls.guest_type: cls
    for cls in (GuestFileNotFoundError, GuestPermissionError, GuestIsADirectoryError, GuestExecError)
}


def guest_error(guest_type: str, message: str, errno: int | None = None) -> GuestError:
    """Rebuild a guest-side error on the host with its type."""
    cls = GUEST_ERRORS.get(guest_type, GuestError)
    return cls(message, guest_type=guest_type, errno=errno)


# -- the wire: the service's error codes <-> exceptions

WIRE: tuple[tuple[str, int, type[SandfleetError]], ...] = (
    ("guest_error", 422, GuestError),  # the body adds guest_type and errno: rebuilt by guest_error()
    ("bad_path", 400, SandboxPathError),
    ("agent_unresponsive", 410, SandboxUnresponsiveError),
    ("agent_unresponsive", 410, SandboxTimeoutError),
    ("sandbox_closed", 410, SandboxClosedError),
    ("sandbox_expired", 410, SandboxExpiredError),
    ("sandbox_lost", 410, SandboxLostError),
    ("sandbox_died", 410, SandboxDiedError),
    ("sandbox_died", 410, ProtocolError),
    ("branch_refused", 409, BranchError),
    ("unknown_image", 400, ImageError),
    ("invalid_request", 400, ConfigError),
    ("unsupported", 400, HostUnsupportedError),
    ("sandbox_died", 410, SandboxError),
    # refusals of the service itself (raised there as ServiceError(code=...), status from here)
    ("unauthorized", 401, AuthError),
    ("busy", 429, ServiceBusyError),
    ("quota_exceeded", 429, ServiceBusyError),
    ("sandbox_not_found", 404, ServiceError),
    ("snapshot_not_found", 404, ServiceError),
    ("session_not_found", 404, ServiceError),
    ("task_image_not_found", 404, ServiceError),
    ("idempotency_conflict", 422, ServiceError),
    ("draining", 503, ServiceError),
    ("host_error", 503, ServiceError),
    ("digest_mismatch", 400, ServiceError),
    ("not_a_task", 422, ServiceError),
    ("build_failed", 422, ServiceError),
)
"""The one table between the service's error codes and exceptions: (code, HTTP status,
exception). The server answers an exception with the first row its type matches, a
:class:`ServiceError` with the row of its own code (:func:`to_wire`); the client raises,
for a code, the exception of the code's first row (:func:`from_wire`)."""

_EXCEPTION: dict[str, type[SandfleetError]] = {}
_STATUS: dict[str, int] = {}
for _code, _status, _cls in WIRE:
    _EXCEPTION.setdefault(_code, _cls)
    _STATUS.setdefault(_code, _status)
del _code, _status, _cls


def to_wire(e: BaseException) -> tuple[int, str, dict[str, object]] | None:
    """(HTTP status, code, extra body fields) of a sandfleet exception; None for any other
    exception (a bug of ours: the caller logs it and answers 500)."""
    if isinstance(e, ServiceError):
        return e.status or _STATUS.get(e.code, 500), e.code, {}
    for code, status, cls in WIRE:
        if isinstance(e, cls):
            if isinstance(e, SandboxDiedError) and e.end is not None:
                return status, code, {"end": e.end.to_wire(), "head": e.head}
            return status, code, ({"guest_type": e.guest_type, "errno": e.errno} if isinstance(e, GuestError) else {})
    return None


def error_of(code: str, message: str, extra: dict[str, Any] | None = None) -> SandfleetError:
    """The exception of ``code`` (its first row in :data:`WIRE`), as the service raises it
    (``extra``: what :func:`to_wire` added, e.g. a dead sandbox's ``end``)."""
    return from_wire(_STATUS.get(code, 0), {**(extra or {}), "code": code, "message": message})


def from_wire(status: int, body: dict[str, object], retry_after: float | None = None) -> SandfleetError:
    """The exception an error answer (``status``, its JSON ``body``) stands for: the one the
    same failure raises on a local sandbox, where there is one."""
    code = str(body.get("code") or "error")
    msg = str(body.get("message") or f"HTTP {status}")
    cls = _EXCEPTION.get(code)
    if cls is GuestError:
        errno = body.get("errno")
        return guest_error(str(body.get("guest_type") or "GuestError"), msg, errno if isinstance(errno, int) else None)
    if cls is None or issubclass(cls, ServiceError):
        if cls is None or cls is ServiceError:  # by status: what a refusal of that kind is
            if status == 413:  # too_large: the HTTP layer's cap on a body or an archive
                return ConfigError(msg)
            cls = {401: AuthError, 429: ServiceBusyError}.get(status, ServiceError)
        return cls(msg, status=status, code=code, retry_after=retry_after)
    if issubclass(cls, SandboxDiedError):  # how it ended, as the service's owner of it saw it
        head = body.get("head")
        return cls(msg, end=SandboxEnd.from_wire(body.get("end")), head=head if isinstance(head, str) else None)
    return cls(msg)
