"""A detached owner for sandboxes made by ``sandfleet sandbox create``.

The holder creates the sandbox, owns it (its marker names the holder), and serves
``sandbox exec`` and ``sandbox rm`` on ``<state>/<id>/ctl.sock``: one request and one reply
per connection, each a frame -- a 4-byte big-endian length, then that many bytes of a JSON
object. A request is at most :data:`MAX_REQUEST` bytes and must arrive whole within
:data:`REQUEST_TIMEOUT_S`; a reply is at most :data:`MAX_REPLY`. A frame that is too large,
truncated, late, or not a valid request gets an error reply (``{"ok": false, "error":
"..."}``, saying what was wrong) and the connection is closed.

Requests: ``{"op": "exec", "argv": [...], "timeout": s|null, "cwd": path|null}`` (``op``
may be left out) answers ``{"ok": true, "exit_code", "stdout", "stderr", "timed_out",
"truncated"}``; ``{"op": "close"}`` answers ``{"ok": true}`` and ends the holder.
``{"op": "rt", "call": "exec"|"read_file"|"write_file"|"kill_user", "args": {...}}`` is one
call of the sandbox's runtime (:class:`~sandfleet.agent.runtime.Runtime`; bytes as base64):
how :mod:`sandfleet.sandbox.held` drives a held sandbox from another process (a replay that
leaves its sandbox for a look, docs/replay.md). It answers ``{"ok": true, "result": ...}``,
or ``{"ok": false, "error", "code", "status"}`` with the sandfleet error's wire code.

The holder logs to ``<state>/<id>/holder.log`` (its stderr, once the sandbox exists), never
to the terminal that created it. It exits, closing the sandbox, on ``close``, on
SIGTERM/SIGINT, or when the sandbox dies (for example at its TTL).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import signal
import socket
import struct
import sys
from typing import Any

from sandfleet.sandbox import create_sandbox, spawner
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.sandbox.state import state_root
from sandfleet.settings import child_env

log = logging.getLogger("sandfleet.holder")

HEADER = struct.Struct(">I")
MAX_REQUEST = 1 << 20
"""Largest request body, bytes."""
MAX_REPLY = 16 << 20
"""Largest reply body, bytes (an exec's output is capped at 1 MiB per stream, which fits)."""
REQUEST_TIMEOUT_S = 30.0
"""A request must arrive whole within this long after the connection opens."""
LOG_NAME = "holder.log"


RT_CALLS = {"exec": {"argv", "env", "cwd", "stdin_b64", "timeout", "max_output", "user", "network", "pid_namespace"},
            "read_file": {"path", "max_bytes", "user", "nofollow"},
            "write_file": {"path", "data_b64", "mode", "user"},
            "kill_user": {"user"}}
"""The runtime calls of ``op: rt``, with the arguments each takes."""


class FrameError(Exception):
    """A frame that is too large, truncated or malformed; the message says which, for the peer."""


def encode_frame(obj: dict[str, Any], limit: int, what: str = "reply") -> bytes:
    body = json.dumps(obj, ensure_ascii=False).encode()
    if len(body) > limit:
        raise FrameError(f"{what} of {len(body)} bytes exceeds the limit of {limit} bytes")
    return HEADER.pack(len(body)) + body


def body_length(header: bytes, limit: int, what: str) -> int:
    """The body length a header announces, checked against ``limit``."""
    (n,) = HEADER.unpack(header)
    if header[:1] in (b"{", b"["):
        raise FrameError(f"malformed {what}: not a framed message (4-byte big-endian length, then JSON); "
                         "line-delimited JSON is from an older sandfleet")
    if n > limit:
        raise FrameError(f"{what} of {n} bytes exceeds the limit of {limit} bytes")
    if n == 0:
        raise FrameError(f"malformed {what}: an empty frame")
    return n


def decode_body(body: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except ValueError as e:  # UnicodeDecodeError is one
        raise FrameError(f"malformed {what}: not JSON ({e})") from None
    if not isinstance(obj, dict):
        raise FrameError(f"malformed {what}: a JSON object is expected, not {type(obj).__name__}")
    return obj


async def read_request(reader: asyncio.StreamReader) -> dict[str, Any]:
    """One request frame, checked (:func:`check_request`); raises :class:`FrameError`."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        raise FrameError(f"truncated request: {len(e.partial)} of {HEADER.size} header bytes") from None
    n = body_length(header, MAX_REQUEST, "request")
    try:
        body = await reader.readexactly(n)
    except asyncio.IncompleteReadError as e:
        raise FrameError(f"truncated request: {len(e.partial)} of {n} body bytes") from None
    return check_request(decode_body(body, "request"))


def check_request(req: dict[str, Any]) -> dict[str, Any]:
    op = req.get("op", "exec")
    if op == "close":
        extra = set(req) - {"op"}
    elif op == "rt":
        extra = set(req) - {"op", "call", "args"}
        if req.get("call") not in RT_CALLS:
            raise FrameError(f"malformed request: unknown runtime call {req.get('call')!r} "
                             f"({', '.join(sorted(RT_CALLS))})")
        if not isinstance(req.get("args"), dict):
            raise FrameError("malformed request: 'args' must be an object")
    elif op == "exec":
        extra = set(req) - {"op", "argv", "timeout", "cwd"}
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise FrameError("malformed request: 'argv' must be a non-empty list of strings")
        timeout = req.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                    or not timeout > 0):
            raise FrameError("malformed request: 'timeout' must be a positive number of seconds or null")
        if req.get("cwd") is not None and not isinstance(req["cwd"], str):
            raise FrameError("malformed request: 'cwd' must be a string or null")
    else:
        raise FrameError(f"malformed request: unknown op {op!r} (exec, rt or close)")
    if extra:
        raise FrameError(f"malformed request: unknown key(s) {', '.join(sorted(map(repr, extra)))}")
    return req


# -- the client side (sandfleet sandbox exec / rm), blocking


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(n - len(data), 1 << 20))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def call(path: str, req: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Send one request to the holder at ``path`` and return its reply; raises
    :class:`FrameError` (a request or reply too large, malformed or cut short) or OSError."""
    frame = encode_frame(req, MAX_REQUEST, "request")
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(path)
        try:
            s.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):  # the holder refused and closed: its reply says why
            pass
        try:
            header = _recv_exactly(s, HEADER.size)
        except ConnectionResetError:
            raise FrameError("the holder reset the connection without a reply") from None
        if not header:
            raise FrameError("the holder closed the connection without a reply")
        if len(header) < HEADER.size:
            raise FrameError(f"truncated reply: {len(header)} of {HEADER.size} header bytes")
        n = body_length(header, MAX_REPLY, "reply")
        body = _recv_exactly(s, n)
        if len(body) < n:
            raise FrameError(f"truncated reply: {len(body)} of {n} body bytes")
    return decode_body(body, "reply")


# -- the holder

DISCARD_S = 2.0
"""How long a refused peer may go on sending before the connection is closed."""


async def _let_finish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After an error reply: end our side and throw away what the peer still sends (for at
    most :data:`DISCARD_S`), so that closing does not reset the connection under a peer that
    is still writing its (refused) request before it reads the reply."""
    if writer.can_write_eof():
        writer.write_eof()
    try:
        async with asyncio.timeout(DISCARD_S):
            while await reader.read(1 << 16):
                pass
    except TimeoutError:
        pass



async def runtime_call(sb: Any, call: str, args: dict[str, Any]) -> dict[str, Any]:
    """One call of ``sb``'s runtime for ``op: rt``; its paths are the sandbox's (translated by
    the sandbox as its own calls are), its bytes base64."""
    unknown = set(args) - RT_CALLS[call]
    if unknown:
        return {"ok": False, "error": f"unknown argument(s) of {call}: {', '.join(sorted(unknown))}",
                "code": "invalid", "status": 400}
    try:
        kw = dict(args)
        for key in ("cwd", "path"):
            if kw.get(key) is not None:
                kw[key] = sb._path(str(kw[key]))
        client = sb.client
        if call == "exec":
            stdin = kw.pop("stdin_b64", None)
            res = await client.exec(list(kw.pop("argv")), stdin=base64.b64decode(stdin) if stdin else None, **kw)
            return {"ok": True, "result": {
                "exit_code": res.exit_code, "stdout_b64": base64.b64encode(res.stdout_bytes).decode(),
                "stdout": res.stdout, "stderr": res.stderr, "duration_s": res.duration_s, "timed_out": res.timed_out,
                "signal": res.signal, "stdout_dropped": res.stdout_dropped, "stderr_dropped": res.stderr_dropped,
                "detached": res.detached}}
        if call == "read_file":
            data = await client.read_file(**kw)
            return {"ok": True, "result": {"data_b64": base64.b64encode(data).decode()}}
        if call == "write_file":
            await client.write_file(kw.pop("path"), base64.b64decode(kw.pop("data_b64", "")), **kw)
            return {"ok": True, "result": None}
        await client.kill_user(**kw)
        return {"ok": True, "result": None}
    except Exception as e:
        from sandfleet.errors import to_wire

        wire = to_wire(e)
        if wire is None:
            log.warning("runtime call %s failed: %s: %s", call, type(e).__name__, e)
            return {"ok": False, "error": f"{type(e).__name__}: {e}", "code": "error", "status": 500}
        status, code, extra = wire
        return {"ok": False, "error": str(e), "code": code, "status": status, **extra}


def spawn(spec: SandboxSpec) -> dict[str, Any]:
    """Start a holder for a new sandbox of ``spec`` (a process of its own, in a session of
    its own); returns ``{"id", "socket"}`` once the sandbox exists. Raises SandboxError with
    the holder's last line when the creation fails."""
    import subprocess
    import tempfile

    from sandfleet.errors import SandboxError

    r, w = os.pipe()
    # Until the sandbox exists the holder's stderr is this scratch file (read back if the
    # creation fails); then the holder logs to <state>/<id>/holder.log, never to this terminal.
    with tempfile.TemporaryFile() as early:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sandfleet.sandbox.holder", spec.model_dump_json(), str(w)],
                pass_fds=(w,), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=early, env=child_env(),  # --no-limits, ... reach it
            )
        finally:
            os.close(w)
        with os.fdopen(r) as f:
            line = f.readline()
        if not line:
            proc.wait()
            early.seek(0)
            err = early.read().decode(errors="replace").strip()
            why = err.splitlines()[-1] if err else f"the holder exited with {proc.returncode}"
            raise SandboxError(f"sandbox creation failed: {why}")
    _spawned[:] = [p for p in _spawned if p.poll() is None]  # reap the holders that ended
    _spawned.append(proc)
    out: dict[str, Any] = json.loads(line)
    return out


