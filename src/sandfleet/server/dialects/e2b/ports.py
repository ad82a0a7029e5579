"""``Sandbox.get_host(port)``: a sandbox's port reached through the service, behind a token.

The SDK builds the address as ``f"{port}-{sandbox_id}.{domain}"`` from the ``domain`` that
create returned. sandfleet returns ``domain = ":<traffic token>@<the service's host:port>"``,
so the address is ``<port>-<id>.:<token>@<service>``: in a URL (``http://`` + it) that is
user ``<port>-<id>.`` with password ``<token>`` at the service's own address. No DNS name
is needed, and the credential travels with the address (HTTP clients send URL userinfo as
``Authorization: Basic``). Clients that resolve ``*.localhost`` may also send
``Host: <port>-<id>.localhost`` with the token in ``e2b-traffic-access-token``.

The service answers such a request itself, before any other route: it runs a relay in the
sandbox (bash's ``/dev/tcp`` to 127.0.0.1:<port>, inside the sandbox's own network
namespace, so a sandbox without network still has no egress), writes the request to it
(HTTP/1.1, ``Connection: close``) and streams the response back. Plain HTTP only: a
WebSocket upgrade is refused (501).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import re
from collections.abc import AsyncIterator
from typing import Any

import h11
from starlette.types import Receive, Scope, Send

from sandfleet.agent.client import RunningCommand
from sandfleet.server.dialects.e2b.state import SANDBOX_URL_HINT, Boxes
from sandfleet.server.dialects.e2b.wire import UNSUPPORTED

USER = re.compile(r"^([0-9]{1,5})-([A-Za-z0-9-]+)\.(?:localhost|set-E2B_SANDBOX_URL)?$")  # dialect.SANDBOX_URL_HINT
HOST = re.compile(r"^([0-9]{1,5})-([A-Za-z0-9-]+)\.([A-Za-z0-9_.-]+?)\.?(?::[0-9]+)?$")
HINT_LABEL = SANDBOX_URL_HINT.lower() + "."
ENVD_PORTS = (49983, 49999)
"""envd's and the code interpreter's ports: a host-name request for them is the service's own
(its envd and interpreter routes), which the SDK reaches so when E2B_SANDBOX_URL is not set."""
RELAY = 'exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 7; cat <&3 & cat >&3; wait'
HOP = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"te", b"trailer",
       b"host", b"authorization", b"e2b-traffic-access-token", b"content-length"}
TIMEOUT_S = 300.0


def target(scope: Scope, domain: str = "auto") -> tuple[int, str, str, bool] | None:
    """(port, sandbox id, token, by host name) when the request is for a sandbox's port, else
    None. By URL userinfo (the token always there), or by the Host header
    ``<port>-<id>.[set-E2B_SANDBOX_URL.]<localhost or --domain>[:port]`` with the token, if
    any, in ``e2b-traffic-access-token``."""
    headers = dict(scope.get("headers") or [])
    auth = headers.get(b"authorization", b"")
    if auth[:6].lower() == b"basic ":
        with contextlib.suppress(binascii.Error, UnicodeDecodeError, ValueError):
            user, _, token = base64.b64decode(auth[6:].strip()).decode().partition(":")
            m = USER.match(user)
            if m:
                return int(m[1]), m[2], token, False
    m = HOST.match(headers.get(b"host", b"").decode("latin-1"))
    if m:
        rest = m[3].lower()
        rest = rest[len(HINT_LABEL):] if rest.startswith(HINT_LABEL) else rest
        if rest == "localhost" or (domain not in ("auto", "localhost", "userinfo") and rest == domain.lower()):
            return int(m[1]), m[2], headers.get(b"e2b-traffic-access-token", b"").decode("latin-1"), True
    return None


async def _answer(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class PortProxy:
    """Pure ASGI: requests for ``<port>-<sandbox>`` go to that port in the sandbox."""

    def __init__(self, app: Any, e2b: Boxes):
        self.app = app
        self.e2b = e2b

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t = target(scope, self.e2b.service.config.e2b_domain) if scope["type"] == "http" else None
        if t is None:
            await self.app(scope, receive, send)
            return
        port, sid, token, by_name = t
        if by_name and port in ENVD_PORTS:  # envd or the interpreter by host name: the service's own routes
            headers = list(scope.get("headers") or [])
            if not any(k.lower() == b"e2b-sandbox-id" for k, _ in headers):
                headers.append((b"e2b-sandbox-id", sid.encode()))
            await self.app({**scope, "headers": headers}, receive, send)
            return
        sid = self.e2b.real(sid)
        e = self.e2b.service.live.get(sid)
        b = self.e2b.boxes.get(sid)
        if e is None or b is None or not e.sb.alive:
            await _answer(send, 502, f"The sandbox {sid} was not found")
            return
        public = by_name and not token and b.public  # E2B's allowPublicTraffic: a host name without a token
        if not public and (not token or not hmac.compare_digest(token.encode(), b.traffic_token.encode())):
            await _answer(send, 401, f"a valid traffic token of sandbox {sid} is needed for its port {port} "
                                     "(header e2b-traffic-access-token)")
            return
        if not 0 < port < 65536:
            await _answer(send, 400, f"{port} is not a port")
            return
        headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() not in HOP]
        if any(k.lower() == b"upgrade" for k, _ in scope.get("headers") or []):
            await _answer(send, 501, f"WebSocket and other upgrades to a sandbox port are {UNSUPPORTED}")
            return
        body = bytearray()
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        await self._relay(scope, send, e, port, headers, bytes(body))

    async def _relay(self, scope: Scope, send: Send, e: Any, port: int, headers: list[tuple[bytes, bytes]],
                     body: bytes) -> None:
        conn = h11.Connection(h11.CLIENT)
        path = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            path += b"?" + scope["query_string"]
        req = conn.send(h11.Request(method=scope["method"], target=path, headers=[
            (b"host", f"127.0.0.1:{port}".encode()), (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()), *headers]))
        data = (req or b"") + (conn.send(h11.Data(data=body)) or b"" if body else b"") + (
            conn.send(h11.EndOfMessage()) or b"")
        q: asyncio.Queue[bytes | None] = asyncio.Queue()
        handle: dict[str, RunningCommand] = {}

        def on_start(h: RunningCommand) -> None:
            h.send_stdin(data)
            handle["h"] = h

        def on_output(name: str, chunk: bytes) -> None:
            if name == "stdout":
                q.put_nowait(chunk)

        async def run() -> None:
            try:
                res = await e.sb.exec(["bash", "-c", RELAY, "relay", str(port)], cwd="/", stdin=True, max_output=0,
                                      on_start=on_start, on_output=on_output, timeout=TIMEOUT_S)
                if res.exit_code == 7:
                    q.put_nowait(b"\0refused")
            finally:
                q.put_nowait(None)

        task = asyncio.create_task(run())
        started = False
        try:
            async for ev in self._events(conn, q):
                if isinstance(ev, bytes):
                    if not started:
                        await _answer(send, 502, f"nothing answers on port {port} in sandbox {e.sb.id}: {ev.decode()}")
                    return
                if isinstance(ev, h11.Response):
                    started = True
                    hs = [(k, v) for k, v in ev.headers if k.lower() not in (b"connection", b"transfer-encoding",
                                                                             b"keep-alive")]
                    await send({"type": "http.response.start", "status": ev.status_code, "headers": hs})
                elif isinstance(ev, h11.Data):
                    await send({"type": "http.response.body", "body": bytes(ev.data), "more_body": True})
                elif isinstance(ev, h11.EndOfMessage):
                    break
            if "h" in handle:
                handle["h"].close_stdin()
            if started:
                await send({"type": "http.response.body", "body": b""})
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task

    @staticmethod
    async def _events(conn: h11.Connection, q: asyncio.Queue[bytes | None]) -> AsyncIterator[Any]:
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA:
                chunk = await q.get()
                if chunk is None:
                    conn.receive_data(b"")
                    if conn.their_state is h11.SEND_RESPONSE:
                        yield b"the connection closed before a response"
                        return
                elif chunk == b"\0refused":
                    yield b"connection refused"
                    return
                else:
                    conn.receive_data(chunk)
                continue
            if ev is h11.PAUSED or isinstance(ev, h11.ConnectionClosed):
                return
            yield ev
            if isinstance(ev, h11.EndOfMessage):
                return
