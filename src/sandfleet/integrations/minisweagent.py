"""mini-swe-agent: a sandfleet sandbox as mini's environment.

    mini --environment-class sandfleet.integrations.minisweagent.SandfleetEnvironment ...
    # or in the YAML config:
    environment:
      environment_class: sandfleet.integrations.minisweagent.SandfleetEnvironment
      task: examples/tasks/csv-awk-aggregate      # its image, workdir, env and limits (optional)
      backend: bwrap
      timeout: 60

mini's environments are synchronous and its batch runner calls them from worker threads;
sandfleet is async. Every :class:`SandfleetEnvironment` of the process runs on one
background event loop (sandfleet's guest connections belong to the loop that made them),
and each call waits for its result there. The sandbox is made at the first command and
closed by :meth:`SandfleetEnvironment.close`, when the environment is collected, or at
interpreter exit, whichever comes first (mini never calls a cleanup method itself).

**The mask.** A command that fails for a reason the agent can't cause (the sandbox killed
from outside, the sandbox service unreachable: an ``infra_fault`` by sandfleet's verdict
rule, docs/rollouts.md) ends the run in mini's own way, an exit message: the trajectory's
``info.exit_status`` is ``InfraFault`` (the message's ``extra`` carries ``verdict`` and
``fault``), so a trainer or a batch run can tell it from the agent's own ends (``Submitted``,
``LimitsExceeded``, ...) and leave it out. Other failures (the sandbox OOM-killed by the
agent's own memory, ...) are shown to the agent as mini's environments do (returncode -1,
``exception_info``).
"""

from __future__ import annotations

import asyncio
import logging
import platform
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, field_validator

from sandfleet.integrations._common import infra_fault_of, resolve_task, task_image
from sandfleet.rollout.runner import task_spec
from sandfleet.sandbox import create_sandbox, make_spec
from sandfleet.sandbox.base import Sandbox
from sandfleet.sandbox.spec import BACKENDS

log = logging.getLogger(__name__)
T = TypeVar("T")

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SubmittedStandIn(Exception):
    """Raised in place of ``minisweagent.exceptions.Submitted`` where mini is not installed."""

    def __init__(self, *messages: dict[str, Any]):
        self.messages = messages
        super().__init__()


INFRA_EXIT_STATUS = "InfraFault"


class InfraFaultStandIn(Exception):
    """Raised in place of mini's ``InterruptAgentFlow`` (an :func:`infra_fault_class`) without mini."""

    def __init__(self, *messages: dict[str, Any]):
        self.messages = messages
        super().__init__()


def infra_fault_class() -> type[Exception]:
    """An ``InterruptAgentFlow`` subclass (mini's agent ends its run on the exit message it
    carries), or the stand-in without mini."""
    try:
        from minisweagent.exceptions import InterruptAgentFlow
    except ImportError:
        return InfraFaultStandIn
    return type("InfraFault", (InterruptAgentFlow,), {"__doc__": "The sandbox failed from outside (infra_fault)."})


def submitted_class() -> type[Exception]:
    """mini's ``Submitted`` (which its agent catches), or the stand-in without mini."""
    try:
        from minisweagent.exceptions import Submitted
    except ImportError:
        return SubmittedStandIn
    cls: type[Exception] = Submitted
    return cls


class SandfleetEnvironmentConfig(BaseModel):
    """The ``environment:`` keys of a mini config (besides ``environment_class``)."""

    model_config = ConfigDict(extra="forbid")

    task: str | None = None
    """A task folder, or a name under ``$SANDFLEET_TASKS``: the sandbox gets its image (built
    once), workdir, env and limits. Without one, ``image`` is used."""
    image: str = "host"
    """A sandfleet image (``sandfleet image ls``); ``host`` is this host's / read-only."""
    backend: str = "auto"
    """``auto``, ``bwrap``, ``process`` or ``microvm``."""
    cwd: str = ""
    """Where commands run (default: the task's workdir, else ``/work``)."""
    env: dict[str, str] = {}
    """Extra environment of every command."""
    timeout: int = 30
    """Seconds a command may run; its whole process tree is killed then."""
    user: str | None = None
    """Who commands run as (default: the task's declared user, else the non-root ``agent``)."""
    memory_mib: int | None = None
    cpus: float | None = None
    network: bool = False
    ttl_s: float = 4 * 3600.0
    """The sandbox's lifetime: reaped after it even if this process is killed."""
    remote: str | None = None
    """The URL of a sandfleet service to make the sandbox on (token in ``$SANDFLEET_TOKEN``)."""

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v != "auto" and v not in BACKENDS:  # refused with the config, not at the first rollout
            raise ValueError(f"unknown backend {v!r}; known: auto, {', '.join(BACKENDS)}")
        return v


