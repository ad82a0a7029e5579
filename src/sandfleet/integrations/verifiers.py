"""verifiers (0.4, ``verifiers.v1``): a sandfleet sandbox as a verifiers ``Runtime``.

    from sandfleet.integrations.verifiers import SandfleetRuntime
    runtime = SandfleetRuntime(image="host")              # or remote="http://host:8765", token=...
    await runtime.start()
    await task.score(trace, runtime=runtime)             # the task's @vf.reward(runtime) run here
    await runtime.stop()

A verifiers task's rewards and metrics that take a ``runtime`` run their programs in it; this
one is a sandfleet sandbox (locally, or on a ``sandfleet serve`` with ``remote``/``token``),
with sandfleet's limits (no network unless ``network=True``). ``run`` is ``exec`` (argv, the
runtime's env, as ``with_user``'s user where set), ``_read``/``write`` are ``read_file`` and
``write_file`` (parents made); a relative path is under the sandbox's workdir. verifiers picks
a runtime class by its config ``type`` from a closed table, so this one is passed as an object
(``task.score(trace, runtime=...)``, ``Agent.run(..., runtime=...)``), not named in a config.

``SandfleetRuntime`` subclasses verifiers' ``Runtime``; it is made on first access, so this
module imports without verifiers installed.
"""

from __future__ import annotations

import posixpath
from typing import Any

_runtime_class: type | None = None


def __getattr__(name: str) -> Any:
    """``SandfleetRuntime`` is made (verifiers imported) on first access."""
    global _runtime_class
    if name != "SandfleetRuntime":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _runtime_class is None:
        _runtime_class = _make_runtime_class()
    return _runtime_class


def _make_runtime_class() -> type:
    try:
        from typing import Literal

        from verifiers.v1.errors import SandboxError
        from verifiers.v1.runtimes.base import BaseRuntimeInfo, ProgramResult, Runtime
    except ImportError as e:
        raise ImportError(f"SandfleetRuntime needs verifiers 0.4 (pip install 'verifiers>=0.4,<0.5'): {e}") from e

    from sandfleet.errors import SandfleetError
    from sandfleet.sandbox.base import Sandbox
    from sandfleet.sandbox.spec import Limits, SandboxSpec

    class SandfleetRuntimeInfo(BaseRuntimeInfo):
        type: Literal["sandfleet"] = "sandfleet"
        image: str = "host"
        backend: str = "auto"
        remote: str | None = None
        workdir: str = "/work"

    class SandfleetRuntime(Runtime):
        supports_user = True

        def __init__(self, *, image: str = "host", backend: str = "auto", workdir: str = "/work",
                     network: bool = False, memory_mib: int = 1024, remote: str | None = None,
                     token: str | None = None, name: str | None = None) -> None:
            super().__init__(name)
            self.spec = SandboxSpec(image=image, backend=backend, workdir=workdir,
                                    limits=Limits(network=network, memory_mib=memory_mib))
            self.remote, self._token = remote, token
            self.config = self.info = SandfleetRuntimeInfo(image=image, backend=backend, remote=remote,
                                                           workdir=workdir)
            self.sandbox: Sandbox | None = None
            self._client: Any = None

        async def start(self) -> None:
            try:
                if self.remote is not None:
                    from sandfleet.client import connect

                    self._client = await connect(self.remote, self._token or "")
                    self.sandbox = await self._client.create_sandbox(self.spec)
                else:
                    from sandfleet.sandbox import create_sandbox

                    self.sandbox = await create_sandbox(self.spec)
            except SandfleetError as e:
                raise SandboxError(f"sandfleet sandbox could not be made: {e}") from e
            self.info.id = self.sandbox.id

        def _sb(self) -> Sandbox:
            if self.sandbox is None:
                raise SandboxError("the sandfleet runtime is not started")
            return self.sandbox

        def _path(self, path: str) -> str:
            return posixpath.join(self.spec.workdir, path)

        async def run(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
            try:
                res = await self._sb().exec(list(argv), env=self.process_env(env), user=self.user)
            except SandfleetError as e:
                raise SandboxError(f"sandfleet exec {argv[:1]}: {e}") from e
            return ProgramResult(exit_code=res.exit_code, stdout=res.stdout, stderr=res.stderr)

        async def _read(self, path: str, max_bytes: int | None = None) -> bytes:
            try:
                return await self._sb().read_file(self._path(path), user=self.user, max_bytes=max_bytes)
            except SandfleetError as e:
                raise SandboxError(f"read {path!r}: {e}") from e

        async def write(self, path: str, data: bytes) -> None:
            target = self._path(path)
            try:
                await self._sb().exec(["mkdir", "-p", "--", posixpath.dirname(target)], user=self.user)
                await self._sb().write_file(target, data, user=self.user)
            except SandfleetError as e:
                raise SandboxError(f"write {path!r}: {e}") from e

        async def teardown(self) -> None:
            sb, client, self.sandbox, self._client = self.sandbox, self._client, None, None
            try:
                if sb is not None:
                    await sb.close()
            finally:
                if client is not None:
                    await client.aclose()

    return SandfleetRuntime
