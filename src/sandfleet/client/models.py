"""The wire format of the service's ``/v1`` API: its request and response models (pydantic
only, no FastAPI: the client builds its requests from them, the server's routes declare them).

Errors are ``{"code": ..., "message": ...}`` (:class:`ErrorBody`) with a 4xx status (guest
errors add ``guest_type`` and ``errno``); :data:`sandfleet.errors.WIRE` maps codes to
exceptions for both sides. A command's answer is NDJSON records (see :class:`ExecRequest`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sandfleet.agent.protocol import MAX_OUTPUT
from sandfleet.sandbox.spec import SandboxSpec

__all__ = ["MAX_TIMEOUT_S", "CodeExecution", "Deleted", "ErrorBody", "ExecRequest", "ForkRequest", "Health",
           "KillRequest", "RunCodeRequest", "SandboxInfo", "SandboxList", "SandboxSpec", "ServiceInfo", "SessionInfo",
           "SessionRequest", "SessionRun", "SnapshotInfo", "TTLRequest", "TaskImage"]

MAX_TIMEOUT_S = 7 * 86400.0


class ErrorBody(BaseModel):
    code: str
    """Machine-readable: invalid_request, unknown_image, bad_path, unsupported, too_large,
    unauthorized, sandbox_not_found, snapshot_not_found, session_not_found, sandbox_lost,
    sandbox_expired, sandbox_closed, sandbox_died, agent_unresponsive, guest_error,
    quota_exceeded, busy, draining, idempotency_conflict, task_image_not_found,
    digest_mismatch, not_a_task, build_failed."""
    message: str
    guest_type: str | None = None
    errno: int | None = None


# -- sandboxes


class SandboxInfo(BaseModel):
    id: str
    """The sandbox id (the backend's own id on the service host)."""
    backend: str
    """The backend the service runs it on (bwrap, process, microvm)."""
    spec: SandboxSpec
    """What it was created with (the TTL as asked; ``expires_in_s`` says what is left)."""
    created: float
    """Unix time of creation."""
    expires_in_s: float
    """Seconds left to its TTL (the service closes it then)."""
    alive: bool
    busy: int
    """Commands running in it now."""


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo]


class Deleted(BaseModel):
    deleted: list[str]


class TTLRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_s: float = Field(gt=0, le=30 * 86400)
    """New lifetime, in seconds from now (within the service's --max-ttl)."""


class ExecRequest(BaseModel):
    """One command. Its answer is NDJSON: ``{"type": "stdout"|"stderr", "b64": ...}`` chunks
    when ``stream`` is set, then ``{"type": "exit", ...}`` (or ``{"type": "error", "code",
    "message"}`` when the command could not run or the sandbox died)."""

    model_config = ConfigDict(extra="forbid")
    cmd: str | list[str] = Field(min_length=1)
    """argv, or a string run by ``bash -c``."""
    cwd: str | None = None
    env: dict[str, str] | None = None
    stdin_b64: str | None = None
    """Bytes fed to the command's stdin, base64."""
    timeout: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    """Kill the command's whole tree after this many seconds (exit 137, ``timed_out``)."""
    max_output: int = Field(1 << 20, ge=0, le=MAX_OUTPUT)
    """Bytes kept of each of stdout and stderr; the rest is counted in ``*_dropped``."""
    stream: bool = False
    """Send output chunks as they come (the exit record then carries no output)."""
    user: str | int | None = None
    """Who runs it inside (name or uid); the sandbox's user by default."""
    network: bool = True
    """False: run it in a network namespace of its own, with only a loopback."""
    pid_namespace: bool = False
    """True: run it as the first process of a pid namespace of its own (what it leaves dies with it)."""


class SessionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None


class SessionInfo(BaseModel):
    id: str


class SessionRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: str
    timeout: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    max_output: int = Field(1 << 20, ge=0, le=MAX_OUTPUT)
    stream: bool = False


