"""The sandboxes of one service: who owns each, their TTLs, quotas, admission, and what a
killed predecessor left.

Every sandbox is a local sandbox of the service's backend, created with the service's
``max_ttl_s`` as its own TTL; the TTL a client asks for (and may extend) is kept here and
enforced by the reaper, which closes a sandbox when it passes. A journal in ``state_dir``
names each live sandbox and its owner: on start, what it names belonged to a predecessor
that was killed (or stopped), so those ids answer 410 ``sandbox_lost`` from then on, and
the predecessor's sandboxes themselves are reaped through :func:`sandfleet.sandbox.state.reap_leftovers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandfleet.client.models import SandboxInfo
from sandfleet.errors import (
    ConfigError,
    ImageError,
    SandboxDiedError,
    SandboxPathError,
    SandfleetError,
    ServiceBusyError,
    ServiceError,
    error_of,
    to_wire,
)
from sandfleet.sandbox import create_sandbox, fork, resolve_backend
from sandfleet.sandbox.base import Sandbox, Session, Snapshot
from sandfleet.sandbox.spec import SandboxSpec
from sandfleet.server.admission import AdmissionRejected, Gate, HostLimits
from sandfleet.server.metrics import Metrics

log = logging.getLogger(__name__)

GONE_KEPT = 100_000
"""Tombstones (closed, expired, lost ids) remembered, newest first."""
LOST_KEPT_S = 86400.0
"""How long ids lost to a restart keep answering 410."""
IDEMPOTENCY_KEPT = 100_000
MAX_SESSIONS = 64
"""Sessions open at once per sandbox."""


@dataclass
class ServiceConfig:
    backend: str = "auto"
    """The backend every sandbox of the service runs on."""
    quota: int | None = None
    """Live sandboxes per token (default: max_sandboxes)."""
    max_ttl_s: float = 86400.0
    """Longest TTL a client may ask for, or extend to."""
    deadline_s: float = 30.0
    """How long a request waits for admission without an X-Deadline-Ms header."""
    max_body_bytes: int = 256 << 20
    """Largest request body (uploads, file writes, JSON)."""
    state_dir: Path | None = None
    """Where the journal lives; None: no journal (ids are not remembered across restarts)."""
    drain_grace_s: float = 10.0
    """On SIGTERM, how long running commands may go on before they are killed."""
    allow_forward: tuple[int, ...] = ()
    """Host-loopback ports a client may forward into its sandboxes (none by default)."""
    reap_interval_s: float = 0.2
    swerex_max_output: int = 1 << 20
    """Bytes of a SWE-ReX command's output returned (``--swerex-max-output``); beyond, cut."""
    max_output: int = 1 << 20
    """Bytes of a SandboxFusion run's output returned (``--max-output``); beyond, cut and the
    run is Failed with a message saying so."""
    e2b_max_output: int = 64 << 20
    """Bytes of an E2B command's output kept (``--e2b-max-output``); beyond, the command ends
    with an error saying so."""
    fusion_image: str = "host"
    """The image SandboxFusion ``run_code`` calls run in (``--fusion-image``)."""
    e2b_domain: str = "auto"
    """What an E2B sandbox's ``domain`` is (``--domain``): a DNS name whose wildcard record
    points here (``get_host(port)`` is ``<port>-<id>.<it>``), ``localhost`` (``*.localhost``,
    which curl and browsers resolve to loopback), ``userinfo`` (the traffic token as URL
    userinfo at the service's address, no DNS name), or ``auto``: localhost for a client that
    reached the service on loopback over plain HTTP, userinfo otherwise."""
    e2b_public_traffic: bool = True
    """Whether a sandbox's port answers a host-name request without its traffic token, as
    E2B's default; ``network.allowPublicTraffic`` of a create decides per sandbox."""
    e2b_internet: bool = True
    """An E2B create without ``allow_internet_access`` gets the internet, as on E2B
    (``--e2b-internet/--no-e2b-internet``); sandfleet's own ``/v1`` keeps its default off."""


