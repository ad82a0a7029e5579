"""The connection to one ``sandfleet serve``: create, find, fork and delete its sandboxes."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import httpx

from sandfleet.client._http import JSON, answer, body, checked_request, raise_for_status, transport_error
from sandfleet.client._transport import FastTransport
from sandfleet.client.models import ForkRequest, TaskImage
from sandfleet.client.sandbox import RemoteSandbox, RemoteSnapshot
from sandfleet.errors import AuthError, ConfigError, ImageBuildError, ServiceError, TaskError
from sandfleet.sandbox.base import Sandbox, Snapshot
from sandfleet.sandbox.spec import SandboxSpec, make_spec
from sandfleet.settings import current as current_settings

if TYPE_CHECKING:
    from sandfleet.tasks.model import Task

log = logging.getLogger(__name__)
POOLS = 16
"""httpx connection pools a client spreads its sandboxes over (see ServiceClient.pool)."""


async def connect(url: str, token: str, *, transport: httpx.AsyncBaseTransport | None = None,
                  timeout: float = 120.0, connect_timeout: float = 10.0, deadline_s: float | None = None,
                  max_connections: int = 1024, pools: int = POOLS, verify: Any = True) -> ServiceClient:
    """Connect to a sandbox service and check the token (AuthError if it is refused).

    ``transport`` replaces httpx's (a test's ``httpx.ASGITransport``, a proxy, retries);
    ``deadline_s`` is sent as ``X-Deadline-Ms``: how long each request may wait for
    admission before the service answers 429; ``verify`` is httpx's TLS verification
    (True, False, or an ``ssl.SSLContext``)."""
    client = ServiceClient(url, token, transport=transport, timeout=timeout, connect_timeout=connect_timeout,
                           deadline_s=deadline_s, max_connections=max_connections, pools=pools, verify=verify)
    try:
        client.info = await client.get_json("/v1/info")
    except AuthError as e:  # say where the refused token came from
        await client.aclose()
        env = (current_settings().token or "").strip()
        source = "$SANDFLEET_TOKEN" if env and env == token else "the token passed to connect()"
        raise AuthError(f"{url} refused {source}: {e}", status=e.status, code=e.code) from None
    except BaseException:
        await client.aclose()
        raise
    return client


class ServiceClient:
    """A sandfleet service, seen from a trainer. Also a sandbox ``Backend`` (``create``,
    ``fork``), so code written against backends takes it as it is."""

    name = "remote"

    def __init__(self, url: str, token: str, *, transport: httpx.AsyncBaseTransport | None = None,
                 timeout: float = 120.0, connect_timeout: float = 10.0, deadline_s: float | None = None,
                 max_connections: int = 1024, pools: int = POOLS, verify: Any = True):
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"a service URL starts with http:// or https://, not {url!r}")
        if not token or any(c.isspace() for c in token):
            raise ConfigError("a service token is one non-empty word (SANDFLEET_TOKEN)")
        self.url = url.rstrip("/")
        self.connect_timeout = connect_timeout
        self.deadline_s = deadline_s
        self.info: dict[str, Any] = {}
        if pools < 1:
            raise ConfigError(f"pools must be at least 1, not {pools}")
        per = max(1, max_connections // pools)
        limits = httpx.Limits(max_connections=per, max_keepalive_connections=per)
        # our own transports (not one passed in) carry commands directly (see direct())
        self._fast = [None if transport is not None else FastTransport(limits=limits, verify=verify)
                      for _ in range(pools)]
        self._pools = [httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"},
            transport=transport or fast, timeout=httpx.Timeout(timeout, connect=connect_timeout), limits=limits,
            verify=verify,
        ) for fast in self._fast]  # fmt: skip
        self.http = self._pools[0]
        """For calls about the service as a whole; a sandbox's calls go through :meth:`pool`."""
        self._next = 0
        self._later: set[asyncio.Task[Any]] = set()
        self._images: dict[tuple[str, bool, bool], TaskImage] = {}
        self._image_locks: dict[tuple[str, bool, bool], asyncio.Lock] = {}
        self.uploads = 0
        """Task folders this client uploaded (their images were not on the service yet)."""

    def pool(self, key: str | None = None) -> httpx.AsyncClient:
        """The HTTP client for a sandbox's calls (by its id), or the next one in turn.

        Connections are split over several httpx pools: httpcore's pool does work linear in
        its connections on every request, so one pool of 64 busy connections costs more CPU
        than the requests themselves (a measured 5x drop in execs/s at 64 sandboxes)."""
        if key is not None:
            return self._pools[hash(key) % len(self._pools)]
        self._next = (self._next + 1) % len(self._pools)
        return self._pools[self._next]

    def direct(self, key: str) -> FastTransport | None:
        """The transport under :meth:`pool` ``(key)`` for a sandbox's commands to go straight
        to: this client's own FastTransport when no proxy is configured (httpx would then
        mount none); None when a transport was passed in (it keeps the whole httpx client)."""
        fast = self._fast[hash(key) % len(self._fast)]
        return fast if fast is not None and not urllib.request.getproxies() else None

    def deadline_header(self) -> dict[str, str]:
        return {} if self.deadline_s is None else {"X-Deadline-Ms": str(int(self.deadline_s * 1000))}

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            resp = await self.pool().request(method, path, **kw)
        except httpx.HTTPError as e:
            raise transport_error(e, self.url) from None
        await raise_for_status(resp)
        return resp

    async def get_json(self, path: str, **kw: Any) -> Any:
        return (await self._call("GET", path, **kw)).json()

    # -- sandboxes

    async def create_sandbox(self, spec: SandboxSpec | None = None, *, idempotency_key: str | None = None,
                             **kwargs: Any) -> RemoteSandbox:
        """A new sandbox on the service, from a spec or keyword fields of SandboxSpec and
        Limits (as :func:`sandfleet.sandbox.create_sandbox`). A retry with the same
        ``idempotency_key`` returns the same sandbox instead of a second one."""
        if spec is None:
            spec = make_spec(**kwargs)
        elif kwargs:
            raise ConfigError("pass either a spec or keyword fields, not both")
        headers = self.deadline_header()
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        resp = await self._call("POST", "/v1/sandboxes", content=spec.model_dump_json(),
                                headers={"content-type": "application/json", **headers})
        return RemoteSandbox(self, resp.json())

    async def create(self, spec: SandboxSpec) -> RemoteSandbox:
        return await self.create_sandbox(spec)

    async def sandbox(self, sid: str) -> RemoteSandbox:
        """A live sandbox of this token, by id (a trainer that restarted picks its sandboxes
        up again); SandboxDiedError if it is gone, ServiceError 404 if unknown."""
        return RemoteSandbox(self, await self.get_json(f"/v1/sandboxes/{sid}"))

    async def find(self, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """This token's live sandboxes (as the service describes them), all labels matching."""
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        data = await self.get_json("/v1/sandboxes", params=params)
        return list(data["sandboxes"])

    async def delete(self, sid: str) -> None:
        await self._call("DELETE", f"/v1/sandboxes/{sid}")

    async def delete_where(self, labels: dict[str, str] | None = None) -> list[str]:
        """Delete this token's sandboxes whose labels all match (None: every one of them)."""
        params = [("label", f"{k}={v}") for k, v in (labels or {}).items()] or [("all", "true")]
        resp = await self._call("DELETE", "/v1/sandboxes", params=params)
        return list(resp.json()["deleted"])

    async def fork(self, snapshot: Snapshot, n: int) -> list[Sandbox]:
        """``n`` sandboxes from a snapshot taken on this service."""
        if not isinstance(snapshot, RemoteSnapshot) or snapshot.service is not self:
            raise ConfigError("this snapshot was not taken on this service")
        with checked_request():
            req = ForkRequest(n=n)
        resp = await self._call("POST", f"/v1/snapshots/{snapshot.id}/fork", content=body(req),
                                headers={**JSON, **self.deadline_header()})
        return [RemoteSandbox(self, info) for info in resp.json()["sandboxes"]]

    # -- task images

    async def task_image(self, task: Task, *, strict: bool = False) -> str:
        """The name of ``task``'s image on the service (what a SandboxSpec's ``image`` takes),
        built there from the task folder: the folder is hashed here, the service asked whether
        it has that digest's image, and the folder uploaded only when it has not (and the
        service builds it, once per digest). Remembered per digest for this client."""
        return (await self._task_image(task, strict=strict, verifier=False)).image

    async def verifier_image(self, task: Task) -> tuple[str, dict[str, str]]:
        """The image of the task's ``tests/Dockerfile`` on the service, and its environment."""
        info = await self._task_image(task, strict=False, verifier=True)
        return info.image, dict(info.env)

    async def _task_image(self, task: Task, *, strict: bool, verifier: bool) -> TaskImage:
        from sandfleet.tasks.bundle import content_hash, pack

        digest = await asyncio.to_thread(content_hash, task.path)
        key = (digest, strict, verifier)
        if key in self._images:
            return self._images[key]
        lock = self._image_locks.setdefault(key, asyncio.Lock())
        async with lock:  # one look-up and upload per digest, however many rollouts ask at once
            if key in self._images:
                return self._images[key]
            params = {"strict": str(strict).lower(), "verifier": str(verifier).lower()}
            try:
                info = answer(TaskImage, await self.get_json(f"/v1/task-images/{digest}", params=params))
            except ServiceError as e:
                if e.status != 404:
                    raise
                bundle = await asyncio.to_thread(pack, task)
                if bundle.digest != digest:
                    raise ConfigError(f"task {task.name}: its folder changed while it was being packed") from None
                try:
                    resp = await self._call("PUT", f"/v1/task-images/{digest}", content=bundle.data,
                                            params={**params, "name": task.name},
                                            headers={"content-type": "application/octet-stream",
                                                     **self.deadline_header()}, timeout=None)
                except ServiceError as err:
                    raise _image_error(task, err) from None
                info = answer(TaskImage, resp.json())
                self.uploads += 1
            self._images[key] = info
            return info

    async def metrics(self) -> str:
        return (await self._call("GET", "/metrics")).text

    # -- lifecycle

    def later(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, owned by this client (awaited by ``aclose``)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._later.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._later.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background call to the service failed: %s", task.exception())

    async def aclose(self) -> None:
        if self._later:
            await asyncio.gather(*self._later, return_exceptions=True)
        for p in self._pools:
            await p.aclose()

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _image_error(task: Task, e: ServiceError) -> Exception:
    """The exception the same failure raises when the image is built locally."""
    if e.code == "build_failed":
        return ImageBuildError(f"task {task.name} (built on the service): {e}")
    if e.code == "not_a_task":
        return TaskError(str(e), file=str(task.path))
    return e
