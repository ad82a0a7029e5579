"""The client's HTTP transport (sandfleet.client._transport.FastTransport) under httpx's
client, against real servers on loopback that answer as scripted: framing (length,
chunked, until close, none), interim answers, keep-alive and when a connection is not
reused, cancellation, limits, timeouts, streamed uploads, flow control, errors, TLS."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from sandfleet.client._transport import FastTransport

Answer = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[None]]
"""(request head, request body, writer) -> writes the response."""


class Scripted:
    """A loopback HTTP/1.1 server: reads requests (length or chunked bodies), answers each
    with ``answer``; counts connections and keeps what it received."""

    def __init__(self, answer: Answer):
        self.answer = answer
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.hangups = 0
        self.server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for t in self._handlers:
            t.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.hangups += 1
                    return
                low = head.lower()
                body = b""
                if b"transfer-encoding: chunked" in low:
                    while True:
                        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                        chunk = await reader.readexactly(size + 2)
                        if size == 0:
                            break
                        body += chunk[:-2]
                elif b"content-length:" in low:
                    n = int(low.split(b"content-length:")[1].split(b"\r\n")[0])
                    body = await reader.readexactly(n)
                self.requests.append((head, body))
                try:
                    await self.answer(head, body, writer)
                    if writer.is_closing():
                        return
                    await writer.drain()
                except ConnectionError:
                    self.hangups += 1
                    return
        finally:
            self._handlers.discard(task)
            writer.close()


def fixed(raw: bytes, close: bool = False) -> Answer:
    async def answer(head: bytes, body: bytes, w: asyncio.StreamWriter) -> None:
        w.write(raw)
        if close:
            await w.drain()
            w.close()
    return answer


def client(url: str, t: FastTransport | None = None) -> httpx.AsyncClient:
    """httpx's client on a FastTransport (closed with the client)."""
    t = t or FastTransport(limits=httpx.Limits(max_connections=4, max_keepalive_connections=4))
    return httpx.AsyncClient(base_url=url, transport=t)


