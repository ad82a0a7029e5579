"""A thin synchronous wrapper for scripts: one private event loop per SyncSandbox.

    with SyncSandbox(image="host") as sb:
        print(sb.exec("uname -a").stdout)
"""

from __future__ import annotations

import asyncio
from typing import Any

from sandfleet.agent.client import ExecResult
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import Sandbox


class SyncSandbox:
    def __init__(self, **spec: Any):
        self._runner = asyncio.Runner()
        try:
            self._sb: Sandbox = self._runner.run(create_sandbox(**spec))
        except BaseException:
            self._runner.close()
            raise
        self.id = self._sb.id

    def exec(self, cmd: str | list[str], **kw: Any) -> ExecResult:
        return self._runner.run(self._sb.exec(cmd, **kw))

    def read_file(self, path: str) -> bytes:
        return self._runner.run(self._sb.read_file(path))

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._runner.run(self._sb.write_file(path, data, mode=mode))

    def close(self) -> None:
        try:
            self._runner.run(self._sb.close())
        finally:
            self._runner.close()

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
