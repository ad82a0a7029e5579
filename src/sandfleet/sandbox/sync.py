"""A synchronous wrapper for scripts: one private event loop per SyncSandbox.

    with SyncSandbox(image="host") as sb:
        print(sb.exec("uname -a").stdout)

Every method of the :class:`~sandfleet.sandbox.base.Sandbox` contract is here, with the same
parameters, blocking until the sandbox's coroutine is done (tests/test_sandbox_sync.py checks
that none is missing). Callbacks (``on_output``, ``on_start``) run on the private loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Unpack

from sandfleet.agent.client import ExecResult, OutputCallback, StartCallback
from sandfleet.errors import SandboxClosedError
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import DEFAULT_MAX_OUTPUT, ExecOptions, Sandbox, Session, Snapshot
from sandfleet.sandbox.spec import SandboxSpec

T = TypeVar("T")


class SyncSession:
    """A :class:`~sandfleet.sandbox.base.Session` driven from synchronous code."""

    def __init__(self, session: Session, run: Callable[[Coroutine[Any, Any, Any]], Any]):
        self._session = session
        self._run = run

    @property
    def usable(self) -> bool:
        return self._session.usable

    def run(self, command: str, *, timeout: float | None = None, max_output: int = DEFAULT_MAX_OUTPUT,
            on_output: OutputCallback | None = None, on_start: StartCallback | None = None,
            pty: tuple[int, int] | None = None) -> ExecResult:
        return self._run(self._session.run(command, timeout=timeout, max_output=max_output,
                                                  on_output=on_output, on_start=on_start, pty=pty))

    def close(self) -> None:
        self._run(self._session.close())


class SyncSandbox:
    """A sandbox made from a :class:`SandboxSpec` (``spec=``) or its keyword fields, as
    :func:`sandfleet.sandbox.create_sandbox` takes them. After :meth:`close`, every method but
    ``close`` raises SandboxClosedError."""

    id: str
    backend: str
    spec: SandboxSpec

    def __init__(self, spec: SandboxSpec | None = None, **fields: Any):
        self._runner = asyncio.Runner()
        self._users = [1]  # the sandboxes on this loop (a branch's children share it): closed by the last
        self._closed = False
        try:
            self._sb: Sandbox = self._runner.run(create_sandbox(spec, **fields))
        except BaseException:
            self._runner.close()
            raise
        self.id = self._sb.id
        self.backend = self._sb.backend
        self.spec = self._sb.spec

    @classmethod
    def _on(cls, sb: Sandbox, parent: SyncSandbox) -> SyncSandbox:
        """``sb`` (made on ``parent``'s loop) driven through that loop."""
        self = object.__new__(cls)
        self._runner, self._users, self._closed, self._sb = parent._runner, parent._users, False, sb
        self._users[0] += 1
        self.id, self.backend, self.spec = sb.id, sb.backend, sb.spec
        return self

    @property
    def branch_info(self) -> Any:
        """What this sandbox was branched from (:class:`~sandfleet.sandbox.branching.BranchInfo`), or None."""
        return getattr(self._sb, "branch_info", None)

    def branch(self, n: int, *, processes: Literal["error", "drop"] = "error") -> list[SyncSandbox]:
        """``n`` sandboxes that continue from this one's state now (:meth:`Sandbox.branch`); they
        share this one's loop, which stays open until the last of them closes. Their sessions:
        ``child.branch_info.sessions`` (async ones: :meth:`sessions` wraps them)."""
        return [SyncSandbox._on(c, self) for c in self._run(self._sb.branch(n, processes=processes))]

    def sessions(self) -> list[SyncSession]:
        """The open sessions (a branch's child: the source's, continued)."""
        return [SyncSession(s, self._run) for s in getattr(self._sb, "sessions", [])]

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise SandboxClosedError(f"sandbox {self.id} is closed")
        return self._runner.run(coro)

    @property
    def alive(self) -> bool:
        return self._sb.alive

    def exec(self, cmd: str | Sequence[str], **opts: Unpack[ExecOptions]) -> ExecResult:
        return self._run(self._sb.exec(cmd, **opts))

    def read_file(self, path: str, *, user: str | int | None = None, max_bytes: int | None = None,
                  nofollow: bool = False) -> bytes:
        return self._run(self._sb.read_file(path, user=user, max_bytes=max_bytes, nofollow=nofollow))

    def write_file(self, path: str, data: bytes | str, *, mode: int = 0o644, user: str | int | None = None) -> None:
        self._run(self._sb.write_file(path, data, mode=mode, user=user))

    def upload(self, local: str | Path, remote_dir: str, *, user: str | int | None = None) -> None:
        self._run(self._sb.upload(local, remote_dir, user=user))

    def kill_user(self, user: str | int) -> None:
        self._run(self._sb.kill_user(user))

    def kill_everyone(self) -> bool:
        return self._run(self._sb.kill_everyone())

    def download(self, remote: str, local_dir: str | Path, *, max_bytes: int = 256 << 20) -> Path:
        return self._run(self._sb.download(remote, local_dir, max_bytes=max_bytes))

    def session(self, *, cwd: str | None = None, env: dict[str, str] | None = None,
                user: str | int | None = None) -> SyncSession:
        return SyncSession(self._sb.session(cwd=cwd, env=env, user=user), self._run)

    def snapshot(self) -> Snapshot:
        """The sandbox's state now; :func:`sandfleet.sandbox.fork` starts sandboxes from it
        (from async code), and ``snapshot.delete()`` removes it."""
        return self._run(self._sb.snapshot())

    def close(self) -> None:
        """Close the sandbox and the private loop; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._runner.run(self._sb.close())
        finally:
            self._users[0] -= 1
            if self._users[0] <= 0:
                self._runner.close()

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
