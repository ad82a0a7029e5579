"""A detached owner for sandboxes made by ``sandfleet sandbox create``.

The holder creates the sandbox, owns it (its marker names the holder), and serves
line-delimited JSON on ``<state>/<id>/ctl.sock`` for ``sandbox exec`` and ``sandbox rm``.
It exits, closing the sandbox, on ``close``, on SIGTERM/SIGINT, or when the sandbox dies
(for example at its TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from typing import Any

from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.sandbox.state import state_root


async def serve(spec: SandboxSpec, ready_fd: int) -> None:
    sb = await create_sandbox(spec)
    sock = state_root() / sb.id / "ctl.sock"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            req: dict[str, Any] = json.loads(await reader.readline())
            if req.get("op") == "close":
                stop.set()
                resp: dict[str, Any] = {"ok": True}
            else:
                try:
                    res = await sb.exec(req["argv"], timeout=req.get("timeout"), cwd=req.get("cwd"))
                    resp = {"ok": True, "exit_code": res.exit_code, "stdout": res.stdout,
                            "stderr": res.stderr, "timed_out": res.timed_out}
                except Exception as e:
                    resp = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            writer.write(json.dumps(resp).encode() + b"\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=str(sock))
    with open(ready_fd, "w", closefd=True) as ready:
        ready.write(json.dumps({"id": sb.id, "socket": str(sock)}) + "\n")

    async def watch() -> None:
        while sb.alive:
            await asyncio.sleep(0.5)
        stop.set()

    watcher = asyncio.create_task(watch())
    await stop.wait()
    watcher.cancel()
    server.close()
    await sb.close()


def main() -> None:
    spec = SandboxSpec.model_validate_json(sys.argv[1])
    asyncio.run(serve(spec, int(sys.argv[2])))


if __name__ == "__main__":
    main()