_spawned: list[Any] = []
"""The holders this process started (subprocess.Popen), kept to be waited for once they end
(they outlive this process freely: each is in a session of its own)."""


def _log_to(path: str) -> None:
    """Send this process's stderr (and so its log) to ``path`` from now on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)


async def serve(spec: SandboxSpec, ready_fd: int) -> None:
    sb = await create_sandbox(spec)
    sdir = state_root() / sb.id
    _log_to(str(sdir / LOG_NAME))
    log.info("holding sandbox %s (pid %d)", sb.id, os.getpid())
    sock = sdir / "ctl.sock"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def answer(reader: asyncio.StreamReader) -> dict[str, Any]:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                req = await read_request(reader)
        except TimeoutError:
            raise FrameError(f"truncated request: not received whole within {REQUEST_TIMEOUT_S:g} s") from None
        if req.get("op") == "close":
            return {"ok": True, "closing": True}
        if req.get("op") == "rt":
            return await runtime_call(sb, req["call"], req["args"])
        try:
            res = await sb.exec(req["argv"], timeout=req.get("timeout"), cwd=req.get("cwd"))
        except Exception as e:
            log.warning("exec %r failed: %s: %s", req["argv"][:1], type(e).__name__, e)
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        return {"ok": True, "exit_code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
                "timed_out": res.timed_out, "truncated": res.truncated}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closing = refused = False
        try:
            try:
                resp = await answer(reader)
            except FrameError as e:
                log.warning("refused a request: %s", e)
                resp, refused = {"ok": False, "error": str(e)}, True
            closing = bool(resp.pop("closing", False))
            try:
                frame = encode_frame(resp, MAX_REPLY)
            except FrameError as e:
                log.warning("refused to send a reply: %s", e)
                frame = encode_frame({"ok": False, "error": str(e)}, MAX_REPLY)
            writer.write(frame)
            await writer.drain()
            if refused:
                await _let_finish(reader, writer)
        except (ConnectionError, OSError) as e:
            log.warning("a client went away: %s: %s", type(e).__name__, e)
        except Exception:
            log.exception("serving a request failed")
        finally:
            writer.close()
            if closing:  # once the reply is on its way
                stop.set()

    server = await asyncio.start_unix_server(handle, path=str(sock))
    with open(ready_fd, "w", closefd=True) as ready:
        ready.write(json.dumps({"id": sb.id, "socket": str(sock)}) + "\n")

    async def watch() -> None:
        while sb.alive:
            await asyncio.sleep(0.5)
        log.info("sandbox %s is gone", sb.id)
        stop.set()

    watcher = asyncio.create_task(watch())
    await stop.wait()
    watcher.cancel()
    server.close()
    await sb.close()
    log.info("closed sandbox %s", sb.id)


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = SandboxSpec.model_validate_json(sys.argv[1])
    spawner.disable()  # one sandbox here: its start does not grow with what this process holds
    asyncio.run(serve(spec, int(sys.argv[2])))


if __name__ == "__main__":
    main()
