"""verl: a code interpreter tool for verl's tool calling (``verl.tools.base_tool.BaseTool``), with
stateful Python in a sandfleet sandbox per trajectory (issue 47).

verl loads a tool from a tools config file (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)::

    tools:
      - class_name: sandfleet.integrations.verl.SandfleetCodeInterpreterTool
        config:
          type: native
          timeout_s: 30          # a cell past it is interrupted (KeyboardInterrupt in its output)
          idle_s: 600            # a trajectory's sandbox unused this long is closed
          # backend, image, memory_mib, network, remote: see below
        # tool_schema: optional; the default is a `code_interpreter` function taking `code`

and calls, per tool call of a trajectory (verl 0.9.1's ``ToolAgentLoop._call_tool``)
``instance_id, _ = await tool.create(create_kwargs=...)``, then ``await tool.execute(instance_id,
{"code": ...}, agent_data=agent_data)``, then ``await tool.release(instance_id)``. Because verl
makes and releases an instance for every call, the Python state is kept per trajectory, not per
instance: the kernel of ``agent_data.request_id`` (the trajectory's request) answers every call of
that trajectory, so ``x = 1`` in one call and ``x + 1`` in the next give ``2``. A caller that
passes no ``agent_data`` gets the BaseTool contract as written: the state of one instance, from
``create`` to ``release``, closed at ``release``. Nothing in verl says when a trajectory ends, so
a trajectory's sandbox is closed once it has been unused for ``idle_s`` (looked at on every call),
or by :meth:`SandfleetCodeInterpreterTool.close`, and at the latest by its ``ttl_s`` (a call to
a trajectory whose sandbox is gone fails, and its next call starts a fresh one).

``execute`` answers ``ToolResponse(text=...)``: the cell's stdout, its stderr, the value of its
last expression, and its error (``Name: value`` and the traceback's last frames), in that order
(``(no output)`` when there is none); the step reward is ``0.0``; the metrics are
``{"cell_ms": ..., "error": name or None}``. A sandbox is made on first use: on this host
(``backend``, default ``$SANDFLEET_BACKEND`` or ``auto``) or on the sandfleet service at
``remote`` (default ``$SANDFLEET_REMOTE``, its token in ``$SANDFLEET_TOKEN``), with ``image``
(default ``host``: the host's python3), ``memory_mib`` (1024), ``network`` (False). Locally the
cell runs in a :class:`~sandfleet.interpreter.Kernel`; on a service, through ``run_code``.

Where verl is installed the class is a subclass of verl's ``BaseTool`` and answers verl's
``ToolResponse``; without verl it has the same methods and answers :class:`ToolResponse` of this
module (same fields), so it runs and is tested without verl.
"""

from __future__ import annotations

import asyncio
import importlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sandfleet.client.models import CodeExecution
from sandfleet.errors import ConfigError
from sandfleet.settings import environment


@dataclass
class ToolResponse:
    """verl's ``ToolResponse`` (``verl.tools.schemas``) where verl is not installed."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None


SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code in a stateful interpreter: variables, imports and files persist across "
                       "calls. Returns the code's stdout and stderr, the value of its last expression, and its "
                       "error, if any.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}
"""The default tool schema (OpenAI function format), used when the tools config gives none."""

MAX_TRACEBACK_LINES = 12

try:  # verl installed: be its BaseTool, answer its ToolResponse
    _base: type = importlib.import_module("verl.tools.base_tool").BaseTool
    _schemas = importlib.import_module("verl.tools.schemas")
    _Response: Any = _schemas.ToolResponse
    _Schema: Any = _schemas.OpenAIFunctionToolSchema
except ImportError:
    _base, _Response, _Schema = object, ToolResponse, None


@dataclass
class _Session:
    """One sandbox and its kernel: a trajectory's, or one instance's."""

    sandbox: Any
    kernel: Any = None
    """A local sandbox's :class:`~sandfleet.interpreter.Kernel`; None on a service (``run_code``)."""
    last_used: float = field(default_factory=time.monotonic)
    instances: set[str] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run(self, code: str, timeout: float | None) -> CodeExecution:
        async with self.lock:
            self.last_used = time.monotonic()
            try:
                if self.kernel is not None:
                    out: CodeExecution = await self.kernel.run(code, timeout=timeout)
                else:
                    out = await self.sandbox.run_code(code, timeout=timeout)
                return out
            finally:
                self.last_used = time.monotonic()

    async def close(self) -> None:
        try:
            if self.kernel is not None:
                await self.kernel.close()
        finally:
            await self.sandbox.close()


def response_text(ex: CodeExecution) -> str:
    """What the model reads of a cell: stdout, stderr, the last expression's value, the error."""
    parts = ["".join(ex.stdout), "".join(ex.stderr)]
    if ex.text is not None:
        parts.append(ex.text + "\n")
    if ex.error is not None:
        tb = [line for line in (ex.error.get("traceback") or "").splitlines() if line.strip()]
        head = f"{ex.error.get('name')}: {ex.error.get('value')}"
        tail = tb[-MAX_TRACEBACK_LINES:]
        parts.append("\n".join(tail if tail and tail[-1].startswith(str(ex.error.get("name"))) else [*tail, head])
                     + "\n")
    text = "".join(parts)
    return text if text.strip() else "(no output)"