async def test_framings_and_keep_alive() -> None:
    answers = iter([
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-trailer: t\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n",  # a HEAD: the length, no body
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil close",
    ])

    async def answer(head: bytes, body: bytes, w: asyncio.StreamWriter) -> None:
        raw = next(answers)
        w.write(raw)
        if b"until close" in raw:
            await w.drain()
            w.close()

    async with Scripted(answer) as srv, client(srv.url) as h:
        r = await h.get("/a?q=1")
        assert (r.status_code, r.content, r.headers["x-a"]) == (200, b"hello", "1")
        assert (await h.get("/b")).content == b"abcde"
        r = await h.post("/c", content=b"xyz")
        assert (r.status_code, r.content, r.reason_phrase) == (201, b"ok", "Created")
        assert (await h.delete("/d")).status_code == 204
        assert (await h.get("/e")).content == b""
        r = await h.head("/f")
        assert (r.status_code, r.content, r.headers["content-length"]) == (200, b"", "9")
        assert srv.connections == 1  # one connection for all of them so far
        assert (await h.get("/g")).content == b"until close"
        heads = [hd for hd, _ in srv.requests]
        assert heads[0].startswith(b"GET /a?q=1 HTTP/1.1\r\n") and b"\r\nhost: 127.0.0.1:" in heads[0].lower()
        assert srv.requests[2][1] == b"xyz" and heads[5].startswith(b"HEAD /f ")
        # the connection that ended with the body is not reused
        answers = iter([b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n1"])
        assert (await h.get("/h")).content == b"1"
        assert srv.connections == 2


async def test_connections_that_are_not_reused() -> None:
    # a second response to one request (in the same segment): the first is the answer, and
    # the connection, out of step, is not reused
    two = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxHTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\ny"
    async with Scripted(fixed(two)) as srv, client(srv.url) as h:
        assert [(await h.get("/")).content for _ in range(2)] == [b"x", b"x"]
        assert srv.connections == 2
    close = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\nx"
    async with Scripted(fixed(close, close=True)) as srv, client(srv.url) as h:
        for _ in range(3):
            assert (await h.get("/")).content == b"x"
        assert srv.connections == 3
    async with Scripted(fixed(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\ny")) as srv, \
            client(srv.url) as h:
        assert [(await h.get("/")).content for _ in range(2)] == [b"y", b"y"]
        assert srv.connections == 2
    # the server closes an idle connection (its keep-alive timeout): the next request opens another
    async with Scripted(fixed(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nz", close=True)) as srv, \
            client(srv.url) as h:
        assert (await h.get("/")).content == b"z"
        await asyncio.sleep(0.1)
        assert (await h.get("/")).content == b"z"
        assert srv.connections == 2


async def test_a_response_not_read_to_the_end_closes_its_connection() -> None:
    body = b"x" * (3 << 20)
    async with Scripted(fixed(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)) as srv, \
            client(srv.url) as h:
        async with h.stream("GET", "/") as r:
            async for chunk in r.aiter_raw():
                assert chunk
                break
        assert (await h.get("/")).content == body  # read whole: flow control paused and resumed
        assert srv.connections == 2
        assert (await h.get("/")).content == body
        assert srv.connections == 2  # that one was reused


async def test_cancelled_request_hangs_up() -> None:
    got, hung = asyncio.Event(), asyncio.Event()

    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        got.set()
        if await reader.read() == b"":  # no answer, ever: only the client's hang-up ends this
            hung.set()
        writer.close()

    server = await asyncio.start_server(never, "127.0.0.1", 0)
    t = FastTransport()
    try:
        async with client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", t) as h:
            task = asyncio.create_task(h.get("/exec"))
            await got.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(hung.wait(), 5)
            assert not t._open  # nothing kept
    finally:
        server.close()
        await server.wait_closed()


async def test_hang_up_is_seen_by_the_server() -> None:
    seen = asyncio.Event()

    async def answer(head: bytes, body: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await w.drain()
        try:
            for _ in range(300):
                await asyncio.sleep(0.01)
                w.write(b"1\r\nb\r\n")
                await w.drain()
        except ConnectionError:
            seen.set()
            raise

    t = FastTransport()
    async with Scripted(answer) as srv, client(srv.url, t) as h:
        async with h.stream("GET", "/") as r:
            async for chunk in r.aiter_raw():
                assert chunk == b"a"
                break
        await asyncio.wait_for(seen.wait(), 5)
    await t.aclose()


async def test_streamed_upload_is_chunked() -> None:
    async def parts() -> AsyncIterator[bytes]:
        for i in range(5):
            yield bytes([65 + i]) * 70000

    async with Scripted(fixed(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")) as srv, \
            client(srv.url) as h:
        assert (await h.put("/up", content=parts())).content == b"ok"
        head, body = srv.requests[0]
        assert b"transfer-encoding: chunked" in head.lower()
        assert body == b"".join(bytes([65 + i]) * 70000 for i in range(5))


async def test_connection_limit_waits_and_pool_timeout() -> None:
    release = asyncio.Event()

    async def slow(head: bytes, body: bytes, w: asyncio.StreamWriter) -> None:
        await release.wait()
        w.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nk")

    t = FastTransport(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
    async with Scripted(slow) as srv, client(srv.url, t) as h:
        first = asyncio.create_task(h.get("/1"))
        second = asyncio.create_task(h.get("/2"))
        await asyncio.sleep(0.2)
        assert srv.connections == 1 and len(srv.requests) == 1  # the second waits for the connection
        with pytest.raises(httpx.PoolTimeout):
            await h.get("/3", timeout=httpx.Timeout(10, pool=0.1))
        release.set()
        assert [(await first).content, (await second).content] == [b"k", b"k"]
        assert srv.connections == 1
    await t.aclose()


async def test_errors_are_httpx_errors() -> None:
    async with Scripted(fixed(b"HTTP/1.1 200 OK\r\n")) as srv, client(srv.url) as h:
        with pytest.raises(httpx.ReadTimeout):
            await h.get("/", timeout=0.2)
    for raw in (b"NOT HTTP\r\n\r\n", b"HTTP/1.1 20x OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"):
        async with Scripted(fixed(raw)) as srv, client(srv.url) as h:
            with pytest.raises(httpx.RemoteProtocolError):
                await h.get("/")
    async with Scripted(fixed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", close=True)) as srv, \
            client(srv.url) as h:
        with pytest.raises(httpx.ReadError):
            await h.get("/")
    async with Scripted(fixed(b"", close=True)) as srv, client(srv.url) as h:
        with pytest.raises(httpx.RemoteProtocolError, match="disconnected|closed"):
            await h.get("/")
    srv_sock = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv_sock.sockets[0].getsockname()[1]
    srv_sock.close()
    await srv_sock.wait_closed()
    t = FastTransport()
    async with client(f"http://127.0.0.1:{port}", t) as h:
        with pytest.raises(httpx.ConnectError):
            await h.get("/")
        assert not t._open


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_tls(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    await asyncio.to_thread(subprocess.run, argv, check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nsecret")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        t = FastTransport(verify=ssl.create_default_context(cafile=str(cert)))
        async with client(url, t) as h:
            assert (await h.get("/")).content == b"secret"
        t2 = FastTransport()  # the system's CAs: this certificate is not trusted
        async with client(url, t2) as h:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
                await h.get("/")
    finally:
        server.close()
        await server.wait_closed()