@dataclass(eq=False)
class Entry:
    sb: Sandbox
    owner: str
    spec: SandboxSpec
    """As the client asked (its TTL, not the backend's)."""
    created: float
    expires: float
    """time.monotonic() at which the reaper closes it."""
    busy: int = 0
    sessions: dict[str, Session] = field(default_factory=dict)

    def info(self) -> SandboxInfo:
        return SandboxInfo(id=self.sb.id, backend=self.sb.backend, spec=self.spec, created=self.created,
                           expires_in_s=round(max(0.0, self.expires - time.monotonic()), 3),
                           alive=self.sb.alive, busy=self.busy)


@dataclass(frozen=True)
class Gone:
    owner: str
    code: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)
    """What the error adds on the wire (a dead sandbox's ``end``: how it ended, errors.SandboxEnd)."""


@dataclass(eq=False)
class SnapshotEntry:
    owner: str
    snap: Snapshot
    sandbox: str
    ttl_s: float
    labels: dict[str, str]


def labels_match(labels: dict[str, str], want: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


class SandboxService:
    def __init__(self, config: ServiceConfig, limits: HostLimits, metrics: Metrics):
        self.config = config
        self.limits = limits
        self.metrics = metrics
        self.backend = resolve_backend(config.backend)
        self.quota = config.quota or limits.max_sandboxes
        self.live: dict[str, Entry] = {}
        self.owned: Counter[str] = Counter()  # live + being created, per owner
        self.gone: OrderedDict[str, Gone] = OrderedDict()
        self.snapshots: dict[str, SnapshotEntry] = {}
        self.idem: OrderedDict[tuple[str, str], tuple[str, asyncio.Future[str]]] = OrderedDict()
        self.sandbox_gate = Gate("sandboxes", limits.max_sandboxes)
        self.busy_gate = Gate("busy", limits.max_busy)
        self.draining = False
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        metrics.sandboxes.set_function(lambda: len(self.live))
        metrics.busy.set_function(lambda: self.busy_gate.in_use)
        for gate in (self.sandbox_gate, self.busy_gate):
            metrics.queued_now.labels(gate.name).set_function(lambda g=gate: g.waiting)  # type: ignore[misc]

    # -- lifecycle

    async def start(self) -> int:
        """Reap what a predecessor left (its journal, then every dead owner's sandbox on the
        host) and start the TTL reaper; returns how many leftovers were reaped."""
        lost = self._journal_restore()
        from sandfleet.sandbox.state import reap_leftovers

        reaped = await asyncio.to_thread(reap_leftovers)
        self.metrics.reaped.inc(len(reaped))
        if reaped or lost:
            log.warning("reaped %d leftovers of a killed predecessor; %d sandbox ids of the last run now answer 410",
                        len(reaped), lost)
        self._reaper = asyncio.create_task(self._reap_loop(), name="sandfleet-service-reaper")
        return len(reaped)

    async def close(self) -> None:
        """Close every sandbox and delete every snapshot (after a drain, or at once)."""
        self.draining = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        entries = list(self.live.values())
        for i in range(0, len(entries), 64):
            await asyncio.gather(*(self._close(e, "sandbox_lost", "closed when the service stopped")
                                   for e in entries[i:i + 64]))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        for sid in list(self.snapshots):
            self._drop_snapshot(sid)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            now = time.monotonic()
            for e in list(self.live.values()):
                if e.expires <= now:
                    self.metrics.expired.inc()
                    self._close_soon(e, "sandbox_expired", f"sandbox {e.sb.id} expired (its TTL passed)")
                elif not e.sb.alive and e.busy == 0:  # how it died goes with the answers that say so
                    died = getattr(getattr(e.sb, "client", None), "error", None)
                    wire = to_wire(died) if isinstance(died, SandboxDiedError) else None
                    self._close_soon(e, "sandbox_died", f"sandbox {e.sb.id} died", wire[2] if wire else None)

    def _close_soon(self, e: Entry, code: str, message: str, extra: dict[str, Any] | None = None) -> None:
        t = asyncio.create_task(self._close(e, code, message, extra))
        self._closing.add(t)
        t.add_done_callback(self._closing.discard)

    async def _close(self, e: Entry, code: str, message: str, extra: dict[str, Any] | None = None) -> None:
        sid = e.sb.id
        if self.live.get(sid) is not e:
            return
        del self.live[sid]
        self.owned[e.owner] -= 1
        if self.owned[e.owner] <= 0:
            del self.owned[e.owner]
        self._remember(sid, Gone(e.owner, code, message, extra or {}))
        if code == "sandbox_lost":
            self._journal_move(sid)
        else:
            self._journal_remove(sid)
        e.sessions.clear()
        try:
            await asyncio.shield(e.sb.close())
        except Exception as err:
            self.metrics.close_failures.inc()
            log.error("closing sandbox %s failed: %s: %s", sid, type(err).__name__, err)
        finally:
            self.sandbox_gate.release(1, time.time() - e.created)

    def _remember(self, sid: str, gone: Gone) -> None:
        self.gone[sid] = gone
        self.gone.move_to_end(sid)
        while len(self.gone) > GONE_KEPT:
            self.gone.popitem(last=False)

    # -- lookups

    def entry(self, owner: str, sid: str) -> Entry:
        """The owner's live sandbox ``sid``; 410 if it is gone, 404 if it is not theirs or unknown."""
        e = self.live.get(sid)
        if e is not None and e.owner == owner:
            return e
        g = self.gone.get(sid)
        if g is not None and g.owner == owner:
            raise error_of(g.code, g.message, g.extra)
        raise ServiceError(f"no sandbox {sid!r}", code="sandbox_not_found")

    def find(self, owner: str, labels: dict[str, str]) -> list[Entry]:
        return [e for e in self.live.values() if e.owner == owner and labels_match(e.spec.labels, labels)]

    # -- admission

    def _deadline(self, deadline_ms: str | None) -> float:
        if deadline_ms is None or deadline_ms == "":
            return time.monotonic() + self.config.deadline_s
        try:
            ms = float(deadline_ms)
        except ValueError:
            raise ConfigError(f"X-Deadline-Ms must be a number of milliseconds, not {deadline_ms!r}") from None
        if not 0 <= ms <= 3_600_000:
            raise ConfigError(f"X-Deadline-Ms must be between 0 and 3600000, not {deadline_ms!r}")
        return time.monotonic() + ms / 1000

    async def _admit(self, gate: Gate, owner: str, deadline_ms: str | None, k: int = 1) -> None:
        if self.draining:
            raise ServiceError("the service is shutting down; no new work is taken", code="draining")
        deadline = self._deadline(deadline_ms)
        try:
            queued = await gate.acquire(owner, deadline, k)
        except AdmissionRejected as e:
            self.metrics.queued.labels(gate.name).inc()
            self.metrics.rejected.labels(gate.name).inc()
            raise ServiceBusyError(str(e), code="busy", retry_after=e.retry_after) from None
        if queued:
            self.metrics.queued.labels(gate.name).inc()
        if self.draining:
            gate.release(k)
            raise ServiceError("the service is shutting down; no new work is taken", code="draining")

    async def admit_start(self, owner: str, deadline_ms: str | None, e: Entry) -> Callable[[], None]:
        """One command slot (--max-busy) for a process's start; the returned release (safe to
        call twice) gives it back once the process runs. A process that lives on (a server, a
        watcher, a sleep) holds no slot: admission bounds starts, which compete for the host,
        and the sandbox's cgroup bounds what the process then uses (cpus, memory, pids)."""
        await self._admit(self.busy_gate, owner, deadline_ms)
        t0 = time.monotonic()
        e.busy += 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                e.busy -= 1
                self.busy_gate.release(1, time.monotonic() - t0)

        return release

    @contextlib.asynccontextmanager
    async def busy(self, owner: str, deadline_ms: str | None, e: Entry) -> AsyncIterator[None]:
        """One command slot (--max-busy), held while the command runs."""
        async with self.slot(owner, deadline_ms):
            e.busy += 1
            try:
                yield
            finally:
                e.busy -= 1

    @contextlib.asynccontextmanager
    async def slot(self, owner: str, deadline_ms: str | None) -> AsyncIterator[None]:
        """One command slot (--max-busy) for CPU work of no one sandbox (a task image's
        build), held while it runs."""
        await self._admit(self.busy_gate, owner, deadline_ms)
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.busy_gate.release(1, time.monotonic() - t0)

    def _take_quota(self, owner: str, n: int) -> None:
        if self.owned[owner] + n > self.quota:
            self.metrics.rejected.labels("quota").inc()
            raise ServiceBusyError(f"this token holds {self.owned[owner]} sandboxes; its quota is {self.quota}",
                                   code="quota_exceeded", retry_after=1)
        self.owned[owner] += n

    def _give_quota(self, owner: str, n: int) -> None:
        self.owned[owner] -= n
        if self.owned[owner] <= 0:
            del self.owned[owner]

    # -- create, fork, delete

    def check_spec(self, spec: SandboxSpec) -> tuple[SandboxSpec, SandboxSpec]:
        """(the spec as the backend gets it: the service's backend and --max-ttl; the spec
        as the client sees it: its TTL, or --max-ttl where it left a longer default), after
        the checks a shared host needs: limits the host can hold, forwards it allows."""
        check_spec_text(spec)
        if spec.backend not in ("auto", self.backend):
            raise ConfigError(f"this service runs {self.backend} sandboxes, not {spec.backend}")
        lim = spec.limits
        ttl = lim.ttl_s if lim.ttl_s is not None else self.config.max_ttl_s
        if "ttl_s" not in lim.model_fields_set:
            ttl = min(ttl, self.config.max_ttl_s)
        if ttl > self.config.max_ttl_s:
            raise ConfigError(f"ttl_s {ttl:g} is over this service's --max-ttl {self.config.max_ttl_s:g}")
        cpus = os.cpu_count() or 1
        if lim.cpus is not None and lim.cpus > cpus:
            raise ConfigError(f"cpus {lim.cpus:g} is more than this host's {cpus}")
        mem = _mem_total_mib()
        if lim.memory_mib is not None and lim.memory_mib > mem:
            raise ConfigError(f"memory_mib {lim.memory_mib} is more than this host's {mem} MiB")
        if lim.disk_mib > mem * 4:
            raise ConfigError(f"disk_mib {lim.disk_mib} is more than this service allows "
                                                  f"({mem * 4} MiB)")
        bad = [p for p in lim.forward if p not in self.config.allow_forward]
        if bad:
            raise ConfigError(f"forwarding port(s) {bad} is not allowed by this service "
                                                  "(sandfleet serve --allow-forward)")
        if spec.image != "host":
            from sandfleet.imagestore import resolve_image

            try:
                resolve_image(spec.image)
            except SandfleetError as e:
                raise ImageError(str(e).split(";")[0] + " on this service's host "
                                 "(`sandfleet image ls` there lists them)") from None
        real = spec.model_copy(update={"backend": self.backend,
                                       "limits": lim.model_copy(update={"ttl_s": self.config.max_ttl_s})})
        return real, spec.model_copy(update={"limits": lim.model_copy(update={"ttl_s": ttl})})

    async def create(self, owner: str, spec: SandboxSpec, *, key: str | None, deadline_ms: str | None) -> Entry:
        if key is None:
            return await self._create(owner, spec, deadline_ms)
        if len(key) > 256:
            raise ConfigError("Idempotency-Key is longer than 256 characters")
        fp = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()
        k = (owner, key)
        rec = self.idem.get(k)
        if rec is not None:
            if rec[0] != fp:
                raise ServiceError("this Idempotency-Key was used with a different request",
                                   code="idempotency_conflict")
            return self.entry(owner, await asyncio.shield(rec[1]))
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.idem[k] = (fp, fut)
        while len(self.idem) > IDEMPOTENCY_KEPT:
            self.idem.popitem(last=False)
        try:
            e = await self._create(owner, spec, deadline_ms)
        except BaseException as err:
            self.idem.pop(k, None)
            fut.set_exception(err if isinstance(err, Exception) else asyncio.CancelledError())
            fut.exception()  # retrieved: a failed create is reported to its own caller
            raise
        fut.set_result(e.sb.id)
        return e

    async def _create(self, owner: str, spec: SandboxSpec, deadline_ms: str | None) -> Entry:
        real, spec = self.check_spec(spec)
        self._take_quota(owner, 1)
        try:
            await self._admit(self.sandbox_gate, owner, deadline_ms)
        except BaseException:
            self._give_quota(owner, 1)
            raise
        try:
            t0 = time.perf_counter()
            sb = await asyncio.shield(create_sandbox(real))
            self.metrics.create_seconds.observe(time.perf_counter() - t0)
        except OSError as e:  # the host, not the request: a cgroup or state directory went away
            self._give_quota(owner, 1)
            self.sandbox_gate.release(1)
            log.error("creating a sandbox failed on the host: %s", e)
            raise ServiceError(f"the service's host could not create a sandbox: {e}", code="host_error",
                               retry_after=1) from None
        except BaseException:
            self._give_quota(owner, 1)
            self.sandbox_gate.release(1)
            raise
        return self._register(sb, owner, spec, spec.limits.ttl_s or self.config.max_ttl_s)

    def _register(self, sb: Sandbox, owner: str, spec: SandboxSpec, ttl: float) -> Entry:
        e = Entry(sb=sb, owner=owner, spec=spec, created=time.time(), expires=time.monotonic() + ttl)
        self.live[sb.id] = e
        self._journal_add(sb.id, owner)
        return e

    async def delete(self, owner: str, sid: str) -> None:
        e = self.entry(owner, sid)
        await self._close(e, "sandbox_closed", f"sandbox {sid} was deleted")

    async def delete_soon(self, e: Entry) -> None:
        """Unregister ``e`` now (its id answers 410 ``sandbox_closed`` from here) and close
        it in the background: its processes are killed and its files removed after the
        caller has answered (:meth:`close` still waits for that)."""
        self._close_soon(e, "sandbox_closed", f"sandbox {e.sb.id} was deleted")
        await asyncio.sleep(0)  # the close starts, and unregisters the sandbox, before this returns

    async def delete_where(self, owner: str, labels: dict[str, str]) -> list[str]:
        entries = self.find(owner, labels)
        await asyncio.gather(*(self._close(e, "sandbox_closed", f"sandbox {e.sb.id} was deleted") for e in entries))
        return [e.sb.id for e in entries]

    def extend(self, owner: str, sid: str, ttl_s: float) -> Entry:
        e = self.entry(owner, sid)
        age = time.time() - e.created
        if age + ttl_s > self.config.max_ttl_s:
            raise ConfigError(f"a sandbox lives at most --max-ttl {self.config.max_ttl_s:g}s; "
                                                  f"this one is {age:.0f}s old")
        e.expires = time.monotonic() + ttl_s
        e.spec = e.spec.model_copy(update={"limits": e.spec.limits.model_copy(update={"ttl_s": age + ttl_s})})
        return e

    # -- snapshots

    async def snapshot(self, owner: str, sid: str) -> tuple[str, SnapshotEntry]:
        e = self.entry(owner, sid)
        if sum(1 for s in self.snapshots.values() if s.owner == owner) >= self.quota:
            raise ServiceBusyError(f"this token holds {self.quota} snapshots, its quota", code="quota_exceeded",
                                   retry_after=1)
        snap = await e.sb.snapshot()
        ttl = e.spec.limits.ttl_s or self.config.max_ttl_s
        s = SnapshotEntry(owner=owner, snap=snap, sandbox=sid, ttl_s=ttl, labels=dict(e.spec.labels))
        self.snapshots[snap.id] = s
        return snap.id, s

    def snapshot_entry(self, owner: str, snap_id: str) -> SnapshotEntry:
        s = self.snapshots.get(snap_id)
        if s is None or s.owner != owner:
            raise ServiceError(f"no snapshot {snap_id!r}", code="snapshot_not_found")
        return s

    def delete_snapshot(self, owner: str, snap_id: str) -> None:
        self.snapshot_entry(owner, snap_id)
        self._drop_snapshot(snap_id)

    def _drop_snapshot(self, snap_id: str) -> None:
        s = self.snapshots.pop(snap_id, None)
        if s is not None:
            try:
                s.snap.delete()
            except OSError as e:
                log.error("deleting snapshot %s failed: %s", snap_id, e)

    async def fork(self, owner: str, snap_id: str, n: int, *, ttl_s: float | None, labels: dict[str, str] | None,
                   deadline_ms: str | None) -> list[Entry]:
        s = self.snapshot_entry(owner, snap_id)
        ttl = ttl_s or s.ttl_s
        if ttl > self.config.max_ttl_s:
            raise ConfigError(f"ttl_s {ttl:g} is over this service's --max-ttl")
        self._take_quota(owner, n)
        try:
            await self._admit(self.sandbox_gate, owner, deadline_ms, n)
        except BaseException:
            self._give_quota(owner, n)
            raise
        try:
            t0 = time.perf_counter()
            kids = await asyncio.shield(fork(s.snap, n))
            self.metrics.create_seconds.observe((time.perf_counter() - t0) / n)
        except OSError as e:  # the host, not the request (as in _create): out of files, loop devices, ...
            self._give_quota(owner, n)
            self.sandbox_gate.release(n)
            log.error("forking %d sandboxes failed on the host: %s", n, e)
            raise ServiceError(f"the service's host could not fork {n} sandboxes: {e}", code="host_error",
                               retry_after=1) from None
        except BaseException:
            self._give_quota(owner, n)
            self.sandbox_gate.release(n)
            raise
        base = s.snap.spec
        visible = base.model_copy(update={"labels": labels if labels is not None else s.labels,
                                          "limits": base.limits.model_copy(update={"ttl_s": ttl})})
        return [self._register(k, owner, visible, ttl) for k in kids]

    async def branch(self, owner: str, sid: str, n: int, *, processes: Literal["error", "drop"],
                     deadline_ms: str | None) -> tuple[list[Entry], Any]:
        """``n`` children of the owner's sandbox ``sid`` (Sandbox.branch), each registered with
        the source's spec and TTL, and each continuing the source's sessions under their ids.
        Returns the entries and the first child's BranchInfo (what was carried)."""
        e = self.entry(owner, sid)
        self._take_quota(owner, n)
        try:
            await self._admit(self.sandbox_gate, owner, deadline_ms, n)
        except BaseException:
            self._give_quota(owner, n)
            raise
        try:
            kids = await asyncio.shield(e.sb.branch(n, processes=processes))
        except OSError as err:  # the host, not the request (as in fork)
            self._give_quota(owner, n)
            self.sandbox_gate.release(n)
            log.error("branching %s into %d failed on the host: %s", sid, n, err)
            raise ServiceError(f"the service's host could not branch {sid} into {n}: {err}", code="host_error",
                               retry_after=1) from None
        except BaseException:
            self._give_quota(owner, n)
            self.sandbox_gate.release(n)
            raise
        ttl = e.spec.limits.ttl_s or self.config.max_ttl_s
        made = []
        for k in kids:
            ke = self._register(k, owner, e.spec, ttl)
            carried = getattr(k, "branch_info", None)
            opened = list(getattr(e.sb, "sessions", []))
            for sess_id, s in e.sessions.items():
                if carried is not None and s in opened:
                    ke.sessions[sess_id] = carried.sessions[opened.index(s)]
            made.append(ke)
        return made, getattr(kids[0], "branch_info", None) if kids else None

    # -- sessions

    def open_session(self, e: Entry, *, cwd: str | None, env: dict[str, str], user: str | int | None) -> str:
        if len(e.sessions) >= MAX_SESSIONS:
            raise ServiceBusyError(f"sandbox {e.sb.id} has {MAX_SESSIONS} sessions open, the most",
                                   code="quota_exceeded")
        s = e.sb.session(cwd=cwd, env=env, user=user)
        sid = f"sess-{uuid.uuid4().hex[:12]}"
        e.sessions[sid] = s
        return sid

    def session(self, e: Entry, sid: str) -> Session:
        s = e.sessions.get(sid)
        if s is None:
            raise ServiceError(f"no session {sid!r} in sandbox {e.sb.id}", code="session_not_found")
        return s

    async def close_session(self, e: Entry, sid: str) -> None:
        s = self.session(e, sid)
        del e.sessions[sid]
        await s.close()

    # -- the journal: <state_dir>/sandboxes/<id> while live, <state_dir>/lost/<id> after a restart

    def _jdir(self, name: str) -> Path | None:
        if self.config.state_dir is None:
            return None
        d = self.config.state_dir / name
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return d

    def _journal_add(self, sid: str, owner: str) -> None:
        d = self._jdir("sandboxes")
        if d is not None:
            (d / sid).write_text(json.dumps({"owner": owner, "created": time.time()}))

    def _journal_remove(self, sid: str) -> None:
        d = self._jdir("sandboxes")
        if d is not None:
            (d / sid).unlink(missing_ok=True)

    def _journal_move(self, sid: str) -> None:
        d, lost = self._jdir("sandboxes"), self._jdir("lost")
        if d is not None and lost is not None:
            with contextlib.suppress(FileNotFoundError):
                (d / sid).replace(lost / sid)

    def _journal_restore(self) -> int:
        """Move the predecessor's live entries to lost/, and remember every lost id."""
        d, lost = self._jdir("sandboxes"), self._jdir("lost")
        if d is None or lost is None:
            return 0
        for p in d.iterdir():
            p.replace(lost / p.name)
        n = 0
        for p in sorted(lost.iterdir(), key=_mtime):
            try:
                rec = json.loads(p.read_text())
                if time.time() - p.stat().st_mtime > LOST_KEPT_S:
                    p.unlink()
                    continue
                owner = str(rec["owner"])
            except (OSError, ValueError, KeyError, TypeError):
                p.unlink(missing_ok=True)
                continue
            self._remember(p.name, Gone(owner, "sandbox_lost",
                                        f"sandbox {p.name} was lost when the service restarted"))
            n += 1
        return n


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _mem_total_mib() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 1 << 20


IMAGE_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def check_spec_text(spec: SandboxSpec) -> None:
    """What SandboxSpec lets through but a shared host must not take from a client: an
    image name that is not a name (an empty one matches every hash prefix), writable
    directories that climb out with ``..``, NULs and ``=`` where the guest splits on them."""
    if not spec.image or len(spec.image) > 200 or not set(spec.image) <= IMAGE_CHARS:
        raise ImageError(f"{spec.image!r} is not an image name or hash")
    for what, dirs in (("writable_dirs", spec.writable_dirs), ("root_dirs", spec.root_dirs)):
        for d in dirs:
            if not d.startswith("/") or "\x00" in d or ".." in d.split("/") or len(d) > 4096:
                raise SandboxPathError(f"{what}: {d!r} is not an absolute path without '..'")
    check_env(spec.env)


def check_env(env: dict[str, str] | None) -> None:
    for k, v in (env or {}).items():
        if not k or "=" in k or "\x00" in k or "\x00" in v:
            raise ConfigError(f"env: {k!r} is not a variable name (or its value holds a NUL)")


def check_argv(cmd: str | list[str]) -> None:
    parts = [cmd] if isinstance(cmd, str) else cmd
    if isinstance(cmd, list) and not cmd[0]:
        raise ConfigError("cmd: the program name is empty")
    if any("\x00" in a for a in parts):
        raise ConfigError("cmd: an argument holds a NUL byte")


def parse_labels(items: Iterable[str]) -> dict[str, str]:
    """``k=v`` filters (query ``label=k=v``, repeatable) -> a dict; 400 for one without ``=``."""
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ConfigError(f"a label filter is key=value, not {item!r}")
        out[k] = v
    return out
