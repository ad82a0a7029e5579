"""The client's default httpx transport: HTTP/1.1 with keep-alive on asyncio protocols.

httpx's own transport (httpcore, h11 and anyio) spends about 1.6 ms of CPU per request
(measured per exec round trip on the development VM, 1.8 ms against 0.2 ms for the same
request written and parsed on an asyncio protocol), most of an exec round trip's cost over
loopback. This transport keeps httpx's client (``httpx.AsyncClient``: URLs, headers, auth,
timeouts, errors, response decoding) and replaces only the wire: a request leaves in one
write (head and body together, so the service wakes once per request), the response is
parsed as it arrives in the protocol's callback, by llhttp through httptools (the parser
uvicorn uses: 0.75-1.00x the CPU of the hand-written parser it replaced for an exec's
response, 0.24-0.37x for a chunked stream; docs/service.md), and a small response is
handed over in one piece.

It speaks HTTP/1.1 to one origin per connection, plain or TLS (the ssl context httpx builds
from ``verify``); the response's framing is Content-Length, chunked or until close.
Proxies are httpx's business: they are mounted beside this transport from the environment
as usual. A response not read to its end, or a request cancelled, closes its connection
(the service sees the hang-up and kills the command).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httptools
import httpx

READ_HIGH = 1 << 20
"""Unread response bytes at which the connection stops reading from the socket."""
NO_BODY_STATUS = frozenset((204, 304))


class _Conn(asyncio.Protocol):
    """One HTTP/1.1 connection: a response parser fed by ``data_received``."""

    def __init__(self, key: tuple[str, str, int]):
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.error: BaseException | None = None
        self._state = 0  # 0 idle, 1 head, 2 length body, 3 chunked body, 4 body to EOF, 5 done
        self._parser = httptools.HttpResponseParser(self)
        self._reason = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._length: int | None = None
        self._chunked_body = False
        self._interim = False
        self._extra = False
        self._head_bytes = 0
        self._head_only = False
        self._head: asyncio.Future[tuple[int, bytes, list[tuple[bytes, bytes]], bool]] | None = None
        self._chunks: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._wake: asyncio.Future[None] | None = None
        self._paused_reading = False
        self._can_write: asyncio.Future[None] | None = None
        self.keep_alive = True

    # -- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._state == 4 and exc is None:  # a body that ends with the connection
            self._state = 5
            self._notify()
            return
        if self._state != 0 and self._state != 5:
            self._fail(exc or ConnectionResetError("the server closed the connection"))
        if self._can_write is not None and not self._can_write.done():
            self._can_write.set_exception(exc or ConnectionResetError("the server closed the connection"))

    def eof_received(self) -> bool:
        self.keep_alive = False
        return False  # close the transport: connection_lost follows

    def pause_writing(self) -> None:
        if self._can_write is None:
            self._can_write = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        w, self._can_write = self._can_write, None
        if w is not None and not w.done():
            w.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._state == 0:  # nothing asked: a server speaking out of turn
            self.keep_alive = False
            self._fail(httpx.RemoteProtocolError("the server sent data without a request"))
            self.close()
            return
        if self._state == 5:  # bytes past the end of the response
            self.keep_alive = False
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            cause = e.__cause__ or e.__context__
            err = cause if isinstance(cause, httpx.RemoteProtocolError) else \
                httpx.RemoteProtocolError(f"malformed response: {e}")
            self.keep_alive = False
            self._fail(err)
            self.close()
        else:
            if self._state == 1 and self._head_bytes > 1 << 16:
                self.keep_alive = False
                self._fail(httpx.RemoteProtocolError("the response head is over 64 KiB"))
                self.close()

    # -- parsing: llhttp (httptools) calls these from feed_data

    def on_message_begin(self) -> None:
        if self._state == 5:  # a second response to one request: not ours, nor the next one's
            self.keep_alive = False
            self._extra = True
            return
        self._reason = b""
        self._headers = []
        self._length = None
        self._chunked_body = False
        self._head_bytes = 0

    def on_status(self, status: bytes) -> None:
        if self._extra:
            return
        self._reason += status
        self._head_bytes += len(status)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._extra:
            return
        self._head_bytes += len(name) + len(value) + 4
        self._headers.append((name, value))
        low = name.lower()
        if low == b"content-length":
            self._length = int(value)  # (llhttp refused anything else)
        elif low == b"transfer-encoding":
            if value.lower().rsplit(b",", 1)[-1].strip() != b"chunked":
                raise httpx.RemoteProtocolError(f"unsupported Transfer-Encoding {value[:40]!r}")
            self._chunked_body = True

    def on_headers_complete(self) -> None:
        if self._extra:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise httpx.RemoteProtocolError("the server switched protocols, which this client does not speak")
            self._interim = True
            return  # the real head follows
        self._interim = False
        if not self._parser.should_keep_alive():
            self.keep_alive = False
        if self._head_only or status in NO_BODY_STATUS:
            self._state = 5
        elif self._chunked_body:
            self._state = 3
        elif self._length is not None:
            self._state = 2 if self._length else 5
        else:
            self._state = 4
            self.keep_alive = False
        fut = self._head
        if fut is not None and not fut.done():
            fut.set_result((status, self._reason, self._headers, self._state == 5))

    def on_body(self, body: bytes) -> None:
        if self._extra:
            return
        if self._state in (2, 3, 4):
            self._push(body)

    def on_message_complete(self) -> None:
        if self._extra:
            return
        if self._interim:
            self._interim = False
            return
        if self._state != 5:
            self._state = 5
            self._notify()

    # -- body hand-over

    def _push(self, chunk: bytes) -> None:
        if not chunk:
            return
        self._chunks.append(chunk)
        self._queued += len(chunk)
        if self._queued >= READ_HIGH and not self._paused_reading and self.transport is not None:
            self._paused_reading = True
            self.transport.pause_reading()
        self._notify()

    def _notify(self) -> None:
        w, self._wake = self._wake, None
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc)
        self._notify()

    async def body(self, read_timeout: float | None) -> AsyncIterator[bytes]:
        """The response body as it arrives; raises the connection's failure, or
        TimeoutError when nothing came for ``read_timeout`` seconds."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._queued -= len(chunk)
                if self._paused_reading and self._queued < READ_HIGH // 4 and self.transport is not None:
                    self._paused_reading = False
                    self.transport.resume_reading()
                yield chunk
                continue
            if self._state == 5:
                return
            if self.error is not None:
                raise self.error
            self._wake = asyncio.get_running_loop().create_future()
            async with asyncio.timeout(read_timeout):
                await self._wake

    @property
    def finished(self) -> bool:
        return self._state == 5 and not self._chunks

    # -- requests

    def start(self, data: bytes, head_only: bool) -> asyncio.Future[tuple[int, bytes, list[tuple[bytes, bytes]], bool]]:
        assert self.transport is not None
        # a parser per request: llhttp would wait for a HEAD's Content-Length of body, and a
        # response cut short must not carry over (one C object: ~0.3 us)
        self._parser = httptools.HttpResponseParser(self)
        self._extra = False
        self._state = 1
        self._head_only = head_only
        self._head = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._head

    async def write(self, data: bytes) -> None:
        assert self.transport is not None
        if self.error is not None:
            raise self.error
        self.transport.write(data)
        if self._can_write is not None:
            await self._can_write

    def reusable(self) -> bool:
        return not self.closed and self.keep_alive and self.error is None and self.finished

    def usable(self) -> bool:
        """Still fit for a new request (an idle connection the server may have closed since)."""
        return not self.closed and self.keep_alive and self.error is None

    def reset(self) -> None:
        self._state = 0
        self._head = None
        self._chunks.clear()
        self._queued = 0

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()