class RunCodeRequest(BaseModel):
    """One cell for the sandbox's stateful Python (its kernel starts on the first one)."""

    model_config = ConfigDict(extra="forbid")
    code: str
    context: str = Field("default", min_length=1, max_length=128)
    """A separate globals dict, made on its first cell."""
    language: Literal["python", "bash"] = "python"
    """``bash``: a long-lived bash per context (as E2B's bash kernel: variables, functions and
    the working directory persist; a failed cell's error has no name and its exit status as
    value). A context's first cell sets its language; bash cells with the default context share
    the sandbox's one bash, ``default-bash``."""
    cwd: str | None = None
    """The context's working directory, when this cell makes it (default: the sandbox's)."""
    env: dict[str, str] | None = None
    """Environment variables for this cell only."""
    timeout: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    """Interrupt the cell (KeyboardInterrupt) after this many seconds; its state stays."""


class CodeExecution(BaseModel):
    """What a cell did: its results (the one with ``is_main_result`` is the value of its last
    expression, as in Jupyter; the others are displays, such as matplotlib figures: ``text``,
    and ``png``, ``html``, ... where there are), its output in the pieces it came in, and its
    error (``name``, ``value``, ``traceback``), if any."""

    results: list[dict[str, Any]] = Field(default_factory=list)
    stdout: list[str] = Field(default_factory=list)
    stderr: list[str] = Field(default_factory=list)
    error: dict[str, str] | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """The text of the cell's value (None when the cell ends in a statement or None)."""
        for r in self.results:
            if r.get("is_main_result"):
                return r.get("text")
        return None


class KillRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str | int


class SnapshotInfo(BaseModel):
    id: str
    backend: str
    sandbox: str
    """The sandbox it was taken of."""


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(1, ge=1, le=4096)
    ttl_s: float | None = Field(None, gt=0, le=30 * 86400)
    """TTL of each new sandbox (default: the snapshotted sandbox's)."""
    labels: dict[str, str] | None = None


class BranchRequest(BaseModel):
    """``POST /v1/sandboxes/{sid}/branch``: ``n`` live sandboxes that continue from this one's
    state now; it keeps running (docs/branching.md)."""

    model_config = ConfigDict(extra="forbid")
    n: int = Field(1, ge=1, le=100)
    processes: Literal["error", "drop"] = "error"
    """What to do with running processes the backend can't carry (bwrap, gvisor): "error"
    refuses with their names (409 branch_refused), "drop" branches without them."""


class BranchResult(BaseModel):
    sandboxes: list[SandboxInfo]
    """The children, in order; each continues the source's sessions under the same ids."""
    carried: list[str]
    """What the children carry: "filesystem", "sessions" (and "memory", "processes" on microvm)."""
    dropped: list[tuple[int, str, str]] = []
    """The processes left out (``processes="drop"``): pid, comm, command line."""


class ServiceInfo(BaseModel):
    version: str
    backend: str
    max_sandboxes: int
    max_busy: int
    quota: int
    max_ttl_s: float
    max_body_bytes: int
    limits_basis: str
    sandboxes: int
    busy: int
    draining: bool
    arch: str = Field(default_factory=lambda: _arch())
    """The architecture its sandboxes run (Debian's name: amd64, arm64), for placement."""


def _arch() -> str:
    from sandfleet.imagestore import arch

    return arch()


class Health(BaseModel):
    ok: bool
    draining: bool


# -- task images


class TaskImage(BaseModel):
    digest: str
    """The task folder's content hash."""
    image: str
    """What to put in ``SandboxSpec.image`` (``host`` for a task without a Dockerfile)."""
    env: dict[str, str]
    """The image's environment (its Dockerfile's ENV)."""
    arch: str
    warnings: list[str]
    """A substituted base and the like (``strict=true`` refuses those)."""
    build_s: float | None
    built: bool
    """True when this request built it; False when it was known (or in the image cache)."""
