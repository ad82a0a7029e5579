"""``sandfleet serve``: the sandbox service of one CPU host, on uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import click

from sandfleet.errors import SandfleetError
from sandfleet.sandbox.registry import choices as backend_choices

log = logging.getLogger(__name__)
DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$")
"""A DNS name of two labels or more (``--domain``)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: an ephemeral one, printed once the service is ready)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP,
                               flags=socket.AI_PASSIVE)
    family, _, proto, _, addr = infos[0]
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are
    # TCP, and without it every response waits ~40 ms on Nagle and the peer's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, help="Port (0: any free one, printed when ready).")
@click.option("--token-file", required=True, type=click.Path(path_type=Path),
              help="Bearer tokens, one per line; mode 600 (re-read on SIGHUP).")
@click.option("--backend", type=click.Choice(backend_choices()), default="auto",
              show_default=True)
@click.option("--max-sandboxes", type=int, default=None, help="Live sandboxes at most (default: from memory).")
@click.option("--max-busy", type=int, default=None, help="Commands running at once at most (default: threads).")
@click.option("--capacity-from", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A `sandfleet bench run` result: --max-busy defaults to its measured capacity.")
@click.option("--quota", type=int, default=None, help="Live sandboxes per token (default: --max-sandboxes).")
@click.option("--max-ttl", "max_ttl_s", type=float, default=86400.0, show_default=True,
              help="Longest sandbox lifetime a client may ask for, seconds.")
@click.option("--deadline", "deadline_s", type=float, default=30.0, show_default=True,
              help="Admission wait of a request without X-Deadline-Ms, seconds.")
@click.option("--max-body-mib", type=float, default=256.0, show_default=True,
              help="Largest request body (upload, file write), MiB.")
@click.option("--drain-grace", "drain_grace_s", type=float, default=10.0, show_default=True,
              help="On SIGTERM, seconds running commands may go on before they are killed.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The journal of live sandboxes (default: <state>/service/<host>-<port>; none with --port 0).")
@click.option("--allow-forward", default="", help="Host-loopback ports clients may forward (comma list).")
@click.option("--ssl-certfile", default=None, help="TLS certificate (PEM); with --ssl-keyfile, serve HTTPS.")
@click.option("--ssl-keyfile", default=None, help="TLS private key (PEM).")
@click.option("--ssl-keyfile-password", default=None, envvar="SANDFLEET_SSL_KEYFILE_PASSWORD")
@click.option("--ssl-ca-certs", default=None, help="CA bundle to verify client certificates with.")
@click.option("--swerex-max-output", "swerex_max_output_kib", type=int, default=1024, show_default=True,
              help="KiB of a SWE-ReX command's output returned; beyond, it is cut and the response says so.")
@click.option("--max-output", "max_output_kib", type=int, default=1024, show_default=True,
              help="KiB of a SandboxFusion run's output returned; beyond, it is cut and the run is Failed, "
                   "its message saying so.")
@click.option("--e2b-max-output", "e2b_max_output_mib", type=int, default=64, show_default=True,
              help="MiB of an E2B command's output kept; beyond, the rest is dropped and the command ends "
                   "with an error saying so.")
@click.option("--fusion-image", default="host", show_default=True,
              help="The image SandboxFusion run_code calls (/sandbox-fusion/<token>/run_code) run in.")
@click.option("--domain", "e2b_domain", default="auto", show_default=True, metavar="DOMAIN",
              help="E2B get_host(port) answers <port>-<id>.DOMAIN, routed by the Host header (a wildcard DNS "
                   "record *.DOMAIN to this service); 'localhost': *.localhost, which curl and browsers resolve; "
                   "'userinfo': the traffic token as URL userinfo at this address; 'auto': localhost for a "
                   "client on loopback over HTTP, userinfo otherwise.")
@click.option("--e2b-public-traffic/--no-e2b-public-traffic", default=True, show_default=True,
              help="A sandbox port reached by host name answers without its traffic token, as E2B's default "
                   "(a create's network.allow_public_traffic decides per sandbox).")
@click.option("--e2b-internet/--no-e2b-internet", default=True, show_default=True,
              help="An E2B sandbox whose create does not set allow_internet_access gets the internet, as on "
                   "E2B (sandfleet's own /v1 sandboxes have none unless asked).")
@click.option("--access-log/--no-access-log", default=False, show_default=True)
def serve(host: str, port: int, token_file: Path, backend: str, max_sandboxes: int | None, max_busy: int | None,
          capacity_from: Path | None, quota: int | None, max_ttl_s: float, deadline_s: float, max_body_mib: float,
          drain_grace_s: float, state_dir: Path | None, allow_forward: str, ssl_certfile: str | None,
          ssl_keyfile: str | None, ssl_keyfile_password: str | None, ssl_ca_certs: str | None,
          swerex_max_output_kib: int, max_output_kib: int, e2b_max_output_mib: int, fusion_image: str,
          e2b_domain: str, e2b_public_traffic: bool, e2b_internet: bool, access_log: bool) -> None:
    """Serve sandboxes over HTTP to trainers on other machines (docs/service.md)."""
    try:
        import uvicorn

        from sandfleet.server.admission import host_limits
        from sandfleet.server.app import create_app
        from sandfleet.server.auth import Tokens
        from sandfleet.server.metrics import Metrics
        from sandfleet.server.service import SandboxService, ServiceConfig
    except ImportError as e:
        raise click.ClickException(f"the service needs the server extra: pip install 'sandfleet[server]' "
                                   f"({e})") from None
    from sandfleet.bench.procfs import raise_nofile
    from sandfleet.sandbox.state import state_root

    try:
        tokens = Tokens(token_file)
        raise_nofile()
        limits = host_limits(max_sandboxes, max_busy, capacity_from)
        forwards = tuple(int(p) for p in allow_forward.split(",") if p.strip())
        if state_dir is None and port != 0:
            state_dir = state_root() / "service" / f"{host.replace(':', '_')}-{port}"
        for name, v in (("--max-ttl", max_ttl_s), ("--deadline", deadline_s), ("--max-body-mib", max_body_mib),
                        ("--drain-grace", drain_grace_s)):
            if not 0 < v < float("inf"):
                raise click.BadParameter(f"must be a positive number, not {v}", param_hint=name)
        for name, n in (("--swerex-max-output", swerex_max_output_kib), ("--max-output", max_output_kib),
                        ("--e2b-max-output", e2b_max_output_mib)):
            if n < 1:
                raise click.BadParameter(f"must be at least 1, not {n}", param_hint=name)
        e2b_domain = e2b_domain.lower().rstrip(".")
        if e2b_domain not in ("auto", "localhost", "userinfo") and not DOMAIN.match(e2b_domain):
            raise click.BadParameter(f"{e2b_domain!r} is not a DNS name (nor auto, localhost or userinfo)",
                                     param_hint="--domain")
        config = ServiceConfig(backend=backend, quota=quota, max_ttl_s=max_ttl_s, deadline_s=deadline_s,
                               max_body_bytes=int(max_body_mib * (1 << 20)), state_dir=state_dir,
                               drain_grace_s=drain_grace_s, allow_forward=forwards,
                               swerex_max_output=swerex_max_output_kib << 10, max_output=max_output_kib << 10,
                               e2b_max_output=e2b_max_output_mib << 20, fusion_image=fusion_image,
                               e2b_domain=e2b_domain, e2b_public_traffic=e2b_public_traffic,
                               e2b_internet=e2b_internet)
        metrics = Metrics()
        service = SandboxService(config, limits, metrics)
    except (SandfleetError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    sock = bind(host, port)
    scheme = "https" if ssl_certfile else "http"
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"{scheme}://{'[' + bound_host + ']' if ':' in bound_host else bound_host}:{bound_port}"

    def ready() -> None:
        log.info("limits: %s", limits.basis)
        click.echo(f"sandfleet serve: listening on {url} ({service.backend} sandboxes, "
                   f"max {limits.max_sandboxes} live, {limits.max_busy} busy)")
        sys.stdout.flush()

    if access_log:  # asked for: its lines show without a global -v (uvicorn logs them at INFO)
        access = logging.getLogger("uvicorn.access")
        if access.getEffectiveLevel() > logging.INFO:
            access.setLevel(logging.INFO)
    app = create_app(service, tokens, metrics, on_ready=ready)
    # the asyncio loop, not uvloop: sandbox creation (a subprocess per sandbox) measured
    # about 1.5x faster on it, exec round trips no slower
    cfg = uvicorn.Config(app, loop="asyncio", http=http_protocol(), lifespan="on", access_log=access_log,
                         timeout_graceful_shutdown=int(max(1, drain_grace_s)), log_config=None,
                         ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, ssl_keyfile_password=ssl_keyfile_password,
                         ssl_ca_certs=ssl_ca_certs, ssl_cert_reqs=2 if ssl_ca_certs else 0,
                         limit_concurrency=None, backlog=2048, timeout_keep_alive=75, server_header=False)
    server = make_server(cfg, service, tokens)
    server.run(sockets=[sock])


class _Coalesced:
    """A transport whose writes within one turn of the event loop leave as one: uvicorn
    writes a response's head and its body separately, which cost a second send and often
    a second wake-up of the client per request."""

    def __init__(self, transport: asyncio.Transport):
        self._transport = transport
        self._buf: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._buf:
            self._loop.call_soon(self._flush)
        self._buf.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        if self._buf:
            data = b"".join(self._buf)
            self._buf.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def http_protocol() -> Any:
    """uvicorn's httptools protocol on coalesced writes (see _Coalesced); "auto" (uvicorn's
    choice, unchanged) where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class CoalescingHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(cast(asyncio.Transport, _Coalesced(transport)))

    return CoalescingHttpToolsProtocol


def make_server(config: Any, service: Any, tokens: Any) -> Any:
    """uvicorn's Server with sandfleet's signal handling (uvicorn is imported lazily: it is
    in the server extra)."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server with sandfleet's signals: SIGTERM/SIGINT drain (no new work,
        running commands get --drain-grace, then every sandbox is closed), SIGHUP re-reads
        the token file. Nothing is re-raised after the drain: the exit is clean."""

        def __init__(self, config: Any, service: Any, tokens: Any):
            super().__init__(config)
            self.service = service
            self.tokens = tokens

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop, sig)
            loop.add_signal_handler(signal.SIGHUP, self.tokens.reload)
            try:
                yield
            finally:
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                    loop.remove_signal_handler(sig)

        def _stop(self, sig: int) -> None:
            if not self.service.draining:
                log.warning("signal %d: draining (no new work; running commands get %gs)", sig,
                            self.service.config.drain_grace_s)
            self.service.draining = True
            self.handle_exit(sig, None)

    return Server(config, service, tokens)