class _Body(httpx.AsyncByteStream):
    def __init__(self, transport: FastTransport, conn: _Conn, request: httpx.Request, read_timeout: float | None):
        self._transport = transport
        self._conn = conn
        self._request = request
        self._read_timeout = read_timeout
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._conn.body(self._read_timeout):
                yield chunk
        except TimeoutError:
            await self.aclose()
            raise httpx.ReadTimeout("no more of the response in time", request=self._request) from None
        except (OSError, httpx.RemoteProtocolError) as e:
            await self.aclose()
            raise _read_error(e, self._request) from None
        except BaseException:
            await self.aclose()
            raise
        await self.aclose()

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._transport._release(self._conn)


def _read_error(e: BaseException, request: httpx.Request) -> httpx.HTTPError:
    if isinstance(e, httpx.HTTPError):
        return e
    return httpx.ReadError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, request=request)


class FastTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncBaseTransport`` for HTTP/1.1 servers: see the module docstring.

    ``limits.max_connections`` caps connections at once (more requests wait for one, up to
    the pool timeout); ``limits.max_keepalive_connections`` caps the idle ones kept."""

    def __init__(self, *, verify: Any = True, limits: httpx.Limits | None = None):
        limits = limits or httpx.Limits()
        self._max = limits.max_connections
        self._max_idle = limits.max_keepalive_connections if limits.max_keepalive_connections is not None else 1 << 30
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._open: set[_Conn] = set()
        self._connecting = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = (self._verify if isinstance(self._verify, ssl.SSLContext)
                         else httpx.create_ssl_context(verify=self._verify))
        return self._ssl

    def _take_idle(self, key: tuple[str, str, int]) -> _Conn | None:
        """The most recently used idle connection to ``key`` still fit for a request."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                conn.reset()
                return conn
            self._drop(conn)
        return None

    async def _acquire(self, request: httpx.Request, key: tuple[str, str, int], timeouts: dict[str, Any]) -> _Conn:
        conn = self._take_idle(key)
        if conn is not None:
            return conn
        while self._max is not None and len(self._open) + self._connecting >= self._max:
            idle_any = next((c for lst in self._idle.values() for c in lst), None)
            if idle_any is not None:  # an idle connection to another origin makes room
                self._idle[idle_any.key].remove(idle_any)
                self._drop(idle_any)
                continue
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    await fut
            except TimeoutError:
                raise httpx.PoolTimeout("no connection came free in time", request=request) from None
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._wake_one()  # woken, then cancelled: the turn goes to the next in line
                raise
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
            conn = self._take_idle(key)
            if conn is not None:
                return conn
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        self._connecting += 1
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                if scheme == "https":
                    _, conn = await loop.create_connection(lambda: _Conn(key), host, port, ssl=self._ssl_context(),
                                                           server_hostname=host)
                else:
                    _, conn = await loop.create_connection(lambda: _Conn(key), host, port)
        except BaseException as e:
            self._connecting -= 1
            self._wake_one()  # the room this connection would have taken
            if isinstance(e, TimeoutError):
                raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out", request=request) from None
            if isinstance(e, OSError | ssl.SSLError):
                raise httpx.ConnectError(f"{type(e).__name__}: {e}", request=request) from None
            raise
        self._connecting -= 1
        self._open.add(conn)
        return conn

    def _release(self, conn: _Conn) -> None:
        if conn.reusable() and not self._closed:
            idle = self._idle.setdefault(conn.key, [])
            if len(idle) < self._max_idle:
                idle.append(conn)
                self._wake_one()
                return
        conn.close()
        self._open.discard(conn)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise httpx.ConnectError("the transport is closed", request=request)
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"{scheme!r} URLs are not supported", request=request)
        port = url.port or (443 if scheme == "https" else 80)
        key = (scheme, url.host, port)
        timeouts: dict[str, Any] = request.extensions.get("timeout") or {}
        try:
            body: bytes | None = request.content
        except httpx.RequestNotRead:
            body = None  # a streamed body: sent as it comes
        method = request.method.encode()
        head = bytearray(b"%s %s HTTP/1.1\r\n" % (method, url.raw_path))
        for name, value in request.headers.raw:
            head += b"%s: %s\r\n" % (name, value)
        head += b"\r\n"
        conn = await self._acquire(request, key, timeouts)
        chunked = body is None and request.headers.get("transfer-encoding", "").lower() == "chunked"
        try:
            try:
                fut = conn.start(bytes(head) + body if body else bytes(head), method == b"HEAD")
                if body is None:
                    async with asyncio.timeout(timeouts.get("write")):
                        async for chunk in request.stream:  # type: ignore[union-attr]
                            if chunk:
                                await conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                        if chunked:
                            await conn.write(b"0\r\n\r\n")
            except TimeoutError:
                raise httpx.WriteTimeout("sending the request timed out", request=request) from None
            try:
                async with asyncio.timeout(timeouts.get("read")):
                    status, reason, headers, _ = await fut
            except TimeoutError:
                raise httpx.ReadTimeout("no response in time", request=request) from None
        except (OSError, httpx.RemoteProtocolError) as e:
            self._drop(conn)
            if isinstance(e, httpx.RemoteProtocolError):
                e.request = request
                raise
            if isinstance(e, ConnectionError):
                raise httpx.RemoteProtocolError(f"the server disconnected without an answer ({e})",
                                                request=request) from None
            raise httpx.ReadError(f"{type(e).__name__}: {e}", request=request) from None
        except BaseException:
            self._drop(conn)  # cancelled or timed out: the service sees the hang-up
            raise
        return httpx.Response(status, headers=headers, stream=_Body(self, conn, request, timeouts.get("read")),
                              extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason})

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        self._open.discard(conn)
        self._wake_one()

    async def aclose(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_exception(httpx.ConnectError("the transport is closed"))
