"""A minimal asyncio client for the QEMU Machine Protocol (QMP) over a unix socket."""

from __future__ import annotations

import array
import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from sandfleet.errors import SandboxDiedError, SandboxError


class QmpError(SandboxError):
    """QEMU answered a QMP command with an error."""


class Qmp:
    """One QMP connection: :meth:`connect`, then :meth:`execute` commands one at a time."""

    def __init__(self, sock: socket.socket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._sock = sock
        self._reader = reader
        self._writer = writer
        self._lock = asyncio.Lock()
        #: events QEMU sent while we waited for answers, oldest first
        self.events: list[dict[str, Any]] = []

    @classmethod
    async def connect(cls, path: Path) -> Qmp:
        """Connect to QEMU's ``-qmp unix:PATH,server=on`` socket and negotiate capabilities."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, str(path))
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=2**20)
        except OSError as exc:
            sock.close()
            raise SandboxDiedError(f"can't reach QEMU's QMP socket {path}: {exc}") from exc
        qmp = cls(sock, reader, writer)
        try:
            await qmp._read()  # greeting
            await qmp.execute("qmp_capabilities")
        except BaseException:  # QEMU went away mid-greeting: close our end now, not at GC
            writer.close()
            raise
        return qmp

    async def _read(self) -> dict[str, Any]:
        try:
            line = await self._reader.readline()
        except (ConnectionError, OSError):
            line = b""
        if not line:
            raise SandboxDiedError("QEMU closed its QMP socket (the VM exited)")
        msg: dict[str, Any] = json.loads(line)
        return msg

    async def execute(self, command: str, *, fd: int | None = None, **arguments: Any) -> Any:
        """Run ``command`` and return its ``return`` value; :class:`QmpError` on error.

        ``fd`` is sent along with the command (SCM_RIGHTS), as ``getfd`` wants.
        """
        request: dict[str, Any] = {"execute": command}
        if arguments:
            request["arguments"] = arguments
        data = json.dumps(request).encode() + b"\n"
        async with self._lock:
            try:
                if fd is None:
                    self._writer.write(data)
                    await self._writer.drain()
                else:  # the transport's buffer is empty (drained under the lock): send directly
                    fds = array.array("i", [fd])
                    self._sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            except (ConnectionError, OSError) as exc:
                raise SandboxDiedError(f"QMP {command}: QEMU is gone ({exc})") from exc
            while True:
                msg = await self._read()
                if "event" in msg:
                    self.events.append(msg)
                elif "error" in msg:
                    err = msg["error"]
                    raise QmpError(f"QMP {command}: {err.get('class')}: {err.get('desc')}")
                elif "return" in msg:
                    return msg["return"]

    async def wait_event(self, name: str) -> dict[str, Any]:
        """Wait for the next event called ``name`` (or take it from :attr:`events`)."""
        async with self._lock:
            while True:
                for i, event in enumerate(self.events):
                    if event["event"] == name:
                        return self.events.pop(i)
                self.events.append(await self._read())

    async def close(self) -> None:
        """Close the connection (QEMU keeps running)."""
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass
