"""Sandboxes owned by a holder process (:mod:`sandfleet.sandbox.holder`), driven from this one.

A sandbox lives as long as the process that made it (its launcher dies with its parent). One
that must outlive this process (``sandfleet replay --stop-before verifier`` leaves its sandbox
for a person to look into) is made by a holder instead, exactly as ``sandfleet sandbox create``
makes one: listed by ``sandbox ls``, reached by ``sandbox exec``, gone at its TTL or on
``sandbox rm``. This process drives it through the holder's ``op: rt`` calls, one guest-agent
call per request: :class:`HeldSandbox` is the whole Sandbox contract over them (sessions,
uploads and downloads are the shared code of :class:`~sandfleet.sandbox.base.AgentSandbox`).

Inside :func:`sandfleet.sandbox.use_backend` (``HeldBackend()``), every sandbox made is held.
Its ``close()`` closes it; :meth:`HeldSandbox.release` leaves it to its holder.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any

from sandfleet.agent.client import ExecResult, OutputCallback
from sandfleet.errors import ConfigError, ProtocolError, SandboxDiedError, from_wire
from sandfleet.sandbox import holder
from sandfleet.sandbox.base import AgentSandbox, Sandbox, Snapshot
from sandfleet.sandbox.spec import SandboxSpec

GRACE_S = 15.0
"""How much longer than a command's timeout its reply may take."""


class HolderRuntime:
    """The :class:`~sandfleet.agent.runtime.Runtime` of a held sandbox: each call a request
    to its holder's socket."""

    def __init__(self, sid: str, socket: str):
        self.sid = sid
        self.socket = socket
        self._dead: BaseException | None = None

    @property
    def alive(self) -> bool:
        return self._dead is None

    @property
    def error(self) -> BaseException | None:
        return self._dead

    async def _call(self, call: str, args: dict[str, Any], timeout: float | None) -> Any:
        req = {"op": "rt", "call": call, "args": {k: v for k, v in args.items() if v is not None}}
        try:
            resp = await asyncio.to_thread(holder.call, self.socket, req, timeout)
        except holder.FrameError as e:
            raise ProtocolError(f"held sandbox {self.sid}: {e}") from None
        except (OSError, TimeoutError) as e:  # the holder is gone (TTL, sandbox rm) or hung
            self._dead = SandboxDiedError(f"held sandbox {self.sid}: its holder can't be reached ({e})")
            raise self._dead from None
        if not resp.get("ok"):
            body: dict[str, object] = {"code": resp.get("code") or "error", "message": resp.get("error") or "failed"}
            body.update((k, resp[k]) for k in ("guest_type", "errno") if k in resp)
            raise from_wire(int(resp.get("status") or 500), body)
        return resp.get("result")

    async def exec(self, argv: Sequence[str], **opts: Any) -> ExecResult:
        """Run argv in the held sandbox (the options of
        :class:`~sandfleet.agent.client.RunOptions`; ``on_output`` gets the whole output at the end)."""
        on_output: OutputCallback | None = opts.pop("on_output", None)
        stdin = opts.pop("stdin", None)
        timeout = opts.get("timeout")
        if opts.get("network") is True:
            opts.pop("network")
        if opts.get("pid_namespace") is False:
            opts.pop("pid_namespace")
        r = await self._call("exec", {"argv": list(argv), **opts,
                                      "stdin_b64": base64.b64encode(stdin).decode() if stdin else None},
                             None if timeout is None else timeout + GRACE_S)
        out = base64.b64decode(r.get("stdout_b64") or "")
        res = ExecResult(exit_code=int(r["exit_code"]), stdout=str(r["stdout"]), stderr=str(r["stderr"]),
                         duration_s=float(r.get("duration_s") or 0.0), timed_out=bool(r.get("timed_out")),
                         signal=r.get("signal"), stdout_dropped=int(r.get("stdout_dropped") or 0),
                         stderr_dropped=int(r.get("stderr_dropped") or 0), stdout_bytes=out,
                         detached=int(r.get("detached") or 0))
        if on_output is not None:  # not streamed: the whole output once the command ends
            for stream, data in (("stdout", out), ("stderr", res.stderr.encode())):
                if data:
                    on_output(stream, data)
        return res

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20, user: str | int | None = None,
                        nofollow: bool = False) -> bytes:
        r = await self._call("read_file", {"path": path, "max_bytes": max_bytes, "user": user,
                                           "nofollow": nofollow or None}, 120)
        return base64.b64decode(r["data_b64"])

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644, user: str | int | None = None) -> None:
        await self._call("write_file", {"path": path, "data_b64": base64.b64encode(data).decode(), "mode": mode,
                                        "user": user}, 120)

    async def kill_user(self, user: str | int) -> None:
        await self._call("kill_user", {"user": user}, 120)

    async def kill_everyone(self) -> bool:
        """Not a call of the holder's (RT_CALLS): False, and the caller kills user by user."""
        return False

    async def close(self) -> None:
        """Nothing per call to close: each request is a connection of its own."""


class HeldSandbox(AgentSandbox):
    """A sandbox kept by a holder process; the Sandbox contract, as local ones."""

    def __init__(self, sid: str, spec: SandboxSpec, socket: str, backend: str):
        self.runtime = HolderRuntime(sid, socket)
        super().__init__(sid, spec, self.runtime)
        self.backend = backend
        self.socket = socket

    def release(self) -> None:
        """Leave the sandbox to its holder (until its TTL, or ``sandfleet sandbox rm``)."""
        self._closed = True

    async def close(self) -> None:
        """Close the sandbox: its holder closes it and exits."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.to_thread(holder.call, self.socket, {"op": "close"}, 30)
        except (OSError, TimeoutError, holder.FrameError):
            pass  # the holder is gone already (its TTL passed)
        self.runtime._dead = SandboxDiedError(f"sandbox {self.id} is closed")


class HeldBackend:
    """A Backend whose sandboxes are made by holder processes (:func:`holder.spawn`), each on
    the backend its spec names."""

    name = "held"

    async def create(self, spec: SandboxSpec) -> Sandbox:
        from sandfleet.sandbox import resolve_backend

        backend = resolve_backend(spec.backend)
        made = await asyncio.to_thread(holder.spawn, spec.model_copy(update={"backend": backend}))
        return HeldSandbox(str(made["id"]), spec, str(made["socket"]), backend)

    async def fork(self, snapshot: Snapshot, n: int) -> list[Sandbox]:
        raise ConfigError("held sandboxes are made from an image, not forked from a snapshot")