class BackgroundLoop:
    """One event loop on a daemon thread, shared by every environment of the process."""

    _lock = threading.Lock()
    _shared: BackgroundLoop | None = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="sandfleet-minisweagent")
        self.thread.start()

    @classmethod
    def shared(cls) -> BackgroundLoop:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` there and wait for its result (from any thread but the loop's own)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


def _close(loop: BackgroundLoop, holder: dict[str, Any]) -> None:
    sandbox, service = holder.pop("sandbox", None), holder.pop("service", None)
    if loop.loop.is_closed():
        return
    for what, closing in (("sandbox", sandbox and sandbox.close()), ("service client", service and service.aclose())):
        if closing is None:
            continue
        try:
            loop.run(closing, timeout=60)
        except Exception as e:
            log.error("closing the %s of %s failed (sandfleet's reaper removes it): %s: %s", what,
                      getattr(sandbox, "id", "?"), type(e).__name__, e)


class SandfleetEnvironment:
    """mini-swe-agent's ``Environment`` over one sandfleet sandbox (synchronous)."""

    def __init__(self, *, config_class: type = SandfleetEnvironmentConfig, logger: logging.Logger | None = None,
                 **kwargs: Any):
        self.config = config_class(**kwargs)
        self.logger = logger or log
        self._loop = BackgroundLoop.shared()
        self._holder: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._workdir = self.config.cwd or "/work"
        self._finalizer = weakref.finalize(self, _close, self._loop, self._holder)

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox, made at first use."""
        with self._lock:
            if "sandbox" not in self._holder:
                if not self._finalizer.alive:
                    raise RuntimeError("this environment is closed")
                self._holder["sandbox"] = self._loop.run(self._create())
            sandbox: Sandbox = self._holder["sandbox"]
            return sandbox

    async def _create(self) -> Sandbox:
        cfg = self.config
        limits = {k: v for k, v in (("memory_mib", cfg.memory_mib), ("cpus", cfg.cpus)) if v is not None}
        if cfg.task:
            task = resolve_task(cfg.task)
            spec = task_spec(task, await task_image(task), cfg.backend, network=cfg.network, agent_user=cfg.user)
            self._workdir = cfg.cwd or task.workdir
            spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={**limits, "ttl_s": cfg.ttl_s})})
        else:
            extra = {"user": cfg.user} if cfg.user else {}
            spec = make_spec(image=cfg.image, backend=cfg.backend, workdir=self._workdir, network=cfg.network,
                             ttl_s=cfg.ttl_s, **limits, **extra)
        if not cfg.remote:
            return await create_sandbox(spec)
        from sandfleet.client import connect
        from sandfleet.client.remote import token_from_env

        self._holder["service"] = service = await connect(cfg.remote, token_from_env())
        sandbox: Sandbox = await service.create_sandbox(spec)
        return sandbox

    def execute(self, action: dict[str, Any] | str, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` with bash (stdout and stderr merged, as mini's local
        environment); raise ``Submitted`` when its output starts with the submit marker."""
        command = action.get("command", "") if isinstance(action, dict) else str(action)
        limit = timeout or self.config.timeout
        try:
            sandbox = self.sandbox
            res = self._loop.run(sandbox.exec(["bash", "-c", "exec 2>&1\n" + command], cwd=cwd or self._workdir,
                                              env=self.config.env or None, timeout=limit))
            if res.timed_out:
                error = f"Command '{command}' timed out after {limit} seconds"
                output = {"output": res.stdout, "returncode": -1,
                          "exception_info": f"An error occurred while executing the command: {error}",
                          "extra": {"exception_type": "TimeoutExpired", "exception": error}}
            else:
                output = {"output": res.stdout, "returncode": res.exit_code, "exception_info": ""}
        except Exception as e:
            fault = infra_fault_of(e, "agent")
            if fault is not None:  # not the agent's doing: end the run, saying so
                raise infra_fault_class()({
                    "role": "exit", "content": f"{INFRA_EXIT_STATUS}: {fault['cause']}: {e}",
                    "extra": {"exit_status": INFRA_EXIT_STATUS, "submission": "", "verdict": "infra_fault",
                              "fault": fault},
                }) from e
            output = {"output": "", "returncode": -1,
                      "exception_info": f"An error occurred while executing the command: {e}",
                      "extra": {"exception_type": type(e).__name__, "exception": str(e)}}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise submitted_class()({"role": "exit", "content": submission,
                                     "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config and the platform (the sandbox shares the host's kernel), for mini's prompts."""
        return {**self.config.model_dump(), **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": self.config.model_dump(mode="json"),
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}

    def close(self) -> None:
        """Close the sandbox now (also done when collected and at exit)."""
        self._finalizer()

    cleanup = close
