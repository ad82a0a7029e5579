"""The runtime seam: what :class:`~sandfleet.sandbox.base.AgentSandbox` asks of whatever
runs its commands and moves its files. Two things are one: the guest agent's client
(:class:`~sandfleet.agent.client.AgentClient`, over the sandbox's own stream) and a
service's :class:`~sandfleet.client.sandbox.RemoteRuntime` (over HTTP). SWE-ReX draws the
same line between a deployment (the sandbox: start, stop, alive) and its runtime."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Unpack

from sandfleet.agent.client import ExecResult, RunOptions


class Runtime(Protocol):
    @property
    def alive(self) -> bool: ...

    @property
    def error(self) -> BaseException | None:
        """Why it is not alive (None while it is)."""

    async def exec(self, argv: Sequence[str], **opts: Unpack[RunOptions]) -> ExecResult: ...

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20, user: str | int | None = None,
                        nofollow: bool = False) -> bytes: ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644, user: str | int | None = None) -> None: ...

    async def kill_user(self, user: str | int) -> None: ...

    async def kill_everyone(self) -> bool:
        """Every process but the guest's own, whatever its uid, and True; False where this
        runtime can't ask it in one request (the caller then kills user by user)."""

    async def close(self) -> None: ...