class SandfleetCodeInterpreterTool(_base):
    """A verl tool: stateful Python per trajectory in a sandfleet sandbox (the module docstring)."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None):
        config = dict(config or {})
        env = environment()
        self.backend = str(config.get("backend") or env.get("SANDFLEET_BACKEND") or "auto")
        self.remote = config.get("remote") or env.get("SANDFLEET_REMOTE") or None
        self.image = str(config.get("image") or "host")
        self.timeout_s = float(config.get("timeout_s", 30))
        self.idle_s = float(config.get("idle_s", 600))
        self.ttl_s = int(config.get("ttl_s", 3600))
        self.memory_mib = int(config.get("memory_mib", 1024))
        self.network = bool(config.get("network", False))
        unknown = set(config) - {"type", "backend", "remote", "image", "timeout_s", "idle_s", "ttl_s", "memory_mib",
                                 "network"}
        if unknown:
            raise ConfigError(f"SandfleetCodeInterpreterTool: unknown config key(s) {', '.join(sorted(unknown))}; "
                              "known: backend, remote, image, timeout_s, idle_s, ttl_s, memory_mib, network")
        self._sessions: dict[str, _Session] = {}
        self._instances: dict[str, str | None] = {}
        """Instance id -> the key of its session (None until its first call)."""
        self._starting: dict[str, asyncio.Future[_Session]] = {}
        self._client: Any = None
        """The service's client (``remote``), connected on the first sandbox."""
        if _base is object:
            self.config = config
            self.tool_schema = tool_schema or SCHEMA
            self.name = self.tool_schema["function"]["name"]
        else:
            super().__init__(config, tool_schema)

    def get_openai_tool_schema(self) -> Any:
        """The tools config's schema, else :data:`SCHEMA` (verl's ``OpenAIFunctionToolSchema`` with verl)."""
        given = getattr(self, "tool_schema", None)
        if given:
            return given
        return _Schema.model_validate(SCHEMA) if _Schema is not None else SCHEMA

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        """A tool instance; its sandbox is made on its first ``execute``."""
        iid = instance_id or str(uuid.uuid4())
        self._instances.setdefault(iid, None)
        await self._close_idle()
        return iid, _Response()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, float, dict]:
        """Run ``parameters["code"]`` in the trajectory's (or the instance's) kernel."""
        code = parameters.get("code", "")
        if not isinstance(code, str):
            code = str(code)
        timeout = float(parameters.get("timeout", self.timeout_s))
        request_id = getattr(kwargs.get("agent_data"), "request_id", None)
        key = f"trajectory:{request_id}" if request_id else f"instance:{instance_id}"
        self._instances[instance_id] = key
        session = await self._session(key)
        session.instances.add(instance_id)
        t = time.perf_counter()
        try:
            ex = await session.run(code, timeout)
        except Exception:
            if not getattr(session.sandbox, "alive", True) and self._sessions.get(key) is session:
                del self._sessions[key]  # gone (its ttl_s, a kill): the trajectory's next call starts afresh
                await asyncio.gather(session.close(), return_exceptions=True)
            raise
        metrics = {"cell_ms": round((time.perf_counter() - t) * 1e3, 3),
                   "error": ex.error.get("name") if ex.error else None}
        return _Response(text=response_text(ex)), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """The instance is gone; its own session (not a trajectory's) is closed with it."""
        key = self._instances.pop(instance_id, None)
        session = self._sessions.get(key) if key else None
        if session is not None:
            session.instances.discard(instance_id)
            if key is not None and key.startswith("instance:"):
                del self._sessions[key]
                await session.close()
        await self._close_idle()

    async def close(self, request_id: str | None = None) -> None:
        """Close one trajectory's sandbox (``agent_data.request_id``), or every sandbox of this
        tool and its connection to the service."""
        await self._close_keys([f"trajectory:{request_id}"] if request_id else list(self._sessions))
        if request_id is None and self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    @property
    def sandboxes(self) -> int:
        """How many sandboxes this tool holds now."""
        return len(self._sessions)

    async def _session(self, key: str) -> _Session:
        if key in self._sessions:
            self._sessions[key].last_used = time.monotonic()  # not idle: a call is about to use it
            return self._sessions[key]
        if key not in self._starting:  # one start per key, however many calls come at once
            self._starting[key] = asyncio.ensure_future(self._start())
        try:
            session = await asyncio.shield(self._starting[key])
        finally:
            self._starting.pop(key, None)
        self._sessions.setdefault(key, session)
        return self._sessions[key]

    async def _start(self) -> _Session:
        opts: dict[str, Any] = {"image": self.image, "ttl_s": self.ttl_s, "memory_mib": self.memory_mib,
                                "network": self.network}
        if self.remote:
            if self._client is None:
                from sandfleet.client import connect
                from sandfleet.client.remote import token_from_env

                self._client = await connect(str(self.remote), token_from_env())
            return _Session(await self._client.create_sandbox(**opts))
        from sandfleet.interpreter import Kernel
        from sandfleet.sandbox import create_sandbox

        sb = await create_sandbox(backend=self.backend, **opts)
        return _Session(sb, Kernel(sb))

    async def _close_idle(self) -> None:
        now = time.monotonic()
        idle = [k for k, s in self._sessions.items()
                if k.startswith("trajectory:") and not s.lock.locked() and now - s.last_used > self.idle_s]
        await self._close_keys(idle)

    async def _close_keys(self, keys: list[str]) -> None:
        gone = [self._sessions.pop(k) for k in keys if k in self._sessions]
        await asyncio.gather(*(s.close() for s in gone), return_exceptions=True)
